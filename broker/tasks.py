"""The task queue on arq (owned here): one job per (instance, group, sample index), with a
deterministic job id, and an arq worker whose running jobs keep a short, renewed claim.

arq claims a job by setting `arq:in-progress:<job id>` for job_timeout + 10 s, so a SIGKILLed
worker would hold its jobs for that long. swarl lets a healthy worker run a job for an hour
(job_timeout) while a dead worker's claim lapses within claim_ttl_s: a task inside the job
renews the claim (PEXPIRE) every claim_renew_s, and the claim is cut to claim_ttl_s at once.
Delivery is at-least-once, so rollouts are idempotent (sample ids dedupe in the learner).

Jobs and results are msgpack, never pickles (arq's default): whoever can write to Redis must
not be able to run code on every actor. `dump_job` / `load_job` are arq's job_serializer /
job_deserializer on both sides (the enqueueing pool and the worker); a payload that is not
msgpack (a pickle above all) is refused with an error naming it, and nothing of it runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import msgpack
import redis.asyncio as aioredis
from arq.connections import ArqRedis
from arq.utils import timestamp_ms
from arq.worker import Retry, Worker, func, get_kwargs
from redis.exceptions import RedisError

from broker.admission import register_groups, release_admitted
from broker.config import QueueConfig, RedisConfig
from broker.connection import connect_as, reply
from broker.keys import ARQ_IN_PROGRESS_PREFIX, Keys
from common.logs import get_logger

log = get_logger("broker.tasks")
JOB_FUNCTION = "rollout"
KEEP_RESULT_S = 7 * 24 * 3600
FINALISE_S = 60  # arq's timeout exceeds swarl's by this much: time to record a timed-out job
__all__ = ["JOB_FUNCTION", "Job", "JobFormatError", "Retry", "SwarlWorker", "arq_pool", "arq_redis",
           "create_worker", "dump_job", "enqueue_jobs", "epoch_order", "jobs_for", "jobs_for_group", "load_job",
           "record_failure", "worker_settings"]
_PICKLE_PROTO = 0x80  # every pickle of protocol >= 2 starts with PROTO 0x80

Rollout = Callable[[dict[str, Any], dict[str, Any]], Awaitable[Any]]
# (the worker, queued job ids in queue order, how many wanted) -> indices of those that may start now
Admissible = Callable[[Worker, list[str], int], Awaitable[list[int]]]


class JobFormatError(ValueError):
    """A job or result in Redis that is not swarl's msgpack (arq wraps it in DeserializationError)."""


def _data_only(obj: Any) -> Any:
    """msgpack's fallback: an exception (arq stores a failed job's exception as its result)
    becomes its text; anything else that is not plain data is refused."""
    if isinstance(obj, BaseException):
        return f"{type(obj).__name__}: {obj}"
    raise TypeError(f"job data must be plain data (dict, list, str, int, float, bool, None, bytes), "
                    f"got {type(obj).__name__}")


def dump_job(data: dict[str, Any]) -> bytes:
    """arq's job_serializer: msgpack (tuples become lists)."""
    return msgpack.packb(data, default=_data_only, use_bin_type=True)


def load_job(raw: bytes) -> dict[str, Any]:
    """arq's job_deserializer: msgpack only; a pickle is named and refused, never loaded."""
    if raw[:1] == bytes([_PICKLE_PROTO]):
        log.error("job_refused", reason="pickled payload", bytes=len(raw))
        raise JobFormatError("job payload is a pickle, refused: swarl reads msgpack jobs only "
                             "(a pickle would run code on the actor that loads it)")
    try:
        data = msgpack.unpackb(raw, raw=False, strict_map_key=True)
    except Exception as e:
        log.error("job_refused", reason=f"not msgpack: {type(e).__name__}", bytes=len(raw))
        raise JobFormatError(f"job payload is not msgpack: {type(e).__name__}: {e}") from None
    if not isinstance(data, dict):
        raise JobFormatError(f"job payload must be a msgpack map, got {type(data).__name__}")
    return data


def arq_redis(url: str, cfg: RedisConfig | None = None) -> ArqRedis:
    """arq's client, built by broker.connection like every other client: the same URLs and the
    same outage policy. arq's own create_pool retries only its first connect, and with
    sentinel=True passes no retry at all, so a restart or failover would end its worker."""
    pool = connect_as(ArqRedis, url, cfg)
    pool.job_serializer, pool.job_deserializer = dump_job, load_job
    return pool


