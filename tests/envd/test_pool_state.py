"""The pool's Redis state on a real Redis: placement under the caps (overall and per node) while
two pool processes race, the per-node load kept in step with the leases, node eligibility and
draining. No Docker: the Lua scripts are the whole story here."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis

import envd.pool_state
from broker.config import RedisConfig
from broker.keys import Keys
from envd.config import PoolConfig
from envd.pool_state import PoolState

REPO = Path(__file__).resolve().parents[2]
NODES = ["http://node-a:5000", "http://node-b:5000", "http://node-c:5000"]
CAPS = {"max_concurrent": 10, "max_per_node": 4}

# One pool process: wait for the start signal, then reserve (and, with churn, release) as fast
# as it can; print what it got.
RACER = """
import asyncio, json, random, sys, time
from broker.config import RedisConfig
from broker.keys import Keys
from envd.config import PoolConfig
from envd.pool_state import PoolState

url, name, attempts, churn = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4] == "1"

async def main():
    state = await PoolState.open(PoolConfig(max_concurrent=10, max_per_node=4), RedisConfig(url=url),
                                 Keys("swarl", "test"))
    await state.redis.incr("race:ready")
    while not await state.redis.exists("race:go"):
        await asyncio.sleep(0.001)
    got, held = [], []
    for i in range(attempts):
        status, node = await state.reserve(f"{name}-{i}", "img", f"task-{i}", name)
        if status == "ok":
            got.append(node)
            held.append(f"{name}-{i}")
        if churn and held and random.random() < 0.5:
            await state.release(held.pop(random.randrange(len(held))))
    await state.close()
    print(json.dumps({"got": got, "held": held}))

