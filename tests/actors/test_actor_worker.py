"""`swarl actor` processes on a shared queue: no duplicated work, SIGTERM deregisters, SIGKILL
mid-episode hands the job to another actor and leaves no container behind."""

from __future__ import annotations

import asyncio
import time

import pytest
from actor_services import actor_sets, calc_row, start_actor, start_scripted, write_config
from fixtures_envd import TEST_IMAGE

from broker.connection import connect
from broker.keys import Keys
from broker.registry import ActorRegistry
from broker.replay import ReplayReader
from broker.tasks import arq_pool, enqueue_jobs, jobs_for

pytestmark = [pytest.mark.docker, pytest.mark.slow]
KEYS = Keys("swarl", "test")


async def _wait(cond, limit_s: float, what: str, procs=()) -> None:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if await cond():
            return
        await asyncio.sleep(0.3)
    logs = "\n".join(p.log()[-6000:] for p in procs)
    raise AssertionError(f"timed out waiting for {what}\n{logs}")


async def _samples(r) -> list:
    reader = ReplayReader(r, KEYS, group="check", consumer="t")
    await reader.ensure_group()
    out = []
    while batch := await reader.read(count=256, block_ms=50):
        out += [e.sample for e in batch]
    return out


async def _enqueue(redis_url: str, rows: list[dict], n: int) -> list[str]:
    pool = await arq_pool(redis_url)
    try:
        jobs = [j for row in rows for j in jobs_for(KEYS, row, "swarl-test", n)]
        added, _ = await enqueue_jobs(pool, KEYS, jobs)
        assert added == len(jobs)
        return [j.job_id for j in jobs]
    finally:
        await pool.aclose()


async def test_two_actors_share_a_queue_without_duplicates(tiny_model_dir, redis_url, pool_server,
                                                            test_image, tmp_path):
    rows = [calc_row(TEST_IMAGE, i, "fix") for i in (1, 2)]
    server = start_scripted(tiny_model_dir, rows, redis_url, tmp_path / "logs")
    cfg_path = write_config(tmp_path / "actor.yaml", actor_sets(
        redis_url, tmp_path / "run", pool_server.url, pool_server.token, tiny_model_dir, server.api_key))
    actors = [start_actor(cfg_path, tmp_path / "logs", concurrency=2) for _ in range(2)]
    r = connect(redis_url)
    reg = ActorRegistry(r, KEYS)
    try:
        await _wait(lambda: _count(reg.list(), 2), 60, "two actors registered", actors)
        job_ids = await _enqueue(redis_url, rows, 2)
        await _wait(lambda: _done(r, len(job_ids)), 150, "all jobs done", actors)
        samples = await _samples(r)
        ids = [s.sample_id for s in samples]
        assert len(ids) == len(set(ids)) == 2 * len(job_ids)     # 2 steps per episode, once each
        assert {s.episode_id for s in samples} == set(job_ids)
        assert all(s.reward == 1.0 for s in samples)
        async def _all_counted() -> bool:  # totals arrive with the next heartbeat
            return sum(a["totals"].get("episodes", 0) for a in await reg.list()) == len(job_ids)

        await _wait(_all_counted, 20, "the actors' totals", actors)
        busy = [a for a in await reg.list() if a["totals"].get("episodes", 0) > 0]
        assert len(busy) == 2                                       # both actors took work
    finally:
        for a in actors:
            a.stop()
        server.stop()
    assert all(a.proc.returncode == 0 for a in actors), [a.log()[-2000:] for a in actors]
    assert await reg.list() == []          # SIGTERM deregistered them
    await r.aclose()


async def test_sigterm_hands_back_sigkill_reruns_elsewhere_without_orphans(
        tiny_model_dir, redis_url, envd_server, pool_factory, test_image, tmp_path, docker_url):
    import docker

    from broker.registry import ServerRegistry
    from envd.client import EnvdClient
    from envd.docker_backend import LABEL_LEASE

    pool = pool_factory([envd_server.url], redis_url, sets=["pool.lease_ttl_s=15", "pool.reap_interval_s=1"])
    rows = [calc_row(TEST_IMAGE, 7, "sleep")]
    server = start_scripted(tiny_model_dir, rows, redis_url, tmp_path / "logs", sleep_s=8)
    cfg_path = write_config(tmp_path / "actor.yaml", actor_sets(
        redis_url, tmp_path / "run", pool.url, pool.token, tiny_model_dir, server.api_key,
        **{"queue.max_tries": 4, "actor.shutdown_grace_s": 1}))
    r = connect(redis_url)
    pc = EnvdClient.pool(pool.url, pool.token)
    procs = []
    try:
        (job_id,) = await _enqueue(redis_url, rows, 1)
        # 1. SIGTERM mid-episode: the episode is handed back, its lease, pin and slot released
        first = start_actor(cfg_path, tmp_path / "logs")
        procs.append(first)
        await _wait(lambda: _leases(pc, 1), 90, "the first actor's lease", procs)
        lease_a = (await pc.status())["lease_ids"][0]
        t0 = time.monotonic()
        first.stop()
        assert first.proc.returncode == 0, first.log()[-3000:]
        assert (await pc.status())["leases"] == 0 and time.monotonic() - t0 < 15  # closed, not expired
        assert [s.pins for s in await ServerRegistry(r, KEYS).list()] == [0]
        # the job keeps its admission slot for its re-run (broker.admission: across its tries)
        assert int(await r.get(KEYS.admission_started) or 0) == 1
        assert await r.exists(KEYS.admission_job(job_id))
        assert await ActorRegistry(r, KEYS).list() == []
        assert await r.scard(KEYS.jobs_done) == 0
        # 2. SIGKILL mid-episode: the job runs again on another actor
        second = start_actor(cfg_path, tmp_path / "logs")
        procs.append(second)
        await _wait(lambda: _leases(pc, 1), 90, "the second actor's lease", procs)
        lease_b = (await pc.status())["lease_ids"][0]
        second.kill()
        third = start_actor(cfg_path, tmp_path / "logs")
        procs.append(third)
        await _wait(lambda: _done(r, 1), 150, "the job done by the third actor", procs)
        samples = await _samples(r)
        assert [s.sample_id for s in samples] == [f"{job_id}:0", f"{job_id}:1"]  # one copy
        assert all(s.reward == 1.0 for s in samples)
        # one job, one admission slot through its three tries (the killed one gave nothing back)
        assert int(await r.get(KEYS.admission_started) or 0) == 1
        assert not await r.exists(KEYS.admission_job(job_id))
        await _wait(lambda: _leases(pc, 0), 40, "the orphaned lease reaped", procs)
        client = docker.DockerClient(base_url=docker_url)
        try:
            for lease in (lease_a, lease_b):
                assert client.api.containers(all=True, filters={"label": f"{LABEL_LEASE}={lease}"}) == []
        finally:
            client.close()
    finally:
        await pc.aclose()
        for p in procs:
            p.stop()
        server.stop()
        await r.aclose()


async def _count(coro, n: int) -> bool:
    return len(await coro) >= n


async def _done(r, n: int) -> bool:
    return await r.scard(KEYS.jobs_done) >= n


async def _leases(pc, n: int) -> bool:
    return (await pc.status())["leases"] == n
