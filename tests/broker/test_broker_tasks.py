import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from broker.keys import ARQ_IN_PROGRESS_PREFIX, Keys
from broker.tasks import arq_pool, enqueue_jobs, jobs_for, jobs_for_group

HERE = Path(__file__).parent
ROW = {"instance_id": "demo__calc-1", "problem_statement": "x breaks", "repo": "demo/calc"}


def start_worker(url: str, mode: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(HERE / "worker_app.py"), url, mode],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)


def stop(p: subprocess.Popen) -> None:
    if p.poll() is None:
        p.terminate()
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(5)


async def test_enqueue_is_idempotent(redis_url, keys):
    pool = await arq_pool(redis_url)
    try:
        jobs = jobs_for(keys, ROW, "test.jsonl", n_samples=4)
        assert {j.group_id for j in jobs} == {"demo__calc-1:g0"}
        assert [j.sample_index for j in jobs] == [0, 1, 2, 3]
        assert await enqueue_jobs(pool, keys, jobs) == (4, 0)
        assert await enqueue_jobs(pool, keys, jobs) == (0, 4)
        assert await pool.zcard(keys.queue) == 4
        # a job that completed (and whose arq result expired) is still not enqueued again
        await pool.zrem(keys.queue, jobs[0].job_id)
        await pool.delete(f"arq:job:{jobs[0].job_id}")
        await pool.sadd(keys.jobs_done, jobs[0].job_id)
        assert await enqueue_jobs(pool, keys, jobs) == (0, 4)
        other_run = Keys("swarl", "other")
        assert await enqueue_jobs(pool, other_run, jobs_for(other_run, ROW, "t", 4)) == (4, 0)
    finally:
        await pool.aclose()


async def test_a_group_of_several_instances(redis_url, keys):
    other = {**ROW, "instance_id": "demo__calc-2"}
    jobs = jobs_for_group(keys, [ROW, other], "t", n_each=2, epoch=3)
    assert [j.instance["instance_id"] for j in jobs] == ["demo__calc-1", "demo__calc-2"] * 2
    assert {j.group_id for j in jobs} == {"demo__calc-1+demo__calc-2:g3"} and {j.n_samples for j in jobs} == {4}
    assert [j.sample_index for j in jobs] == [0, 1, 2, 3] and len({j.job_id for j in jobs}) == 4
    assert {keys.group_of(j.job_id) for j in jobs} == {"demo__calc-1+demo__calc-2:g3"}
    assert jobs_for_group(keys, [ROW], "t", 4) == jobs_for(keys, ROW, "t", 4)
    pool = await arq_pool(redis_url)
    try:
        assert await enqueue_jobs(pool, keys, jobs) == (4, 0)
        assert await enqueue_jobs(pool, keys, jobs) == (0, 4)
        assert [i.decode() for i in await pool.zrange(keys.queue, 0, -1)] == [j.job_id for j in jobs]
        assert int(await pool.hget(keys.group_sizes, "demo__calc-1+demo__calc-2:g3")) == 4
    finally:
        await pool.aclose()


async def _wait_for(pred, within_s: float, what: str):
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        v = await pred()
        if v:
            return v
        await asyncio.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.mark.slow
async def test_sigkilled_worker_job_runs_again_within_60s(redis_url, keys, aredis):
    pool = await arq_pool(redis_url)
    w1 = start_worker(redis_url, "hang")
    w2 = None
    try:
        await enqueue_jobs(pool, keys, jobs_for(keys, ROW, "t", 1))
        await _wait_for(lambda: aredis.llen("test:tries"), 30, "first try")
        # the claim is short and renewed, not job_timeout + 10 s
        ttl = await aredis.pttl(f"arq:in-progress:{keys.job_id('demo__calc-1', 0, 0)}")
        assert 0 < ttl <= 3000
        os.killpg(w1.pid, signal.SIGKILL)
        w1.wait(5)
        killed_at = time.monotonic()
        w2 = start_worker(redis_url, "hang")
        await _wait_for(lambda: aredis.sismember(keys.jobs_done, keys.job_id("demo__calc-1", 0, 0)),
                        60, "the re-run to finish")
        assert time.monotonic() - killed_at < 60
        tries = [t.decode().split(":")[1] for t in await aredis.lrange("test:tries", 0, -1)]
        assert tries == ["1", "2"]
    finally:
        stop(w1)
        if w2:
            stop(w2)
        await pool.aclose()