async def arq_pool(url: str, cfg: RedisConfig | None = None) -> ArqRedis:
    pool = arq_redis(url, cfg)
    await pool.ping()
    return pool


class SwarlWorker(Worker):
    """arq's Worker with a poll loop that outlives a Redis outage.

    arq 0.28's `main` runs `_poll_iteration` (ZRANGEBYSCORE, the claim transaction, the health
    key) with no error handling, so any Redis error ends the worker. Commands already retry
    through broker.connection's outage policy; what is left is an error it cannot retry (a
    WatchError when the connection drops between WATCH and MULTI in `start_jobs`). Such a poll
    is logged and the next one retries; the job-slot count arq took before the failed claim is
    recomputed from the jobs actually running, so no slot leaks.
    """

    def __init__(self, *args: Any, room: Callable[[Worker], int] | None = None,
                 admissible: Admissible | None = None, retrying: str | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._room, self._admissible, self._retrying = room, admissible, retrying

    async def start_jobs(self, job_ids: list[bytes]) -> None:
        """arq's, taking no more jobs than `room(worker)` allows at the moment (besides arq's own
        max_jobs), and of the queue's jobs only those `admissible(worker, ids, n)` picks (indices, in
        order): an actor takes a job only when it can start generating it, so another actor
        with a free slot is not left waiting while this one holds jobs it cannot start, and a
        job that may start now is not left in the queue behind ones that must wait.

        Jobs due for a retry (`retrying`, Keys.jobs_retrying) come first: arq's retry put them at
        the back of the queue, out of the ids one poll reads, and at max_staleness 0 a retried
        member of the batch is the one job that can start (found in a benchmark: 3800 queued
        jobs, the retry never read again, the run stood still)."""
        ids = list(job_ids)
        if self._retrying is not None and self.allow_pick_jobs:
            due = await self.pool.zrangebyscore(self._retrying, min=float("-inf"), max=timestamp_ms(),
                                                start=0, num=self.queue_read_limit)
            if due:
                pipe = self.pool.pipeline(transaction=False)
                for j in due:
                    pipe.zscore(self.queue_name, j)
                queued = await pipe.execute()
                gone = [j for j, sc in zip(due, queued, strict=True) if sc is None]
                if gone:  # ended meanwhile (or the queue was cleared): never to run again
                    await self.pool.zrem(self._retrying, *gone)
                due = [j for j, sc in zip(due, queued, strict=True) if sc is not None]
                first = set(due)
                ids = [*due, *(i for i in ids if i not in first)]
        if self._room is None:
            return await super().start_jobs(ids)
        while ids:
            n = self._room(self)
            if n <= 0:
                return None
            if self._admissible is None:
                take, ids = ids[:n], ids[n:]
            else:
                picks = await self._admissible(self, [i.decode() for i in ids], n)
                if not picks:
                    return None
                take, ids = [ids[i] for i in picks], ids[picks[-1] + 1:]
            await super().start_jobs(take)  # some may be running elsewhere: room is asked again
        return None

    async def _poll_iteration(self) -> None:
        try:
            await super()._poll_iteration()
        except RedisError as e:
            running = sum(not t.done() for t in self.tasks.values())
            leaked = self.job_counter - running
            for _ in range(max(0, leaked)):
                self._release_sem_dec_counter_on_complete()
            log.warning("worker_poll_failed", error=f"{type(e).__name__}: {e}", slots_released=leaked)

    async def close(self) -> None:
        """arq's close, after waiting for the job tasks without raising: arq gathers them
        plainly, so one cancelled at shutdown while arq was finishing it (SIGTERM as a job is
        taken up) raised CancelledError out of close() and skipped on_shutdown — the actor's
        deregistration — and the pool's close."""
        tasks = list(self.tasks.values())
        for res in await asyncio.gather(*tasks, return_exceptions=True):
            if isinstance(res, Exception):
                log.warning("job_task_failed_at_shutdown", error=f"{type(res).__name__}: {res}")
        self.tasks = {}
        await super().close()


@dataclass(frozen=True)
class Job:
    instance: dict[str, Any]
    group_id: str
    sample_index: int
    n_samples: int
    data_source: str
    job_id: str

    def payload(self) -> dict[str, Any]:
        return {"instance": self.instance, "group_id": self.group_id,
                "sample_index": self.sample_index, "n_samples": self.n_samples,
                "data_source": self.data_source, "job_id": self.job_id}


def jobs_for(keys: Keys, instance: dict[str, Any], data_source: str, n_samples: int,
             epoch: int = 0) -> list[Job]:
    iid = instance["instance_id"]
    group_id = keys.group_id(iid, epoch)
    return [Job(instance, group_id, i, n_samples, data_source, keys.job_id(iid, epoch, i))
            for i in range(n_samples)]


def jobs_for_group(keys: Keys, instances: list[dict[str, Any]], data_source: str, n_each: int,
                   epoch: int = 0) -> list[Job]:
    """One group of `n_each` samples of each of `instances`, interleaved (A, B, A, B, ...): the
    learner trains a group whole, in one step, with one baseline (the mean reward over all of
    it), so what the instances share cancels in the advantages. One instance: `jobs_for`."""
    if len(instances) == 1:
        return jobs_for(keys, instances[0], data_source, n_each, epoch)
    name = "+".join(str(i["instance_id"]) for i in instances)
    group_id, n = keys.group_id(name, epoch), n_each * len(instances)
    return [Job(instances[k % len(instances)], group_id, k, n, data_source, keys.job_id(name, epoch, k))
            for k in range(n)]


def epoch_order(rows: list[Any], epochs: Iterable[int], seed: int | None = 0) -> list[tuple[Any, int]]:
    """(row, epoch) in the order to enqueue: epoch by epoch, each epoch's rows in their own
    seeded shuffle (seed None: file order). arq serves its queue oldest first, so file order
    would hand a run sorted by repository or bug family one kind of task for its first hours;
    epoch-major, so an instance's next group waits until every instance had one."""
    out = []
    for epoch in epochs:
        order = list(rows)
        if seed is not None:
            random.Random(f"{seed}:{epoch}").shuffle(order)
        out += [(row, epoch) for row in order]
    return out


async def enqueue_jobs(pool: ArqRedis, keys: Keys, jobs: Iterable[Job]) -> tuple[int, int]:
    """Enqueue in the order given (workers take them in that order); returns (added, skipped).
    A job whose id is queued, running, done or failed for good is skipped, so enqueueing the
    same data twice adds nothing."""
    jobs = list(jobs)
    if not jobs:
        return 0, 0
    # arq serves its queue by score (the enqueue time in ms), ties in job-id order: one score
    # per job, increasing in the order given and none in the future, keeps that order exactly
    t0 = time.time() * 1000 - len(jobs)
    done = await reply(pool.smismember(keys.jobs_done, [j.job_id for j in jobs]))
    failed = await reply(pool.hmget(keys.jobs_failed, [j.job_id for j in jobs]))
    # before the jobs: an actor looks a group's size up when it considers taking a member
    await register_groups(pool, keys, {j.group_id: j.n_samples for j in jobs})
    added = skipped = 0
    for k, (job, is_done, is_failed) in enumerate(zip(jobs, done, failed, strict=True)):
        if is_done or is_failed:
            skipped += 1
            continue
        res = await pool.enqueue_job(JOB_FUNCTION, job.payload(), _job_id=job.job_id, _queue_name=keys.queue,
                                     _defer_until=datetime.fromtimestamp((t0 + k) / 1000, tz=UTC))
        if res is None:
            skipped += 1
        else:
            added += 1
    return added, skipped


async def mark_done(redis: aioredis.Redis, keys: Keys, job_id: str) -> None:
    await reply(redis.sadd(keys.jobs_done, job_id))


async def record_failure(redis: aioredis.Redis, keys: Keys, job_id: str, reason: str,
                         tries: int = 0) -> None:
    """A job that failed for good: kept with its reason (HGETALL <jobs:failed>)."""
    doc = {"reason": reason, "tries": tries, "time": time.time()}
    pipe = redis.pipeline(transaction=True)
    pipe.hset(keys.jobs_failed, job_id, json.dumps(doc))
    pipe.hincrby(keys.stats, "jobs_failed", 1)
    await pipe.execute()
    log.error("job_failed_for_good", job_id=job_id, reason=reason, tries=tries)


async def _renew_claim(redis: aioredis.Redis, job_id: str, ttl_ms: int, every_s: float,
                       stop: asyncio.Event) -> None:
    # stopped by an event, not by cancel(): redis-py 5.3 with a socket timeout now and then
    # swallows a cancellation that lands inside a command, and the renewal would outlive its job
    key = ARQ_IN_PROGRESS_PREFIX + job_id
    while not stop.is_set():
        with contextlib.suppress(Exception):  # a blip must not kill the job; the next renewal retries
            await redis.pexpire(key, ttl_ms)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), every_s)


