"""weight_sync.rollout_mode in-flight against real CPU servers and Redis: servers are updated
under running episodes without draining (pause retract, load, continue), by disk and over gloo.
Running episodes go on, none of their generations is cut, each turn answers the version that
produced it (never older than the one before), and a new version reaches every server long
before the episodes pinned to them end."""

from __future__ import annotations

import asyncio
import time

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

TURNS = 40  # an episode outlives every publish below by far


async def _long_episodes(registry: ServerRegistry, client_for, n: int, stop: asyncio.Event,
                         log: list[tuple[int, list[str], list[str]]],
                         live: dict[int, list[str]] | None = None) -> None:
    """`live`, when given, holds each running episode's versions seen so far, turn by turn."""
    async def episode(w: int) -> None:
        s = None
        while s is None:
            s = await registry.pin(f"long-{w}")
            await asyncio.sleep(0.05)
        seen: list[str] = (live if live is not None else {}).setdefault(w, [])
        finishes: list[str] = []
        try:
            for _ in range(TURNS):
                if stop.is_set():
                    break
                g = await client_for(s.url).generate(
                    [1, 2, 3, 4], {"max_new_tokens": 24, "temperature": 0, "ignore_eos": True})
                seen.append(str(g.weight_version))
                finishes.append((g.finish_reason or {}).get("type", ""))
        finally:
            await registry.unpin(s.id, f"long-{w}")
        log.append((s.version or 0, seen, finishes))

    await asyncio.gather(*[episode(w) for w in range(n)])


async def test_in_flight_updates_do_not_wait_for_running_episodes(ws_cfg, aredis, keys, start_servers,
                                                                 publisher_factory, tiny_model_dir):
    ws_cfg.weight_sync.rollout_mode = "in-flight"
    srvs = start_servers(2)
    registry = ServerRegistry(aredis, keys)
    await wait_for(lambda: all_at(registry, 2, 0), 60, "2 servers ready at 0")
    clients: dict[str, SGLangClient] = {}

    def client_for(url: str) -> SGLangClient:
        return clients.setdefault(url, SGLangClient(url, api_key=API_KEY, timeout_s=60))

    stop = asyncio.Event()
    episodes: list[tuple[int, list[str], list[str]]] = []
    live: dict[int, list[str]] = {}
    bg = asyncio.create_task(_long_episodes(registry, client_for, 4, stop, episodes, live))
    rolled: dict[int, float] = {}
    history = []
    try:
        async def pinned() -> bool:
            return sum([await registry.pin_count(s.id) for s in await registry.list()]) == 4

        await wait_for(pinned, 20, "episodes pinned")
        t1, t2 = learner_tensors(tiny_model_dir, 1), learner_tensors(tiny_model_dir, 2)
        pub = publisher_factory(ws_cfg)  # disk
        t0 = time.monotonic()
        await pub.publish(1, 1, lambda: iter(t1))
        rolled[1] = time.monotonic() - t0
        assert await all_at(registry, 2, 1), pub.coordinator.history()
        assert {await server_checksum(s.url) for s in srvs} == {expected_checksum(t1)}
        history += pub.coordinator.history()
        metrics = pub.metrics()
        await pub.close()
        ws_cfg.weight_sync.transport = "distributed"
        pub = publisher_factory(ws_cfg)
        t0 = time.monotonic()
        await pub.publish(2, 2, lambda: iter(t2))
        rolled[2] = time.monotonic() - t0
        assert await all_at(registry, 2, 2), pub.coordinator.history()
        assert {await server_checksum(s.url) for s in srvs} == {expected_checksum(t2)}
        history += pub.coordinator.history()
        assert not bg.done(), "the episodes ended before the versions rolled: nothing was shown"
        # a turn after the roll, however slow a loaded machine makes each turn (a CI run beside
        # other work stopped the episodes before any had generated again)
        await wait_for(lambda: any(len(set(v)) > 1 for v in live.values()), 60,
                       "a running episode's turn at the new version")
    finally:
        stop.set()
        await asyncio.gather(bg, return_exceptions=True)
        for c in clients.values():
            await c.aclose()
    assert [(r.version, r.transport, r.ok) for r in history] == [
        (1, "disk", True), (1, "disk", True), (2, "distributed", True), (2, "distributed", True)]
    assert all(r.drain_s == 0 for r in history)  # nothing waited for an episode
    assert sum(r.pins_at_update for r in history) >= 4  # updated under pinned episodes
    assert metrics["paused_s"] > 0 and metrics["pause_max_s"] < 10
    assert len(episodes) == 4
    for pinned, seen, finishes in episodes:
        assert "abort" not in finishes, finishes  # retract: no generation cut
        ints = [int(v) for v in seen]
        assert ints == sorted(ints) and ints[0] >= pinned, seen  # each turn's version, never older
    assert any(len(set(seen)) > 1 for _, seen, _ in episodes), "no episode saw a version change"
