"""A CPU server started with --redis-url registers in the broker's server registry, heartbeats
with its weight version and deregisters on shutdown."""

from __future__ import annotations

import asyncio
import concurrent.futures
import signal
import time

from broker.registry import PolicyRegistry, ServerRegistry
from inference.client import SGLangClient


async def wait_for(cond, within_s: float = 20.0, every: float = 0.1):
    deadline = time.monotonic() + within_s
    while True:
        value = await cond()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(every)


async def test_registers_heartbeats_and_deregisters(cpu_server_factory, tiny_model_dir, redis_url, aredis, keys):
    servers, policy = ServerRegistry(aredis, keys), PolicyRegistry(aredis, keys)
    await policy.publish(2, {"path": "/nowhere", "format": "hf"})
    fast = ["--set", "inference.heartbeat_s=0.5"]
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        behind_f = pool.submit(cpu_server_factory.start, tiny_model_dir, weight_version="0",
                               redis_url=redis_url, run_id=keys.run, extra_args=fast)
        current_f = pool.submit(cpu_server_factory.start, tiny_model_dir, weight_version="2",
                                redis_url=redis_url, run_id=keys.run, server_id="cpu-b", extra_args=fast,
                                drain_timeout_s=30)
        behind, current = behind_f.result(), current_f.result()

    a = await wait_for(lambda: servers.get(behind.server_id))
    b = await wait_for(lambda: servers.get("cpu-b"))
    assert (a.url, a.version, a.state) == (behind.url, 0, "starting")  # older than policy 2
    assert (b.url, b.version, b.state) == (current.url, 2, "ready")
    assert b.meta is not None and b.meta.kind == "swarl-cpu"
    assert (await servers.pin("p1", min_version=2)).id == "cpu-b"

    # heartbeats keep coming, and carry a new version promptly
    hb = b.heartbeat
    await wait_for(lambda: _newer(servers, "cpu-b", hb), within_s=10)
    async with SGLangClient(current.url, api_key=current.api_key) as c:
        await c.update_weight_version("3")
    await wait_for(lambda: _version_is(servers, "cpu-b", 3), within_s=5)
    assert (await servers.get("cpu-b")).state == "ready"  # the server never changes its own state

    # SIGTERM drains: no new pins while the pinned episode lives, then deregister and exit
    current.proc.send_signal(signal.SIGTERM)
    await wait_for(lambda: _state_is(servers, "cpu-b", "draining"), within_s=10)
    assert await servers.pin("p2", min_version=2) is None
    await asyncio.sleep(1.0)
    assert current.proc.poll() is None and await servers.get("cpu-b") is not None
    await servers.unpin("cpu-b", "p1")
    await wait_for(lambda: _gone(servers, "cpu-b"), within_s=15)
    await asyncio.to_thread(current.proc.wait, 15)
    assert await servers.get(behind.server_id) is not None


async def _state_is(servers, sid, state):
    s = await servers.get(sid)
    return s is not None and s.state == state


async def _newer(servers, sid, hb):
    s = await servers.get(sid)
    return s is not None and s.heartbeat > hb


async def _version_is(servers, sid, v):
    s = await servers.get(sid)
    return s is not None and s.version == v


async def _gone(servers, sid):
    return await servers.get(sid) is None