def create_worker(settings: type, **kwargs: Any) -> SwarlWorker:
    """arq's create_worker, building a SwarlWorker (that reads the settings' retrying key)."""
    return SwarlWorker(**{**get_kwargs(settings), "retrying": getattr(settings, "retrying", None), **kwargs})


def worker_settings(q: QueueConfig, keys: Keys, redis_url: str, rollout: Rollout, on_startup: Any = None,
                    on_shutdown: Any = None, max_jobs: int = 4, redis_cfg: RedisConfig | None = None) -> type:
    """An arq WorkerSettings class running `rollout(ctx, payload)` for each job.

    Retries are bounded: an exception on try < max_tries re-queues with backoff
    (arq Retry); on the last try (or after a worker died on it max_tries times) the job is
    recorded in jobs:failed with its reason and completed.
    """
    ttl_ms = int(q.claim_ttl_s * 1000)

    async def run_rollout(ctx: dict[str, Any], payload: dict[str, Any]) -> Any:
        job_id, job_try, redis = ctx["job_id"], ctx["job_try"], ctx["redis"]
        if job_try > q.max_tries:  # arq lets one more try in: workers died on every attempt
            await record_failure(redis, keys, job_id, f"no attempt finished in {q.max_tries} tries "
                                 "(worker killed or lost)", job_try - 1)
            await release_admitted(redis, keys, job_id)  # the slot its dead tries held
            return {"failed": True}
        with contextlib.suppress(RedisError):  # best effort: a stale entry is dropped by a poll
            await reply(redis.zrem(keys.jobs_retrying, job_id))  # this try is the retry
        if await reply(redis.sismember(keys.jobs_done, job_id)):  # an earlier try wrote its samples
            return {"skipped": "already done"}
        stop_renewing = asyncio.Event()
        renew = asyncio.create_task(_renew_claim(redis, job_id, ttl_ms, q.claim_renew_s, stop_renewing))
        try:
            # swarl's own deadline, inside arq's: arq's timeout finishes a job without a trace
            # (neither done nor failed), ours ends in a retry or a failure with its reason.
            async with asyncio.timeout(q.job_timeout_s):
                result = await rollout(ctx, payload)
            await mark_done(redis, keys, job_id)  # idempotent: a rollout may have marked it with its samples
        except (asyncio.CancelledError, Retry):
            raise
        except Exception as e:
            reason = (f"TimeoutError: the job ran past queue.job_timeout_s ({q.job_timeout_s}s)"
                      if isinstance(e, TimeoutError) else f"{type(e).__name__}: {e}")
            if job_try >= q.max_tries:
                await record_failure(redis, keys, job_id, reason, job_try)
                return {"failed": True, "reason": reason}
            log.warning("job_retry", job_id=job_id, job_try=job_try, reason=reason)
            defer = min(30.0, 2.0 ** job_try)
            with contextlib.suppress(RedisError):  # the retry must not be lost for its priority
                await reply(redis.zadd(keys.jobs_retrying, {job_id: timestamp_ms() + int(defer * 1000)}))
            raise Retry(defer=defer) from e
        finally:
            stop_renewing.set()
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.shield(renew)
        return result

    attrs = {
        "functions": [func(run_rollout, name=JOB_FUNCTION, max_tries=q.max_tries + 1,
                           timeout=q.job_timeout_s + FINALISE_S, keep_result=KEEP_RESULT_S)],
        "queue_name": keys.queue,
        "redis_pool": arq_redis(redis_url, redis_cfg),
        "job_serializer": dump_job,
        "job_deserializer": load_job,
        "max_jobs": max_jobs,
        "job_timeout": q.job_timeout_s + FINALISE_S,
        "poll_delay": q.poll_delay_s,
        "keep_result": KEEP_RESULT_S,
        "max_tries": q.max_tries + 1,
        "handle_signals": True,
        "on_startup": on_startup,
        "on_shutdown": on_shutdown,
        "health_check_interval": 30,
        "retrying": keys.jobs_retrying,  # not arq's: create_worker hands it to SwarlWorker
    }
    return type("SwarlWorkerSettings", (), attrs)