@pytest.mark.slow
async def test_retries_are_bounded_and_failure_recorded(redis_url, keys, aredis):
    pool = await arq_pool(redis_url)
    w = start_worker(redis_url, "fail")
    try:
        await enqueue_jobs(pool, keys, jobs_for(keys, ROW, "t", 1))
        job_id = keys.job_id("demo__calc-1", 0, 0)
        raw = await _wait_for(lambda: aredis.hget(keys.jobs_failed, job_id), 60, "failure record")
        doc = json.loads(raw)
        assert "envd unreachable" in doc["reason"] and doc["tries"] == 3
        assert await aredis.llen("test:tries") == 3
        # the record is written inside the job; arq takes the job off the queue just after
        await _wait_for(lambda: _not(aredis.zcard(keys.queue)), 10, "the failed job to leave the queue")
    finally:
        stop(w)
        await pool.aclose()


@pytest.mark.slow
async def test_samples_and_done_mark_are_one_write(redis_url, keys, aredis):
    """The flake of the actors issue: an actor wrote an episode's samples, then died (or was
    cancelled, or Redis failed) before the separate SADD to jobs:done. The job then never
    showed as done and its re-run wrote the samples again. Now both are one MULTI/EXEC: a
    worker killed right after the write leaves the job done, and the re-run writes nothing."""
    pool = await arq_pool(redis_url)
    w1 = start_worker(redis_url, "write-hang")
    w2 = None
    job_id = keys.job_id("demo__calc-1", 0, 0)
    try:
        await enqueue_jobs(pool, keys, jobs_for(keys, ROW, "t", 1))
        await _wait_for(lambda: aredis.xlen(keys.replay), 30, "the first try's samples")
        assert await aredis.sismember(keys.jobs_done, job_id)      # with the samples, not after
        os.killpg(w1.pid, signal.SIGKILL)
        w1.wait(5)
        w2 = start_worker(redis_url, "write-hang")
        await _wait_for(lambda: _not(aredis.zcard(keys.queue)), 60, "the re-run to finish")
        tries = [t.decode().split(":")[1] for t in await aredis.lrange("test:tries", 0, -1)]
        assert tries == ["1"]                                       # the re-run skipped the job
        assert await aredis.xlen(keys.replay) == 1                  # one copy of the samples
        assert await aredis.hlen(keys.jobs_failed) == 0
    finally:
        stop(w1)
        if w2:
            stop(w2)
        await pool.aclose()


@pytest.mark.slow
async def test_a_job_past_its_timeout_is_retried_then_failed_with_its_reason(redis_url, keys, aredis):
    """arq's own timeout finished such a job silently (neither done nor failed): lost."""
    pool = await arq_pool(redis_url)
    w = start_worker(redis_url, "slow")
    try:
        await enqueue_jobs(pool, keys, jobs_for(keys, ROW, "t", 1))
        job_id = keys.job_id("demo__calc-1", 0, 0)
        raw = await _wait_for(lambda: aredis.hget(keys.jobs_failed, job_id), 60, "failure record")
        doc = json.loads(raw)
        assert "queue.job_timeout_s (2s)" in doc["reason"] and doc["tries"] == 3, doc
        assert await aredis.llen("test:tries") == 3
        # the record is written inside the job; arq takes the job off the queue just after
        await _wait_for(lambda: _not(aredis.zcard(keys.queue)), 10, "the failed job to leave the queue")
    finally:
        stop(w)
        await pool.aclose()


async def _not(coro) -> bool:
    return not await coro


async def test_close_after_a_cancelled_job_task_still_runs_on_shutdown(redis_url):
    """SIGTERM as a job is taken up leaves a cancelled job task; arq's close() re-raised its
    CancelledError and skipped on_shutdown (the actor's deregistration)."""
    from broker.tasks import create_worker, worker_settings
    from swarl.config import load_config

    cfg = load_config(None, [f"redis.url={redis_url}", "run.id=test"], environ={})
    shut: list[bool] = []

    async def rollout(ctx, payload):
        return {}

    async def on_shutdown(ctx):
        shut.append(True)

    worker = create_worker(worker_settings(cfg.queue, cfg.keys, redis_url, rollout, on_shutdown=on_shutdown))
    task = asyncio.create_task(asyncio.sleep(3600))
    worker.tasks["test:job"] = task
    task.cancel()
    await worker.close()
    assert shut == [True] and task.cancelled()


