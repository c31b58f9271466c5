"""envd, the pool and a Docker node fail under a live actor: envd SIGKILLed mid-exec and
restarted; the pool SIGKILLed and restarted while the actor holds a lease; a second Docker node
(dockerd and its envd) SIGKILLed while leases on it are open, then removed from the pool.

Each time: the episode hit by the fault ends as an infrastructure failure and is retried (never
a -1 reward: the scripted policy applies the right fix, so every sample's reward is +1), the job
ends done exactly once, and no container is left on any node once the leases have run out."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import docker
import pytest
import redis as redis_sync
from fixtures_envd import TEST_IMAGE, start_envd
from fixtures_nodes import (
    actor_sets,
    calc_row,
    second_docker,
    start_actor,
    start_scripted,
    write_config,
)

from broker.keys import Keys
from broker.tasks import arq_pool, enqueue_jobs, jobs_for
from common.services import free_port
from envd.client import EnvdClient

__all__ = ["second_docker"]  # the fixture, imported for pytest
pytestmark = [pytest.mark.docker, pytest.mark.chaos, pytest.mark.timeout(900)]
KEYS = Keys("swarl", "test")
POOL_SETS = ["pool.lease_ttl_s=15", "pool.reap_interval_s=1", "pool.health_interval_s=1"]


async def _wait(cond, limit_s: float, what: str, logs=()) -> None:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if await cond():
            return
        await asyncio.sleep(0.5)
    tails = "\n".join(p.log()[-4000:] for p in logs)
    raise AssertionError(f"timed out waiting for {what}\n{tails}")


def _labelled(docker_url: str, node_id: str) -> list:
    client = docker.DockerClient(base_url=docker_url, timeout=60)
    try:
        return client.containers.list(all=True, filters={"label": f"swarl.owner={node_id}"}, ignore_removed=True)
    finally:
        client.close()


async def _enqueue(redis_url: str, rows: list[dict]) -> set[str]:
    pool = await arq_pool(redis_url)
    try:
        jobs = [j for row in rows for j in jobs_for(KEYS, row, "chaos", 1)]
        assert (await enqueue_jobs(pool, KEYS, jobs))[0] == len(jobs)
        return {j.job_id for j in jobs}
    finally:
        await pool.aclose()


def _outcome(redis_url: str) -> dict:
    from broker.wire import decode

    r = redis_sync.Redis.from_url(redis_url)
    try:
        samples = [decode(f[b"s"]) for _, f in r.xrange(KEYS.replay)]
        return {"done": {m.decode() for m in r.smembers(KEYS.jobs_done)},
                "failed": {k.decode() for k in r.hkeys(KEYS.jobs_failed)},
                "rewards": [s.reward for s in samples],
                "episodes": {s.episode_id for s in samples},
                "retried": int(r.hget(KEYS.stats, "episodes_infra_retried") or 0)}
    finally:
        r.close()


def _config(tmp_path: Path, redis_url: str, pool, tiny_model_dir, server) -> Path:
    return write_config(tmp_path / "actor.yaml", actor_sets(
        redis_url, tmp_path / "run", pool.url, pool.token, tiny_model_dir, server.api_key,
        **{"queue.max_tries": 4, "actor.allocate_wait_s": 60}))


def _check(out: dict, job_ids: set[str], retried_at_least: int = 1) -> None:
    assert out["done"] == job_ids and not out["failed"], out
    assert out["episodes"] == job_ids, out
    assert out["rewards"] and all(x == 1.0 for x in out["rewards"]), out["rewards"]   # never -1
    assert out["retried"] >= retried_at_least, out


async def test_envd_killed_mid_exec_and_restarted(redis_url, envd_factory, pool_factory, tiny_model_dir,
                                                  test_image, docker_url, tmp_path):
    port, node_id = free_port(), "chaos-envd-restart"
    node = envd_factory(node_id=node_id, redis_url=redis_url, port=port)   # leases in Redis
    pool = pool_factory([node.url], redis_url, sets=POOL_SETS)
    rows = [calc_row(TEST_IMAGE, 41, "sleep")]
    server = start_scripted(tiny_model_dir, rows, redis_url, tmp_path / "logs", sleep_s=10)
    actor = start_actor(_config(tmp_path, redis_url, pool, tiny_model_dir, server), tmp_path / "logs")
    pc = EnvdClient.pool(pool.url, pool.token)
    try:
        job_ids = await _enqueue(redis_url, rows)
        await _wait(lambda: _leases(pc, 1), 120, "the actor's lease", [actor])
        await asyncio.sleep(3)                      # inside the 10 s exec
        assert len(_labelled(docker_url, node_id)) == 1
        node.kill()
        t_fault = time.monotonic()
        await asyncio.sleep(2)
        envd_factory(node_id=node_id, redis_url=redis_url, port=port)     # same node, same port
        await _wait(lambda: _done(redis_url, job_ids), 180, "the job done after the restart", [actor])
        # the exec is never sent again (the killed one may still run in the container): the
        # episode fails as infrastructure and is retried
        _check(_outcome(redis_url), job_ids)
        _report("envd_killed_mid_exec", redis_url, t_fault)
        await _wait(lambda: _leases(pc, 0), 60, "no lease left", [actor])
        # the container of the killed exec was adopted at restart and expires with its lease
        await _wait(lambda: _none_left(docker_url, node_id), 90, "no container left", [actor])
    finally:
        await pc.aclose()
        actor.stop()
        server.stop()


async def test_pool_killed_and_restarted_while_a_lease_is_held(redis_url, envd_factory, pool_factory,
                                                               tiny_model_dir, test_image, docker_url,
                                                               tmp_path):
    node = envd_factory(redis_url=redis_url)
    pool_port = free_port()
    pool = pool_factory([node.url], redis_url, sets=POOL_SETS, port=pool_port)
    rows = [calc_row(TEST_IMAGE, 42, "sleep")]
    server = start_scripted(tiny_model_dir, rows, redis_url, tmp_path / "logs", sleep_s=10)
    actor = start_actor(_config(tmp_path, redis_url, pool, tiny_model_dir, server), tmp_path / "logs")
    pc = EnvdClient.pool(pool.url, pool.token)
    try:
        job_ids = await _enqueue(redis_url, rows)
        await _wait(lambda: _leases(pc, 1), 120, "the actor's lease", [actor])
        await asyncio.sleep(3)
        pool.kill()
        t_fault = time.monotonic()
        await asyncio.sleep(3)
        pool_factory([node.url], redis_url, sets=POOL_SETS, port=pool_port)   # same Redis, same port
        await _wait(lambda: _done(redis_url, job_ids), 180, "the job done after the restart", [actor])
        # the lease lives in Redis: the restarted pool served it, or the episode was retried
        _check(_outcome(redis_url), job_ids, retried_at_least=0)
        _report("pool_killed_with_a_lease", redis_url, t_fault)
        await _wait(lambda: _leases(pc, 0), 60, "no lease left", [actor])
        await _wait(lambda: _none_left(docker_url, node.node_id), 90, "no container left", [actor])
    finally:
        await pc.aclose()
        actor.stop()
        server.stop()


async def test_docker_node_lost_with_open_leases(redis_url, envd_factory, pool_factory, second_docker,
                                                 envd_token, tiny_model_dir, test_image, docker_url,
                                                 tmp_path):
    node1 = envd_factory()                                        # in-memory leases
    node2_id, node2_port = "chaos-node-2", free_port()

    def start_node2():
        return start_envd(envd_token, tmp_path / "envd2-logs", node2_id, port=node2_port,
                          env={"DOCKER_HOST": second_docker.url, "SWARL_REDIS_URL": ""})

    node2 = start_node2()
    pool = pool_factory([node1.url, node2.url], redis_url, sets=[*POOL_SETS, "pool.max_per_node=1"])
    rows = [calc_row(TEST_IMAGE, n, "sleep") for n in (43, 44)]
    server = start_scripted(tiny_model_dir, rows, redis_url, tmp_path / "logs", sleep_s=10)
    actor = start_actor(_config(tmp_path, redis_url, pool, tiny_model_dir, server), tmp_path / "logs",
                        concurrency=2)
    pc = EnvdClient.pool(pool.url, pool.token)
    try:
        job_ids = await _enqueue(redis_url, rows)
        await _wait(lambda: _leases(pc, 2), 120, "a lease on each node", [actor])
        assert len(_labelled(second_docker.url, node2_id)) == 1
        await asyncio.sleep(3)
        node2.kill()                                               # the node is gone: envd and Docker
        second_docker.kill()
        t_fault = time.monotonic()
        await _wait(lambda: _done(redis_url, job_ids), 240, "both jobs done on the node left", [actor])
        _check(_outcome(redis_url), job_ids)
        _report("docker_node_lost", redis_url, t_fault)
        await pc.remove_node(node2.url)                            # the operator takes it out
        await _wait(lambda: _node_gone(pc, node2.url), 30, "node 2 dropped from the pool", [actor])
        await _wait(lambda: _leases(pc, 0), 60, "no lease left", [actor])
        await _wait(lambda: _none_left(docker_url, node1.node_id), 60, "no container left on node 1")
        # node 2 comes back (same data root, same node id): its envd destroys what it left
        second_docker.start()
        assert _labelled(second_docker.url, node2_id), "the lost node's container should still be listed"
        node2 = start_node2()
        await _wait(lambda: _none_left(second_docker.url, node2_id), 60, "node 2's orphans destroyed")
    finally:
        await pc.aclose()
        actor.stop()
        server.stop()
        node2.stop()


def _report(fault: str, redis_url: str, t_fault: float) -> None:
    """What the fault cost, for docs/reliability.md (printed; run with -s to see it)."""
    out = _outcome(redis_url)
    print(json.dumps({"fault": fault, "jobs_done_s_after_fault": round(time.monotonic() - t_fault, 1),
                      "episodes_retried": out["retried"], "jobs_failed": len(out["failed"]),
                      "samples": len(out["rewards"]), "negative_rewards": sum(x < 0 for x in out["rewards"])}))


async def _leases(pc, n: int) -> bool:
    try:
        return (await pc.status())["leases"] == n
    except Exception:
        return False      # the pool is restarting


async def _node_gone(pc, url: str) -> bool:
    return url not in (await pc.status())["nodes"]


async def _done(redis_url: str, job_ids: set[str]) -> bool:
    return _outcome(redis_url)["done"] >= job_ids


async def _none_left(docker_url: str, node_id: str) -> bool:
    return not await asyncio.to_thread(_labelled, docker_url, node_id)


