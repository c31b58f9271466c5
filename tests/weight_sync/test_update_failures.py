"""Distributed updates that go wrong, over gloo against real CPU server processes and a real
Redis: a server that refuses a bucket, one killed mid-update, one slow to begin its session, and
a learner killed with its group and session left on the server. Each time the learner side
returns within a bound, the server ends up with the version (from disk, or after a restart),
and the next version goes over the group again."""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

import httpx
import pytest
import torch
from polling import wait_for
from ws_helpers import (
    API_KEY,
    all_at,
    expected_checksum,
    learner_tensors,
    server_checksum,
)

from broker.registry import ServerRegistry
from inference.client import SGLangClient
from weight_sync.protocols import ServerRefused
from weight_sync.update_group import UpdateGroup, resolve_backend, send_device, session

HERE = Path(__file__).parent


def test_auto_is_nccl_exactly_when_the_learner_has_cuda():
    assert resolve_backend("auto", cuda_available=True) == "nccl"
    assert resolve_backend("auto", cuda_available=False) == "gloo"
    assert resolve_backend("gloo", cuda_available=True) == "gloo"
    assert resolve_backend("nccl", cuda_available=False) == "nccl"
    assert resolve_backend("auto") == ("nccl" if torch.cuda.is_available() else "gloo")
    assert send_device("gloo") == "cpu" and send_device("nccl").startswith("cuda:")
    with pytest.raises(ValueError, match=r"weight_sync\.backend: expected auto, nccl or gloo, got 'mpi'"):
        resolve_backend("mpi")


async def _stats(url: str) -> dict:
    async with httpx.AsyncClient(timeout=10, headers={"Authorization": f"Bearer {API_KEY}"}) as c:
        return (await c.get(f"{url}/swarl/stats")).json()


def _distributed(ws_cfg, **kw) -> None:
    ws = ws_cfg.weight_sync
    ws.transport, ws.backend = "distributed", "gloo"
    for k, v in kw.items():
        setattr(ws, k, v)


async def test_a_refusal_while_rank_0_is_in_the_broadcast_ends_it_at_once(start_servers):
    (srv,) = start_servers(1)
    async with SGLangClient(srv.url, api_key=API_KEY, timeout_s=30, retries=0) as client:
        group = UpdateGroup(name="refused-bucket", members=[srv.server_id], clients=[client], tp_sizes=[1],
                            backend="gloo", timeout_s=20)
        async with session(client, srv.server_id, 10):
            await group.connect()
            # 64 MiB the server will not receive (it knows no int8): rank 0's send cannot finish
            t0 = time.monotonic()
            with pytest.raises(ServerRefused, match="unknown dtype 'int8'"):
                await group.send([("model.norm.weight", torch.zeros(64 << 20, dtype=torch.int8))], 1, 1 << 30)
            assert time.monotonic() - t0 < 5  # not group timeout_s (20 s): the answer was read
            assert group.broken and group.pg is None
            assert await group.close()  # the server drops its side; rank 0's thread ends with it
        assert (await _stats(srv.url))["weight_update_groups"] == []
        assert await client.get_weight_version() == "0"