async def test_a_worker_takes_no_more_jobs_than_its_room(redis_url, keys):
    """`room` (an actor: its free generation slots) bounds the jobs taken, below max_jobs: the
    jobs it could not start yet stay in the queue for other workers."""
    from broker.tasks import create_worker, worker_settings
    from swarl.config import load_config

    cfg = load_config(None, [f"redis.url={redis_url}", "run.id=test", "queue.poll_delay_s=0.05"],
                      environ={})
    started: list[str] = []
    release = asyncio.Event()

    async def rollout(ctx, payload):
        started.append(ctx["job_id"])
        await release.wait()
        return {}

    gate = {"slots": 1}
    worker = create_worker(worker_settings(cfg.queue, cfg.keys, redis_url, rollout, max_jobs=4),
                           handle_signals=False, room=lambda w: gate["slots"] - w.job_counter)
    pool = await arq_pool(redis_url)
    run = asyncio.create_task(worker.async_run())
    try:
        await enqueue_jobs(pool, cfg.keys, jobs_for(cfg.keys, ROW, "t", 3))
        await _wait_for(lambda: _async(len(started) >= 1), 20, "the first job")
        await asyncio.sleep(0.5)  # ten polls: max_jobs would have let all three in
        claimed = [k async for k in pool.scan_iter(match=ARQ_IN_PROGRESS_PREFIX + "*")]
        assert len(started) == 1 and len(claimed) == 1, (started, claimed)
        gate["slots"] = 3
        await _wait_for(lambda: _async(len(started) == 3), 20, "the other two once there is room")
    finally:
        await _stop(worker, run, release, pool)


async def test_a_worker_leaves_queued_the_jobs_admission_would_make_wait(redis_url, keys, aredis):
    """With `admissible` (an actor: Admission.admissible) a worker with room takes only the jobs
    that can start now; the rest stay queued (for a retry of the batch to overtake, or another
    worker) instead of waiting for admission in a job slot."""
    from broker.admission import Admission
    from broker.config import AdmissionConfig
    from broker.tasks import create_worker, worker_settings
    from swarl.config import load_config

    cfg = load_config(None, [f"redis.url={redis_url}", "run.id=test", "queue.poll_delay_s=0.05"],
                      environ={})
    adm = Admission(aredis, cfg.keys, AdmissionConfig(max_staleness=0, batch_size=2))
    started: list[str] = []
    release = asyncio.Event()

    async def rollout(ctx, payload):  # an actor's order: wait for admission first
        while await adm.admit(payload["group_id"], payload["n_samples"], job_id=ctx["job_id"]) != "started":
            await asyncio.sleep(0.05)
            if release.is_set():
                return {}
        started.append(ctx["job_id"])
        await release.wait()
        return {}

    async def admissible(w, job_ids, want):  # jobs taken, not admitted yet, count first
        taken = [(j, cfg.keys.group_of(j)) for j, t in w.tasks.items() if not t.done() and j not in started]
        return await adm.admissible([(j, cfg.keys.group_of(j)) for j in job_ids], want, taken=taken)

    worker = create_worker(worker_settings(cfg.queue, cfg.keys, redis_url, rollout, max_jobs=4),
                           handle_signals=False, room=lambda w: 4 - w.job_counter, admissible=admissible)
    pool = await arq_pool(redis_url)
    run = asyncio.create_task(worker.async_run())
    rows = [{**ROW, "instance_id": f"demo__calc-{i}"} for i in (1, 2)]
    try:
        await enqueue_jobs(pool, cfg.keys, [j for r in rows for j in jobs_for(cfg.keys, r, "t", 2)])
        await _wait_for(lambda: _async(len(started) >= 2), 20, "the first group")
        await asyncio.sleep(0.5)  # ten polls with room for all four
        claimed = [k async for k in pool.scan_iter(match=ARQ_IN_PROGRESS_PREFIX + "*")]
        assert sorted(started) == [cfg.keys.job_id("demo__calc-1", 0, i) for i in (0, 1)], started
        assert len(claimed) == 2 and await pool.zcard(cfg.keys.queue) == 4, claimed
        await aredis.set(cfg.keys.policy_current, 1)  # the next version opens the next batch
        await _wait_for(lambda: _async(len(started) == 4), 20, "the second group")
    finally:
        await _stop(worker, run, release, pool)


