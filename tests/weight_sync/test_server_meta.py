"""A server's registered meta decides whether it can join a weight-update group: the group's
world size is 1 + its tp_size. A server whose meta is missing or invalid is never given a group
with a guessed size; with the distributed transport it is updated from disk instead, logged,
counted once, and the reason is left in its registry entry. Real CPU server, real Redis."""

from __future__ import annotations

import json

from polling import wait_for
from ws_helpers import all_at, expected_checksum, learner_tensors, server_checksum

from broker.registry import ServerMeta, ServerRegistry


async def test_invalid_meta_is_updated_from_disk_never_over_a_group(
        ws_cfg, aredis, keys, start_servers, publisher_factory, tiny_model_dir):
    ws_cfg.weight_sync.transport = "distributed"
    srv = start_servers(1)[0]
    registry = ServerRegistry(aredis, keys)
    await wait_for(lambda: all_at(registry, 1, 0), 60, "server ready at 0")
    # An SGLang server registered without its tensor-parallel size (the heartbeat leaves meta be).
    await aredis.hset(keys.server(srv.server_id), "meta", json.dumps({"kind": "sglang", "model": "m"}))
    s = await registry.get(srv.server_id)
    assert s is not None and s.meta is None and "tp_size" in s.meta_error

    pub = publisher_factory(ws_cfg)
    tensors = {v: learner_tensors(tiny_model_dir, v) for v in (1, 2, 3)}
    for v in (1, 2):
        await pub.publish(v, v, lambda v=v: iter(tensors[v]))
        s = await registry.get(srv.server_id)
        assert s is not None and (s.state, s.version) == ("ready", v), s
        assert "loaded from disk, not over distributed" in s.error and "tp_size" in s.error, s.error
        assert await server_checksum(srv.url) == expected_checksum(tensors[v])
    assert [(r.transport, r.version, r.ok) for r in pub.coordinator.history()] == [
        ("disk", 1, True), ("disk", 2, True)]
    assert pub.metrics()["servers_meta_invalid"] == 1  # once per server, not per version

    # Registered again with a valid meta: the next version goes over a group of its own.
    meta = ServerMeta(kind="swarl-cpu", model=str(tiny_model_dir), tp_size=1)
    await aredis.hset(keys.server(srv.server_id), "meta", meta.model_dump_json())
    await pub.publish(3, 3, lambda: iter(tensors[3]))
    s = await registry.get(srv.server_id)
    assert s is not None and (s.state, s.version, s.error) == ("ready", 3, ""), s
    assert await server_checksum(srv.url) == expected_checksum(tensors[3])
    assert [(r.transport, r.version, r.ok) for r in pub.coordinator.history()][-1] == (
        "distributed", 3, True)
    assert pub.metrics()["servers_meta_invalid"] == 1
