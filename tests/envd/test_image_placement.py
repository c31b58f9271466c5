"""Image-affinity placement on a real Redis: the pool's reserve script reads which node holds
which image (envd's ImageIndex writes it) and leases there while the node has room. No Docker:
the registry and pull tests are tests/envd/test_image_registry.py."""

from __future__ import annotations

import time

import pytest

from broker.config import RedisConfig
from broker.keys import Keys
from envd.config import PoolConfig
from envd.image_index import ImageIndex
from envd.pool_state import PoolState

KEYS = Keys("swarl", "test")
NODES = {"http://node-a:5000": "node-a", "http://node-b:5000": "node-b", "http://node-c:5000": "node-c"}
IMG = "registry.local/swe/task-1:latest"


async def _state(redis_url: str, **kw: object) -> PoolState:
    pcfg = PoolConfig(**{"max_concurrent": 100, "max_per_node": 4, **kw})
    state = await PoolState.open(pcfg, RedisConfig(url=redis_url), KEYS)
    for url, nid in NODES.items():
        await state.add_node(url)
        await state.set_health(url, True, node_id=nid)
    return state


async def _reserve(state: PoolState, n: int, image: str = IMG, tag: str = "l") -> list[str]:
    got = []
    for i in range(n):
        status, node = await state.reserve(f"{tag}-{i}", image, "task-1", "test")
        assert status == "ok", node
        got.append(node)
    return got


async def test_health_records_the_node_id(redis_url: str) -> None:
    state = await _state(redis_url)
    try:
        nodes = await state.nodes()
        assert {u: n["node_id"] for u, n in nodes.items()} == NODES
        await state.set_health("http://node-a:5000", False, "down")  # no id: the known one stays
        assert (await state.nodes())["http://node-a:5000"]["node_id"] == "node-a"
    finally:
        await state.close()


async def test_leases_go_to_the_node_holding_the_image_while_it_has_room(redis_url: str, aredis) -> None:
    state = await _state(redis_url)
    try:
        await ImageIndex(aredis, KEYS, "node-b").arrived(IMG)
        got = await _reserve(state, 6)
        assert got[:4] == ["http://node-b:5000"] * 4  # max_per_node 4
        # node-b full: the rest go to the least-loaded nodes, which pull (and are marked so)
        assert set(got[4:]) <= {"http://node-a:5000", "http://node-c:5000"}
        marks = {k.decode(): v.decode() for k, v in (await aredis.hgetall(KEYS.image_nodes(IMG))).items()}
        assert marks["node-b"] == "ready"
        assert all(marks[NODES[u]].startswith("pulling:") for u in got[4:])
        # another image goes to the least-loaded node, not to node-b
        status, node = await state.reserve("other", "registry.local/swe/task-2:latest", "task-2", "t")
        assert status == "ok" and node != "http://node-b:5000"
    finally:
        await state.close()


async def test_a_burst_for_an_uncached_image_joins_one_pull(redis_url: str, aredis) -> None:
    state = await _state(redis_url, max_per_node=10)
    try:
        got = await _reserve(state, 10)
        assert len(set(got)) == 1, got  # one node, so one pull
        marks = await aredis.hgetall(KEYS.image_nodes(IMG))
        assert len(marks) == 1 and next(iter(marks.values())).startswith(b"pulling:")
        # the pull failed there: the mark goes, and the next lease is placed by load alone
        assert await state.unmark_pulling(got[0], IMG)
        assert await aredis.hgetall(KEYS.image_nodes(IMG)) == {}
        status, node = await state.reserve("after", IMG, "task-1", "t")
        assert status == "ok" and node != got[0]
    finally:
        await state.close()


async def test_a_stale_pulling_mark_attracts_nothing(redis_url: str, aredis) -> None:
    state = await _state(redis_url, pulling_stale_s=60)
    try:
        await aredis.hset(KEYS.image_nodes(IMG), "node-a", f"pulling:{time.time() - 120:.3f}")
        await ImageIndex(aredis, KEYS, "node-a").arrived("x/other:1")
        assert await _reserve(state, 1, image="x/other:1", tag="warm") == ["http://node-a:5000"]
        status, node = await state.reserve("l", IMG, "task-1", "t")
        assert status == "ok" and node != "http://node-a:5000"  # least-loaded, not stale affinity
    finally:
        await state.close()