async def test_a_retried_job_is_read_again_however_long_the_queue(redis_url, keys, aredis):
    """arq's retry puts a job at the back of the queue, past the ids one poll reads
    (queue_read_limit): at max_staleness 0, with every job read waiting for admission, the retried
    member of the batch was never read again and the run stood still (benchmark, 3800 queued
    jobs). Workers look at the jobs due for a retry first."""
    from broker.tasks import create_worker, worker_settings
    from swarl.config import load_config

    cfg = load_config(None, [f"redis.url={redis_url}", "run.id=test", "queue.poll_delay_s=0.05",
                             "queue.max_tries=2"], environ={})
    first = cfg.keys.job_id("demo__calc-0", 0, 0)
    tries: list[int] = []
    release = asyncio.Event()

    async def rollout(ctx, payload):
        if ctx["job_id"] == first:
            tries.append(ctx["job_try"])
            if ctx["job_try"] == 1:
                raise RuntimeError("envd answered 502")
        return {}

    async def admissible(w, job_ids, want):  # the others wait for the batch `first` belongs to
        return [i for i, j in enumerate(job_ids) if j == first][:want]

    worker = create_worker(worker_settings(cfg.queue, cfg.keys, redis_url, rollout, max_jobs=4),
                           handle_signals=False, queue_read_limit=3,
                           room=lambda w: 4 - w.job_counter, admissible=admissible)
    pool = await arq_pool(redis_url)
    run = asyncio.create_task(worker.async_run())
    rows = [{**ROW, "instance_id": f"demo__calc-{i}"} for i in range(6)]
    try:
        await enqueue_jobs(pool, cfg.keys, [j for r in rows for j in jobs_for(cfg.keys, r, "t", 2)])
        await _wait_for(lambda: _async(tries == [1, 2]), 20, "the retried job's second try")
        await _wait_for(lambda: aredis.sismember(cfg.keys.jobs_done, first), 10, "the retried job done")
        assert await aredis.zcard(cfg.keys.jobs_retrying) == 0  # taken off when its try began
        assert await pool.zcard(cfg.keys.queue) == 11  # the others stay queued
    finally:
        await _stop(worker, run, release, pool)


async def _async(value):
    return value


async def _stop(worker, run: asyncio.Task, release: asyncio.Event, pool) -> None:
    """Let the worker's jobs end, then stop it and close the pool."""
    release.set()
    await asyncio.sleep(0.3)
    run.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await run
    await worker.close()
    await pool.aclose()


async def test_a_job_no_try_finished_gives_its_admission_slot_back(redis_url, keys, aredis):
    """Workers died on every try of a job (arq lets one more try in to say so): the job is
    recorded failed, and the admission slot its tries held (broker.admission) goes back."""
    from broker.admission import Admission
    from broker.config import AdmissionConfig, QueueConfig
    from broker.tasks import worker_settings

    async def never(ctx, payload):
        raise AssertionError("a job past its tries must not run")

    q = QueueConfig(max_tries=3)
    adm = Admission(aredis, keys, AdmissionConfig(max_staleness=0, batch_size=2))
    job_id = keys.job_id("demo__calc-1", 0, 0)
    assert await adm.admit("demo__calc-1:g0", 1, job_id=job_id) == "started"  # its first try
    settings = worker_settings(q, keys, redis_url, never)
    try:
        run = settings.functions[0].coroutine
        assert await run({"job_id": job_id, "job_try": 4, "redis": aredis}, {}) == {"failed": True}
    finally:
        await settings.redis_pool.aclose()
    doc = json.loads(await aredis.hget(keys.jobs_failed, job_id))
    assert "no attempt finished in 3 tries" in doc["reason"]
    assert (await adm.capacity())["started"] == 0
    assert not await aredis.exists(keys.admission_job(job_id))
