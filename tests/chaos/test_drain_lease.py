"""A coordinator's draining/updating state is leased: when the coordinator dies (the learner
killed mid-publish) the lease lapses, the server takes pins again at the version it reports and
the next coordinator takes it over; a server draining itself (SIGTERM) holds no lease."""

from __future__ import annotations

import asyncio

from broker.registry import PolicyRegistry, ServerMeta, ServerRegistry
from weight_sync.config import WeightSyncConfig
from weight_sync.coordinator import Coordinator

META = ServerMeta(kind="swarl-cpu")


async def test_a_dead_coordinators_drain_lapses(aredis, keys, tmp_path):
    servers = ServerRegistry(aredis, keys)
    await servers.register("s1", "http://127.0.0.1:1", 3, meta=META, state="ready")
    await PolicyRegistry(aredis, keys).publish(4, {"path": str(tmp_path / "v4")})

    # a coordinator drains s1 for v4 and dies (no renewal)
    await servers.set_state("s1", "draining", version=3, lease_s=1.0)
    assert await servers.pin("e1") is None
    s = await servers.get("s1")
    assert s is not None and s.state == "draining" and not s.lapsed
    # the next coordinator leaves a live drain alone ...
    coord = Coordinator(WeightSyncConfig(), aredis, keys, str(tmp_path), lambda url: None)  # type: ignore[arg-type,return-value]
    assert coord._plan(s, 4) is None
    await asyncio.sleep(1.3)
    s = await servers.get("s1")
    assert s is not None and s.lapsed and s.lease_left_s is not None and s.lease_left_s < 0
    # ... and takes a lapsed one over, while actors pin it meanwhile at the version it reports
    plan = coord._plan(s, 4)
    assert plan is not None and plan[1] == 4
    assert await servers.pin("e2", min_version=3, exclude={"s1"}) is None  # an actor found it dead
    pinned = await servers.pin("e2", min_version=3)
    assert pinned is not None and pinned.id == "s1" and pinned.version == 3

    # a renewed lease holds; ready clears it; a server's own drain (no lease) never lapses
    await servers.set_state("s1", "updating", version=3, lease_s=1.0)
    for _ in range(3):
        await asyncio.sleep(0.5)
        assert await servers.renew_lease("s1", 1.0)
    s = await servers.get("s1")
    assert s is not None and s.state == "updating" and not s.lapsed
    await servers.set_state("s1", "ready", version=4)
    await servers.set_state("s1", "draining")
    await asyncio.sleep(1.2)
    s = await servers.get("s1")
    assert s is not None and s.lease_left_s is None and not s.lapsed
    assert await servers.pin("e3") is None