@pytest.mark.parametrize("affinity", [True, False])
async def test_affinity_off_places_by_load_alone(redis_url: str, aredis, affinity: bool) -> None:
    state = await _state(redis_url, image_affinity=affinity)
    try:
        await ImageIndex(aredis, KEYS, "node-c").arrived(IMG)
        got = await _reserve(state, 3)
        if affinity:
            assert got == ["http://node-c:5000"] * 3
        else:
            assert len(set(got)) == 3  # spread by load
            assert len(await aredis.hgetall(KEYS.image_nodes(IMG))) == 1  # no pulling marks
    finally:
        await state.close()


async def test_image_index_record_and_sync(aredis) -> None:
    index = ImageIndex(aredis, KEYS, "node-a")
    await index.arrived("a:1", when=100.0)
    await index.used("b:1", when=200.0)
    assert await index.last_used() == {"a:1": 100.0, "b:1": 200.0}
    # restarted with a:1 removed by hand and c:1 loaded by hand
    await index.sync({"b:1", "c:1"})
    assert await index.last_used() == {"b:1": 200.0}  # c:1 is not envd's to evict
    assert await aredis.hget(KEYS.image_nodes("c:1"), "node-a") == b"ready"
    assert await aredis.hget(KEYS.image_nodes("a:1"), "node-a") is None
    await aredis.hset(KEYS.image_nodes("d:1"), "node-a", "pulling:1")
    await index.pull_failed("d:1")
    await index.pull_failed("b:1")  # ready stays
    assert await aredis.hget(KEYS.image_nodes("d:1"), "node-a") is None
    assert await aredis.hget(KEYS.image_nodes("b:1"), "node-a") == b"ready"
    await index.left("b:1")
    assert await index.last_used() == {}
    assert await aredis.hgetall(KEYS.image_nodes("b:1")) == {}


@pytest.mark.parametrize(("image", "registry", "ref"), [
    ("swarl/task.calc-1:latest", "10.0.0.5:5000", "10.0.0.5:5000/swarl/task.calc-1:latest"),
    ("docker.io/swebench/sweb.eval.x86_64.a_1776_b-1:latest", "reg:5000/ns",
     "reg:5000/ns/swebench/sweb.eval.x86_64.a_1776_b-1:latest"),
    ("ghcr.io/org/img:1", "reg:5000", "ghcr.io/org/img:1"),  # names its own registry
    ("localhost:5000/img:1", None, "localhost:5000/img:1"),
    ("docker.io/swebench/x:latest", None, "docker.io/swebench/x:latest"),  # Hub (or dockerd's mirror)
    ("swarl/task.calc-1:latest", None, None),  # bare name, no registry: nothing to pull from
])
def test_pull_reference(image: str, registry: str | None, ref: str | None) -> None:
    from envd.image_cache import pull_reference

    assert pull_reference(image, registry) == ref


def test_prefetch_plan_counts_holders_first_then_fills_the_emptiest_nodes() -> None:
    from swarl.prefetch import plan

    holders = {"a": {"i1"}, "b": set(), "c": {"i2", "x"}}
    assert plan(["i1", "i2", "i3"], holders, 1) == [("i3", "b")]
    got = plan(["i1", "i2", "i3", "i4"], holders, 2)
    per_image = {i: sum(1 for im, _ in got if im == i) for i in ("i1", "i2", "i3", "i4")}
    assert per_image == {"i1": 1, "i2": 1, "i3": 2, "i4": 2}
    load = {n: len(holders[n] & {"i1", "i2"}) + sum(1 for _, m in got if m == n) for n in holders}
    assert max(load.values()) - min(load.values()) <= 1  # spread evenly
    assert len(plan(["i1"], holders, 9)) == 2  # at most every node