async def test_a_server_that_lost_its_group_is_updated_from_disk(ws_cfg, aredis, keys, start_servers,
                                                                 publisher_factory, tiny_model_dir):
    _distributed(ws_cfg, group_timeout_s=60)
    (srv,) = start_servers(1)
    registry = ServerRegistry(aredis, keys)
    await wait_for(lambda: all_at(registry, 1, 0), 60, "server ready at 0")
    pub = publisher_factory(ws_cfg)
    t = {v: learner_tensors(tiny_model_dir, v) for v in (1, 2, 3)}
    await pub.publish(1, 1, lambda: iter(t[1]))
    await wait_for(lambda: all_at(registry, 1, 1), 30, "v1 over the group")
    # the server loses its group (an operator, a restart of its scheduler): it refuses the next bucket
    name = (await aredis.hget(keys.weight_groups, srv.server_id)).decode()
    async with SGLangClient(srv.url, api_key=API_KEY, retries=0) as c:
        assert (await c.destroy_weights_update_group(group_name=name))["success"] is True
    t0 = time.monotonic()
    await pub.publish(2, 2, lambda: iter(t[2]))
    await wait_for(lambda: all_at(registry, 1, 2), 30, "v2 from disk")
    assert time.monotonic() - t0 < 30  # the group timeout is 60 s
    assert await server_checksum(srv.url) == expected_checksum(t[2])
    await pub.publish(3, 3, lambda: iter(t[3]))  # the next version goes over a new group
    await wait_for(lambda: all_at(registry, 1, 3), 30, "v3 over a new group")
    assert await server_checksum(srv.url) == expected_checksum(t[3])
    history = pub.coordinator.history()
    assert [(r.version, r.transport, r.ok) for r in history] == [
        (1, "distributed", True), (2, "distributed", False), (2, "disk", True), (3, "distributed", True)]
    assert f"no weight update group {name!r}" in history[1].error and history[1].duration_s < 10
    stats = await _stats(srv.url)
    assert stats["weight_update_groups"] == [(await aredis.hget(keys.weight_groups, srv.server_id)).decode()]
    assert stats["weight_update_session"] is False


@pytest.mark.slow
async def test_a_server_killed_mid_update_is_failed_in_bounded_time_and_recovers(
        ws_cfg, aredis, keys, cpu_server_factory, publisher_factory, tiny_model_dir, redis_url):
    _distributed(ws_cfg, bucket_mb=0.05, group_timeout_s=60)
    start = dict(redis_url=redis_url, run_id="test", api_key=API_KEY, server_id="victim")
    srv = cpu_server_factory.start(tiny_model_dir, **start)
    registry = ServerRegistry(aredis, keys)
    await wait_for(lambda: all_at(registry, 1, 0), 60, "server ready at 0")
    pub = publisher_factory(ws_cfg)
    t1, t2 = learner_tensors(tiny_model_dir, 1), learner_tensors(tiny_model_dir, 2)
    publishing = asyncio.create_task(pub.publish(1, 1, lambda: iter(t1)))
    await wait_for(lambda: "weight_group_joined" in srv.log(), 30, "the server joined its group")
    srv.kill()  # SIGKILL while the buckets go out
    t0 = time.monotonic()
    await wait_for(lambda: any(not r.ok for r in pub.coordinator.history()), 30, "the update failed")
    assert time.monotonic() - t0 < 30  # the group timeout is 60 s
    await asyncio.wait_for(publishing, 60)  # the learner's publish returns
    failed = pub.coordinator.history()[0]
    assert (failed.version, failed.transport, failed.ok) == (1, "distributed", False)

    # the server comes back (same id): it registers starting and loads the version from disk
    back = cpu_server_factory.start(tiny_model_dir, **start)
    await wait_for(lambda: all_at(registry, 1, 1), 60, "the restarted server at v1")
    assert await server_checksum(back.url) == expected_checksum(t1)
    await pub.publish(2, 2, lambda: iter(t2))  # the learner goes on: v2 over a new group
    await wait_for(lambda: all_at(registry, 1, 2), 30, "v2")
    assert await server_checksum(back.url) == expected_checksum(t2)
    assert [(r.transport, r.ok) for r in pub.coordinator.history()][-2:] == [("disk", True), ("distributed", True)]


