"""inference.membership against a real redis-server: the ready/starting rule, heartbeats that
carry the version (at once on `wake`), leaving, and Redis going away and coming back."""

from __future__ import annotations

import asyncio
import time

import pytest
import redis.asyncio as aioredis
from fixtures_inference import entry, wait_for

from broker.config import RedisConfig
from broker.registry import PolicyRegistry, ServerMeta, ServerRegistry
from common.services import free_port
from inference.membership import Membership, version_int

META = ServerMeta(kind="swarl-cpu", model="/m", tp_size=2)


def test_version_int():
    assert [version_int(v) for v in ("3", " 12 ", "0", "default", "", "1.5")] == [3, 12, 0, None, None, None]


async def test_ready_only_at_the_newest_version_and_leaves_on_exit(redis_url, aredis, keys):
    servers, policy = ServerRegistry(aredis, keys), PolicyRegistry(aredis, keys)
    await policy.publish(3, {"path": "/nowhere"})
    versions = {"behind": "2", "current": "3", "unversioned": "default"}
    async with Membership(redis_url, keys, "behind", "http://b", META, lambda: versions["behind"]), \
            Membership(redis_url, keys, "current", "http://c", META, lambda: versions["current"]), \
            Membership(redis_url, keys, "unversioned", "http://u", META, lambda: versions["unversioned"]), \
            Membership(redis_url, keys, "script", "http://s", ServerMeta(kind="scripted"), lambda: "0",
                       any_version_ready=True):
        got = {s.id: s for s in await servers.list()}  # registered before the block runs
        assert {sid: (s.state, s.version) for sid, s in got.items()} == {
            "behind": ("starting", 2), "current": ("ready", 3), "unversioned": ("starting", None),
            "script": ("ready", 0)}
        assert got["current"].meta == META and got["current"].url == "http://c"
    assert await servers.list() == []


async def test_heartbeats_carry_the_version_and_wake_beats_at_once(redis_url, aredis, keys):
    servers = ServerRegistry(aredis, keys)
    wake = asyncio.Event()
    version = {"v": "1"}

    async def read() -> str:  # an awaitable source, as a server's /model_info version
        return version["v"]

    async with Membership(redis_url, keys, "s1", "http://s1", META, read, heartbeat_s=30.0, wake=wake):
        assert (await servers.get("s1")).version == 1
        version["v"] = "4"
        wake.set()
        await wait_for(entry(servers, "s1", lambda s: s.version == 4), within_s=3)  # not 30 s later
        version["v"] = "5"
        await asyncio.sleep(0.5)
        assert (await servers.get("s1")).version == 4  # no wake: the next beat is 30 s away


async def test_redis_away_at_start_then_back_then_gone_again(redis_factory, keys, tmp_path):
    port = free_port()
    url = f"redis://127.0.0.1:{port}/0"
    fast = RedisConfig(url=url, outage_s=0.1, connect_timeout_s=0.5, socket_timeout_s=1.0)
    member = Membership(url, keys, "s1", "http://s1", META, lambda: "0", heartbeat_s=0.2, redis_cfg=fast)
    t0 = time.monotonic()
    async with member:  # Redis not there: entering does not fail, and is bounded
        assert time.monotonic() - t0 < 5 and not member.registered
        assert await member.pin_count() == 0
        await wait_for(lambda: member.failures >= 3, within_s=5)  # beats go on, failing
        srv = redis_factory(appendonly=True, dir=tmp_path / "r", port=port)
        r = aioredis.Redis.from_url(url)
        try:
            servers = ServerRegistry(r, keys)
            got = await wait_for(lambda: servers.get("s1"), within_s=10)
            assert got.state == "ready" and member.registered  # registered at a later beat
            assert member.failures == 0

            srv.stop()  # a blip: beats fail (logged), the server goes on
            await asyncio.sleep(1.0)
            srv2 = redis_factory(appendonly=True, dir=tmp_path / "r", port=port)
            await r.aclose()
            r = aioredis.Redis.from_url(srv2.url)
            servers = ServerRegistry(r, keys)
            first = (await servers.get("s1")).heartbeat
            await wait_for(entry(servers, "s1", lambda s: s.heartbeat > first), within_s=10)
            await member.set_state("draining")
            assert (await servers.get("s1")).state == "draining"
        finally:
            await r.aclose()
    # left: the entry is gone
    r = aioredis.Redis.from_url(url)
    try:
        assert await ServerRegistry(r, keys).get("s1") is None
    finally:
        await r.aclose()


async def test_a_membership_that_is_not_running_says_so(redis_url, keys):
    m = Membership(redis_url, keys, "x", "http://x", META, lambda: "0")
    with pytest.raises(RuntimeError, match="not running"):
        _ = m.servers


async def test_a_lost_entry_is_registered_again(redis_url, aredis, keys):
    """Redis restarted empty (no append-only file): the next beat finds no entry and registers
    the server again, whole (url, meta, state), instead of writing a half entry."""
    servers = ServerRegistry(aredis, keys)
    wake = asyncio.Event()
    async with Membership(redis_url, keys, "s1", "http://s1", META, lambda: "0", heartbeat_s=30.0, wake=wake):
        await aredis.flushall()
        wake.set()
        await wait_for(entry(servers, "s1", lambda s: s.url == "http://s1" and s.meta == META
                             and s.state == "ready"), within_s=5)
