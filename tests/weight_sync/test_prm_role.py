"""A PRM judge server (role prm) beside a policy server: the policy's rolling update brings the
policy server forward and leaves the judge's weights and version alone."""

from __future__ import annotations

import asyncio

from polling import wait_for
from ws_helpers import API_KEY, expected_checksum, learner_tensors, server_checksum

from broker.registry import ServerRegistry


async def test_policy_updates_leave_the_prm_server_alone(ws_cfg, aredis, keys, cpu_server_factory,
                                                         publisher_factory, tiny_model_dir, redis_url):
    ws_cfg.weight_sync.transport = "disk"
    policy = cpu_server_factory.start(tiny_model_dir, redis_url=redis_url, api_key=API_KEY)
    judge = cpu_server_factory.start(tiny_model_dir, redis_url=redis_url, api_key=API_KEY,
                                     extra_args=["--role", "prm"])
    registry = ServerRegistry(aredis, keys)

    async def both_ready() -> bool:
        infos = {s.id: s for s in await registry.list(alive_only=True)}
        return len(infos) == 2 and all(s.state == "ready" for s in infos.values())

    await wait_for(both_ready, 120, "both servers ready")
    assert (await registry.get(judge.server_id)).role == "prm"
    judge_before = await server_checksum(judge.url)
    pub = publisher_factory(ws_cfg)
    t1 = learner_tensors(tiny_model_dir, 1)
    await pub.publish(1, 1, lambda: iter(t1))

    async def policy_at_1() -> bool:
        s = await registry.get(policy.server_id)
        return s is not None and s.state == "ready" and s.version == 1

    await wait_for(policy_at_1, 60, "policy server at v1")
    assert await server_checksum(policy.url) == expected_checksum(t1)
    await asyncio.sleep(1.0)  # a few more coordinator passes
    j = await registry.get(judge.server_id)
    # the judge: still ready, still at its own version 0, its weights untouched, never in history
    assert (j.state, j.version) == ("ready", 0)
    assert await server_checksum(judge.url) == judge_before
    assert {r.server for r in pub.coordinator.history()} == {policy.server_id}