@pytest.mark.slow
async def test_a_server_slow_to_begin_is_updated_from_disk(ws_cfg, aredis, keys, start_servers,
                                                           publisher_factory, tiny_model_dir):
    _distributed(ws_cfg, begin_timeout_s=2)
    (srv,) = start_servers(1)
    registry = ServerRegistry(aredis, keys)
    await wait_for(lambda: all_at(registry, 1, 0), 60, "server ready at 0")
    pub = publisher_factory(ws_cfg)
    t1, t2 = learner_tensors(tiny_model_dir, 1), learner_tensors(tiny_model_dir, 2)
    async with SGLangClient(srv.url, api_key=API_KEY, timeout_s=60, retries=0) as client:
        # a request in flight (not pinned: the drain does not wait for it) holds the update lock
        long = asyncio.create_task(client.generate([1, 2, 3], {"max_new_tokens": 100_000, "ignore_eos": True}))
        await wait_for(lambda: _stats(srv.url), 10)
        await wait_for(lambda: _running(srv.url), 20, "the long request running")
        t0 = time.monotonic()
        publishing = asyncio.create_task(pub.publish(1, 1, lambda: iter(t1)))
        await wait_for(lambda: any(not r.ok for r in pub.coordinator.history()), 20, "begin given up")
        assert time.monotonic() - t0 < 15  # begin_timeout_s 2; the update timeout is 60 s
        failed = pub.coordinator.history()[0]
        assert failed.transport == "distributed" and "begin_weight_update: no answer within 2s" in failed.error
        await client.abort_request(abort_all=True)  # the request ends: the server's lock frees
        assert (await long).finish_reason["type"] == "abort"
        await wait_for(lambda: all_at(registry, 1, 1), 30, "v1 from disk")
        await asyncio.wait_for(publishing, 60)
    assert await server_checksum(srv.url) == expected_checksum(t1)
    # the late begin left a session open: the next update ends it and goes over the group
    await pub.publish(2, 2, lambda: iter(t2))
    await wait_for(lambda: all_at(registry, 1, 2), 30, "v2 over the group")
    assert await server_checksum(srv.url) == expected_checksum(t2)
    assert [(r.version, r.transport, r.ok) for r in pub.coordinator.history()] == [
        (1, "distributed", False), (1, "disk", True), (2, "distributed", True)]
    assert (await _stats(srv.url))["weight_update_session"] is False


async def _running(url: str) -> bool:
    return (await _stats(url))["num_running"] > 0


@pytest.mark.slow
async def test_a_group_left_by_a_killed_learner_does_not_stop_the_next(ws_cfg, aredis, keys, start_servers,
                                                                       publisher_factory, tiny_model_dir,
                                                                       redis_url):
    _distributed(ws_cfg)
    (srv,) = start_servers(1)
    registry = ServerRegistry(aredis, keys)
    await wait_for(lambda: all_at(registry, 1, 0), 60, "server ready at 0")
    dead = await asyncio.create_subprocess_exec(
        sys.executable, str(HERE / "killed_learner.py"), srv.url, API_KEY, srv.server_id, redis_url, "test",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, cwd=HERE.parents[1])
    out, err = (b.decode() for b in await asyncio.wait_for(dead.communicate(), 60))
    assert dead.returncode == -9 and "joined swarl-test-" in out, err[-2000:]
    stale = out.split("joined ", 1)[1].strip()
    left = await _stats(srv.url)
    assert left["weight_update_groups"] == [stale] and left["weight_update_session"] is True

    pub = publisher_factory(ws_cfg)  # the next learner
    t1 = learner_tensors(tiny_model_dir, 1)
    await pub.publish(1, 1, lambda: iter(t1))
    await wait_for(lambda: all_at(registry, 1, 1), 30, "v1 over a new group")
    assert [(r.transport, r.ok) for r in pub.coordinator.history()] == [("distributed", True)]
    assert await server_checksum(srv.url) == expected_checksum(t1)
    now = await _stats(srv.url)
    name = (await aredis.hget(keys.weight_groups, srv.server_id)).decode()
    assert now["weight_update_groups"] == [name] and name != stale and now["weight_update_session"] is False
    await pub.close()  # a clean stop destroys its group and its record
    assert (await _stats(srv.url))["weight_update_groups"] == []
    assert await aredis.hget(keys.weight_groups, srv.server_id) is None
