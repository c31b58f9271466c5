"""Servers started with --redis-url (swarl's CPU server, the scripted policy server) register in
the broker's server registry with their typed meta, heartbeat with their weight version and
deregister on shutdown."""

from __future__ import annotations

import asyncio
import concurrent.futures
import signal

from fixtures_inference import entry, wait_for

from broker.registry import PolicyRegistry, ServerMeta, ServerRegistry
from inference.client import SGLangClient


async def test_registers_heartbeats_and_deregisters(cpu_server_factory, tiny_model_dir, redis_url, aredis, keys):
    servers, policy = ServerRegistry(aredis, keys), PolicyRegistry(aredis, keys)
    await policy.publish(2, {"path": "/nowhere", "format": "hf"})
    fast = ["--set", "inference.heartbeat_s=0.5"]
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        behind_f = pool.submit(cpu_server_factory.start, tiny_model_dir, weight_version="0",
                               redis_url=redis_url, run_id=keys.run, extra_args=fast)
        current_f = pool.submit(cpu_server_factory.start, tiny_model_dir, weight_version="2",
                                redis_url=redis_url, run_id=keys.run, server_id="cpu-b", extra_args=fast,
                                drain_timeout_s=30, tp_size=2)
        behind, current = behind_f.result(), current_f.result()

    a = await wait_for(lambda: servers.get(behind.server_id))
    b = await wait_for(lambda: servers.get("cpu-b"))
    assert (a.url, a.version, a.state) == (behind.url, 0, "starting")  # older than policy 2
    assert (b.url, b.version, b.state) == (current.url, 2, "ready")
    assert b.meta == ServerMeta(kind="swarl-cpu", model=str(tiny_model_dir), tp_size=2)
    assert a.meta is not None and a.meta.tp_size == 1
    assert (await servers.pin("p1", min_version=2)).id == "cpu-b"

    # heartbeats keep coming, and carry a new version promptly
    hb = b.heartbeat
    await wait_for(entry(servers, "cpu-b", lambda s: s.heartbeat > hb), within_s=10)
    async with SGLangClient(current.url, api_key=current.api_key) as c:
        await c.update_weight_version("3")
    await wait_for(entry(servers, "cpu-b", lambda s: s.version == 3), within_s=5)
    assert (await servers.get("cpu-b")).state == "ready"  # the server never changes its own state

    # SIGTERM drains: no new pins while the pinned episode lives, then deregister and exit
    current.proc.send_signal(signal.SIGTERM)
    await wait_for(entry(servers, "cpu-b", lambda s: s.state == "draining"), within_s=10)
    assert await servers.pin("p2", min_version=2) is None
    await asyncio.sleep(1.0)
    assert current.proc.poll() is None and await servers.get("cpu-b") is not None
    await servers.unpin("cpu-b", "p1")
    await wait_for(_gone(servers, "cpu-b"), within_s=15)
    await asyncio.to_thread(current.proc.wait, 15)
    assert await servers.get(behind.server_id) is not None


async def test_scripted_server_registers_ready_at_any_version_and_leaves(cpu_server_factory, tiny_model_dir,
                                                                         redis_url, aredis, keys):
    servers, policy = ServerRegistry(aredis, keys), PolicyRegistry(aredis, keys)
    await policy.publish(5, {"path": "/nowhere", "format": "hf"})
    row = {"instance_id": "reg__t-1", "problem_statement": "[reg] nothing", "swarl_fix_command": "true"}
    h = cpu_server_factory.start_scripted(tiny_model_dir, [row], weight_version="1", redis_url=redis_url,
                                          run_id=keys.run, server_id="scripted-a",
                                          extra_args=["--set", "inference.heartbeat_s=0.5"])
    s = await servers.get("scripted-a")  # registered before /health answered
    assert (s.url, s.state, s.version) == (h.url, "ready", 1)  # a script does not depend on weights
    assert s.meta == ServerMeta(kind="scripted", model=str(tiny_model_dir), tp_size=1)
    async with SGLangClient(h.url, api_key=h.api_key) as c:
        await c.update_weight_version("7")
    await wait_for(entry(servers, "scripted-a", lambda s: s.version == 7), within_s=5)
    h.proc.send_signal(signal.SIGTERM)
    await asyncio.to_thread(h.proc.wait, 15)
    assert await servers.get("scripted-a") is None



def _gone(servers, sid):
    async def cond():
        return await servers.get(sid) is None

    return cond
