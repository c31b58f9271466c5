"""Which server the rolling update takes first, against real CPU servers and a real Redis.

A straggler (an episode pinned for long) on a server behind must not hold the newest version
back from the servers that could take it at once: that server takes no new pins anyway (the pin
script prefers the newest version), so its drain is free and does not count against
max_updating. Before, with max_updating 1, one straggler held every other update back and new
episodes started a version behind until it ended.
"""

from __future__ import annotations

import asyncio

from polling import wait_for
from ws_helpers import all_at, learner_tensors

from broker.registry import ServerRegistry
from weight_sync.transports.disk import DiskTransport


async def _sample_states(registry: ServerRegistry, stop: asyncio.Event, seen: list[list[str]]) -> None:
    while not stop.is_set():
        seen.append([s.state for s in await registry.list(alive_only=True)])
        await asyncio.sleep(0.01)


async def test_a_straggler_behind_holds_no_other_update_back(ws_cfg, aredis, keys, start_servers,
                                                             publisher_factory, tiny_model_dir):
    ws = ws_cfg.weight_sync
    ws.wait_rollout = False
    assert ws.max_updating == 1 and ws.min_ready == 1  # the defaults, where it mattered
    start_servers(3)
    registry = ServerRegistry(aredis, keys)
    await wait_for(lambda: all_at(registry, 3, 0), 60, "3 servers ready at 0")
    t = [learner_tensors(tiny_model_dir, k) for k in (1, 2, 3)]
    pub = publisher_factory(ws_cfg)
    stop = asyncio.Event()
    states: list[list[str]] = []
    sampler = asyncio.create_task(_sample_states(registry, stop, states))
    try:
        await pub.publish(1, 1, lambda: iter(t[0]))
        await wait_for(lambda: all_at(registry, 3, 1), 60, "every server at 1")
        straggler = await registry.pin("straggler")  # an episode that outlives two versions
        assert straggler is not None and straggler.version == 1

        await pub.publish(2, 2, lambda: iter(t[1]))
        # the two empty servers take version 2; the straggler's server drains behind them
        others = await wait_for(lambda: _at(registry, 2, 2), 30, "two servers at 2")
        assert straggler.id not in {s.id for s in others}
        await wait_for(lambda: _state(registry, straggler.id, "draining"), 10, "straggler's server draining")

        await pub.publish(3, 3, lambda: iter(t[2]))
        # the straggler is still pinned, and yet version 3 reaches a server within seconds
        first = await wait_for(lambda: _at(registry, 3, 1), 15, "a server at 3 while the straggler runs")
        assert straggler.id not in {s.id for s in first}
        assert await registry.pin_count(straggler.id) == 1
        await registry.unpin(straggler.id, "straggler")
        await wait_for(lambda: all_at(registry, 3, 3), 30, "every server at 3 once the straggler ended")
    finally:
        stop.set()
        await sampler
    history = pub.coordinator.history()
    assert all(r.ok and r.pins_at_update == 0 for r in history), history
    # the straggler's server skipped version 2: it loaded the newest once empty
    assert [r.version for r in history if r.server == straggler.id] == [1, 3], history
    # loads stayed one at a time (max_updating 1), and a server stayed ready throughout
    assert states and max(st.count("updating") for st in states) <= 1
    assert min(st.count("ready") for st in states) >= 1


async def _at(registry: ServerRegistry, version: int, n: int) -> list:
    """At least `n` servers ready at `version` (them), else []."""
    at = [s for s in await registry.list(alive_only=True) if s.state == "ready" and s.version == version]
    return at if len(at) >= n else []


async def _state(registry: ServerRegistry, sid: str, state: str) -> bool:
    s = await registry.get(sid)
    return s is not None and s.state == state


async def test_failed_loads_also_keep_to_max_updating(ws_cfg, aredis, keys, start_servers,
                                                      publisher_factory, tiny_model_dir, monkeypatch):
    """A load that fails leaves its server out of service until it is marked back, inside the load
    slot: the next server's load waits for that (before, the failure path left the slot first,
    and with a slow transport cleanup two servers showed "updating" at max_updating 1)."""
    forget = DiskTransport.forget

    async def slow_forget(self: DiskTransport, server_id: str) -> None:
        await asyncio.sleep(2)  # e.g. tearing down a broken broadcast group
        await forget(self, server_id)

    monkeypatch.setattr(DiskTransport, "forget", slow_forget)
    ws = ws_cfg.weight_sync
    ws.wait_rollout, ws.retry_failed_s = False, 60  # no retry while we look
    registry = ServerRegistry(aredis, keys)
    pub = publisher_factory(ws_cfg)
    # verifies as a checkpoint, but no server can load it (wrong shapes): each one refuses
    bad = [(n, t[..., :1].contiguous()) for n, t in learner_tensors(tiny_model_dir, 1)]
    await pub.publish(1, 1, lambda: iter(bad))
    stop = asyncio.Event()
    states: list[list[str]] = []
    sampler = asyncio.create_task(_sample_states(registry, stop, states))
    try:
        # they join behind the current version ("starting", not serving): nothing to drain, so
        # only the load slot keeps their loads apart
        await asyncio.gather(*(asyncio.to_thread(start_servers, 1) for _ in range(3)))
        await wait_for(lambda: _tried(pub, 3), 90, "three failed loads")
    finally:
        stop.set()
        await sampler
    history = pub.coordinator.history()
    assert len(history) == 3 and all(not r.ok and r.version == 1 for r in history), history
    servers = await registry.list(alive_only=True)
    assert [(s.state, s.version) for s in servers] == [("failed", 0)] * 3, servers
    assert states and max(st.count("updating") for st in states) <= 1


async def _tried(pub, n: int) -> bool:
    return len(pub.coordinator.history()) >= n
