"""Rolling updates against real CPU inference servers (subprocesses) and a real Redis.

Three scenarios keep the server start-ups few: (1) two servers under load, disk then gloo;
(2) a server joining mid-run, then corrupt and missing checkpoints; (3) retention and both
drain-timeout choices.
"""

from __future__ import annotations

import asyncio

from polling import wait_for
from ws_helpers import (
    API_KEY,
    all_at,
    expected_checksum,
    learner_tensors,
    server_checksum,
)

from broker.registry import PolicyRegistry, ServerRegistry
from inference.client import SGLangClient
from weight_sync import checkpoints


async def _episodes(registry: ServerRegistry, client_for, n_workers: int, stop: asyncio.Event,
                    log: list[tuple[int, list[str]]]) -> None:
    """Pin holders: pin a server, generate a few turns, check every turn's weight_version."""

    async def worker(w: int) -> None:
        k = 0
        while not stop.is_set():
            pin_id = f"ep-{w}-{k}"
            k += 1
            s = await registry.pin(pin_id)
            if s is None:
                await asyncio.sleep(0.05)
                continue
            seen = []
            try:
                for _ in range(3):
                    g = await client_for(s.url).generate(
                        [1, 2, 3, 4], {"max_new_tokens": 2, "temperature": 0})
                    seen.append(str(g.weight_version))
                    await asyncio.sleep(0.05)
            finally:
                await registry.unpin(s.id, pin_id)
            log.append((s.version, seen))

    await asyncio.gather(*[worker(w) for w in range(n_workers)])


async def _sample_ready(registry: ServerRegistry, stop: asyncio.Event, counts: list[int]) -> None:
    while not stop.is_set():
        counts.append(sum(s.state == "ready" for s in await registry.list(alive_only=True)))
        await asyncio.sleep(0.02)


async def test_rolling_updates_disk_then_gloo_under_load(ws_cfg, aredis, keys, start_servers,
                                                         publisher_factory, tiny_model_dir):
    srvs = start_servers(2)
    registry = ServerRegistry(aredis, keys)
    await wait_for(lambda: all_at(registry, 2, 0), 60, "2 servers ready at 0")
    clients: dict[str, SGLangClient] = {}

    def client_for(url: str) -> SGLangClient:
        return clients.setdefault(url, SGLangClient(url, api_key=API_KEY, timeout_s=30))

    t1, t2 = learner_tensors(tiny_model_dir, 1), learner_tensors(tiny_model_dir, 2)
    stop = asyncio.Event()
    episodes: list[tuple[int, list[str]]] = []
    ready_counts: list[int] = []
    bg = [asyncio.create_task(_episodes(registry, client_for, 4, stop, episodes)),
          asyncio.create_task(_sample_ready(registry, stop, ready_counts))]
    checks: dict[int, set[str]] = {}
    history = []
    try:
        await asyncio.sleep(0.3)
        pub = publisher_factory(ws_cfg)  # disk
        for v, t in ((1, t1), (2, t2)):
            await pub.publish(v, v, lambda t=t: iter(t))
            assert await all_at(registry, 2, v), pub.coordinator.history()
            checks[v] = {await server_checksum(s.url) for s in srvs}
        history += pub.coordinator.history()
        await pub.close()
        ws_cfg.weight_sync.transport = "distributed"
        pub = publisher_factory(ws_cfg)
        for v, t in ((3, t1), (4, t2)):  # the same tensors again, now over gloo
            await pub.publish(v, v, lambda t=t: iter(t))
            assert await all_at(registry, 2, v), pub.coordinator.history()
            checks[v] = {await server_checksum(s.url) for s in srvs}
        history += pub.coordinator.history()
        await asyncio.sleep(0.2)
    finally:
        stop.set()
        await asyncio.gather(*bg)
        for c in clients.values():
            await c.aclose()
    # disk and gloo deliver identical weights, equal to the learner's tensors
    assert checks[1] == checks[3] == {expected_checksum(t1)}
    assert checks[2] == checks[4] == {expected_checksum(t2)}
    assert [(r.version, r.transport, r.ok) for r in history] == [
        (1, "disk", True), (1, "disk", True), (2, "disk", True), (2, "disk", True),
        (3, "distributed", True), (3, "distributed", True),
        (4, "distributed", True), (4, "distributed", True)]
    # no pinned episode observed a version change, and one server was always ready
    assert len(episodes) >= 8, episodes
    changed = [(v, seen) for v, seen in episodes if set(seen) != {str(v)}]
    assert not changed, f"pinned episodes saw a version change: {changed[:5]}"
    assert {v for v, _ in episodes} >= {0, 4}
    assert ready_counts and min(ready_counts) >= 1, "a moment with no ready server"
    assert any(r.drain_s > 0.05 for r in history)  # updates waited for pinned episodes
    assert all(r.pins_at_update == 0 for r in history)