asyncio.run(main())
"""


async def _state(redis_url: str) -> PoolState:
    return await PoolState.open(PoolConfig(**CAPS), RedisConfig(url=redis_url), Keys("swarl", "test"))


async def _healthy_nodes(state: PoolState, urls: list[str]) -> None:
    for url in urls:
        await state.add_node(url)
        await state.set_health(url, True)


def _race(redis_url: str, attempts: int, churn: bool) -> list[dict]:
    r = redis.Redis.from_url(redis_url)
    keys = Keys("swarl", "test")
    r.delete("race:ready", "race:go")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    procs = [subprocess.Popen([sys.executable, "-c", RACER, redis_url, name, str(attempts), "1" if churn else "0"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=REPO)
             for name in ("pool-1", "pool-2")]
    deadline = time.monotonic() + 60
    while int(r.get("race:ready") or 0) < len(procs):  # both connected and waiting
        assert time.monotonic() < deadline and all(p.poll() is None for p in procs)
        time.sleep(0.01)
    r.set("race:go", 1)
    peaks = {"total": 0, "node": 0}
    while any(p.poll() is None for p in procs):
        with r.pipeline(transaction=True) as pipe:  # one consistent snapshot
            total, load = pipe.zcard(keys.pool_leases).hgetall(keys.pool_load).execute()
        peaks["total"] = max(peaks["total"], total)
        peaks["node"] = max([peaks["node"], *(int(v) for v in load.values())])
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=60)
        assert p.returncode == 0, err
        outs.append(json.loads(out))
    assert peaks["total"] <= CAPS["max_concurrent"] and peaks["node"] <= CAPS["max_per_node"], peaks
    r.close()
    return outs


def _recount(redis_url: str) -> dict[str, int]:
    """Leases per node, counted from the lease hashes themselves."""
    r = redis.Redis.from_url(redis_url)
    keys = Keys("swarl", "test")
    counts: dict[str, int] = {}
    for lease_id in r.zrange(keys.pool_leases, 0, -1):
        node = r.hget(keys.pool_lease(lease_id.decode()), "node_url").decode()
        counts[node] = counts.get(node, 0) + 1
    r.close()
    return counts


async def test_two_pools_racing_never_exceed_the_caps(redis_url: str) -> None:
    state = await _state(redis_url)
    await _healthy_nodes(state, NODES)
    outs = _race(redis_url, attempts=40, churn=False)
    got = [n for o in outs for n in o["got"]]
    assert len(got) == CAPS["max_concurrent"]  # the overall cap binds: 10 < 3 nodes x 4
    assert all(got.count(n) <= CAPS["max_per_node"] for n in NODES)
    assert max(got.count(n) for n in NODES) - min(got.count(n) for n in NODES) <= 1  # least-loaded first
    assert await state.load() == _recount(redis_url) == {n: got.count(n) for n in NODES}
    assert await state.reserve("one-more", "img", "x", "me") == ("full", "all 10 leases in use")
    await state.close()


async def test_per_node_cap_binds_and_churn_keeps_the_load_in_step(redis_url: str) -> None:
    state = await _state(redis_url)
    await _healthy_nodes(state, NODES[:2])  # 2 nodes x 4 = 8 < the overall cap of 10
    outs = _race(redis_url, attempts=40, churn=False)
    assert len([n for o in outs for n in o["got"]]) == 8
    assert await state.reserve("one-more", "img", "x", "me") == ("full", "every healthy node has 4 leases")
    for lease_id in [lid for o in outs for lid in o["held"]]:
        assert await state.release(lease_id) is not None
    assert await state.load() == {} and await state.count() == 0
    outs = _race(redis_url, attempts=200, churn=True)
    assert all(o["got"] for o in outs)  # both processes placed leases while the other did
    held = sorted(lid for o in outs for lid in o["held"])
    assert sorted(await state.lease_ids()) == held
    assert await state.load() == _recount(redis_url)
    assert all(v <= CAPS["max_per_node"] for v in (await state.load()).values())
    await state.close()


async def test_only_healthy_fresh_active_nodes_get_leases_and_a_drained_node_leaves(redis_url: str) -> None:
    state = await _state(redis_url)
    assert (await state.reserve("l0", "img", "x", "me"))[0] == "no_nodes"
    await _healthy_nodes(state, NODES)
    await state.set_health(NODES[1], False, "down")
    await state.drain_node(NODES[2])
    nodes = {(await state.reserve(f"l{i}", "img", "x", "me"))[1] for i in range(1, 4)}
    assert nodes == {NODES[0]}
    stale = PoolState(state.redis, state.keys, PoolConfig(**CAPS, health_stale_s=0.0))
    await asyncio.sleep(0.01)
    assert (await stale.reserve("l9", "img", "x", "me"))[0] == "no_nodes"  # last check too old
    await state.add_node(NODES[2])  # active again
    assert (await state.reserve("l4", "img", "x", "me")) == ("ok", NODES[2])
    await state.drain_node(NODES[2])
    assert not await state.forget_drained(NODES[2])  # a lease is still on it
    assert not await state.forget_drained(NODES[0])  # not draining
    fields = await state.release("l4")
    assert fields is not None and fields["node_url"] == NODES[2] and fields["state"] == "creating"
    assert await state.release("l4") is None  # released once only
    assert await state.forget_drained(NODES[2])
    assert set(await state.nodes()) == set(NODES[:2])
    assert await state.load() == {NODES[0]: 3}
    await state.close()


@pytest.mark.parametrize("script", ["_RESERVE", "_RELEASE", "_HEALTH", "_SET_STATE", "_FORGET_DRAINED", "_ACTIVATE"])
def test_scripts_take_every_key_through_keys(script: str) -> None:
    """Redis Cluster routes a script by its KEYS: every key a script touches is a KEYS entry,
    none is built inside Lua."""
    calls = re.findall(r"redis\.call\('(\w+)', ([^,)]+)", getattr(envd.pool_state, script))
    assert calls
    for command, key in calls:
        assert re.fullmatch(r"KEYS\[\d\]", key), f"{script}: {command} {key}"