async def test_late_joiner_and_refused_checkpoints(ws_cfg, aredis, keys, start_servers,
                                                   publisher_factory, tiny_model_dir):
    ws_cfg.weight_sync.transport = "distributed"
    start_servers(1)
    registry = ServerRegistry(aredis, keys)
    policy = PolicyRegistry(aredis, keys)
    await wait_for(lambda: all_at(registry, 1, 0), 60, "server ready at 0")
    pub = publisher_factory(ws_cfg)
    coord = pub.coordinator
    t2 = learner_tensors(tiny_model_dir, 2)
    await pub.publish(1, 1, lambda: iter(learner_tensors(tiny_model_dir, 1)))
    await pub.publish(2, 2, lambda: iter(t2))

    # a server started mid-run registers "starting" at 0 and is loaded from disk before ready.
    # What the coordinator found is in its history: the registry may already have moved on
    # (starting → updating → ready) by the time this test first looks.
    late = start_servers(1)[0]
    states: list[tuple[str, int | None]] = []

    async def late_ready() -> bool:
        s = await registry.get(late.server_id)
        if s is not None:
            states.append((s.state, s.version))
        return s is not None and s.state == "ready"

    await wait_for(late_ready, 60, "late server ready")
    assert all(v == 2 for st, v in states if st == "ready"), states
    assert (await registry.get(late.server_id)).version == 2
    assert await server_checksum(late.url) == expected_checksum(t2)
    assert [(r.from_state, r.from_version, r.transport, r.version, r.ok, r.drain_s)
            for r in coord.history() if r.server == late.server_id] == [
        ("starting", 0, "disk", 2, True, 0.0)]

    # v3 is written, then corrupted before the coordinator sees it; v4's checkpoint is missing
    m3 = checkpoints.write_checkpoint(ws_cfg.run.dir, 3, 3, learner_tensors(tiny_model_dir, 3), tiny_model_dir)
    p = checkpoints.version_dir(ws_cfg.run.dir, 3) / "model.safetensors"
    raw = bytearray(p.read_bytes())
    raw[len(raw) // 2] ^= 0x55
    p.write_bytes(bytes(raw))
    await policy.publish(3, m3)
    coord.wake()
    await wait_for(lambda: 3 in coord.refusals(), 20, "v3 refused")
    assert "version 3: file model.safetensors is corrupt" in coord.refusals()[3]
    await policy.publish(4, {**m3, "version": 4, "path": str(checkpoints.version_dir(ws_cfg.run.dir, 4))})
    coord.wake()
    await wait_for(lambda: 4 in coord.refusals(), 20, "v4 refused")
    assert "is missing" in coord.refusals()[4]
    await asyncio.sleep(1.0)
    assert await all_at(registry, 2, 2)  # untouched: ready at the old version, still serving
    for s in await registry.list():
        async with SGLangClient(s.url, api_key=API_KEY, timeout_s=30) as c:
            g = await c.generate([1, 2, 3], {"max_new_tokens": 2, "temperature": 0})
        assert str(g.weight_version) == "2"
        assert await server_checksum(s.url) == expected_checksum(t2)
    assert all(r.ok for r in coord.history()), coord.history()
    assert pub.metrics()["versions_refused"] == 2

    # the run goes on: the next good version reaches both (over gloo: the joiner gets a group)
    t5 = learner_tensors(tiny_model_dir, 5)
    await pub.publish(5, 5, lambda: iter(t5))
    assert await all_at(registry, 2, 5), coord.history()
    assert {await server_checksum(s.url) for s in await registry.list()} == {expected_checksum(t5)}
    assert [r.transport for r in coord.history()][-2:] == ["distributed", "distributed"]


async def test_retention_and_drain_timeout_choices(ws_cfg, aredis, keys, start_servers,
                                                   publisher_factory, tiny_model_dir):
    ws = ws_cfg.weight_sync
    ws.keep_versions = 2
    ws.wait_rollout = False
    ws.drain_timeout_action = "wait"
    ws.drain_timeout_s = 0.5
    start_servers(1)
    registry = ServerRegistry(aredis, keys)
    await wait_for(lambda: all_at(registry, 1, 0), 60, "server ready at 0")
    pub = publisher_factory(ws_cfg)
    await pub.publish(1, 1, lambda: iter(learner_tensors(tiny_model_dir, 1)))
    await wait_for(lambda: all_at(registry, 1, 1), 30, "server at 1")

    # "wait": an episode outlives the next versions; its server stays at v1, so v1 stays
    held = await registry.pin("long-episode")
    assert held is not None and held.version == 1
    for v in (2, 3, 4):
        await pub.publish(v, v, lambda v=v: iter(learner_tensors(tiny_model_dir, v)))
    await wait_for(lambda: checkpoints.on_disk_versions(ws_cfg.run.dir) == [1, 3, 4], 20,
                   f"v2 deleted, v1 kept {pub.coordinator.history()}")
    await asyncio.sleep(1.2)  # > 2 drain timeouts
    s = await registry.get(held.id)
    assert s.state == "draining" and s.version == 1
    assert pub.metrics()["drain_timeouts"] >= 2 and pub.metrics()["episodes_version_changed"] == 0
    assert await PolicyRegistry(aredis, keys).manifest(2) is None
    await registry.unpin(held.id, "long-episode")
    await wait_for(lambda: all_at(registry, 1, 4), 30, "server at 4 once the episode ended")
    await wait_for(lambda: checkpoints.on_disk_versions(ws_cfg.run.dir) == [3, 4], 20, "v1 deleted")
    await pub.close()

    # "proceed": the update goes ahead at the timeout and the pinned episode is counted
    ws.drain_timeout_action = "proceed"
    ws.wait_rollout = True
    pub = publisher_factory(ws_cfg)
    held = await registry.pin("stubborn")
    await pub.publish(5, 5, lambda: iter(learner_tensors(tiny_model_dir, 5)))
    assert await all_at(registry, 1, 5)
    assert pub.metrics()["episodes_version_changed"] == 1
    assert pub.coordinator.history()[-1].pins_at_update == 1
    stats = await aredis.hgetall(keys.stats)
    assert int(stats[b"weights_episodes_version_changed"]) == 1
    await registry.unpin(held.id, "stubborn")
    await pub.close()

    # a checkpoint that verifies but the server cannot load (wrong shapes): the server answers
    # success=false and keeps its weights; it goes back to ready at its old version, with the
    # reason, is not counted as updated, and the run goes on
    ws.drain_timeout_action = "wait"
    ws.retry_failed_s = 60  # no retry while we look
    pub = publisher_factory(ws_cfg)
    bad = [(n, t[..., :1].contiguous()) for n, t in learner_tensors(tiny_model_dir, 6)]
    await pub.publish(6, 6, lambda: iter(bad))
    s = (await registry.list())[0]
    assert (s.state, s.version) == ("ready", 5) and "update_weights_from_disk" in s.error
    last = pub.coordinator.history()[-1]
    assert not last.ok and last.version == 6 and pub.metrics()["updates_failed"] == 1
    async with SGLangClient(s.url, api_key=API_KEY, timeout_s=30) as c:
        assert str((await c.generate([1, 2], {"max_new_tokens": 1})).weight_version) == "5"
