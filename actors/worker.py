"""`swarl actor`: an arq worker generating K episodes at once (actor.concurrency) while up to
actor.grading_concurrency more grade their patches, registered in the actor registry.

SIGTERM: arq stops taking jobs, lets running episodes finish for actor.shutdown_grace_s, then
cancels the rest — a cancelled job goes back to the queue, and each episode's `finally` closes
its lease, drops its pin and frees its admission slot. SIGKILL: the job's claim lapses within
queue.claim_ttl_s, another actor runs it again, and the pool reaps the orphaned lease."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
from typing import Any

from actors.runtime import ActorRuntime
from common.logs import get_logger

log = get_logger("actors.worker")


def build_settings(rt: ActorRuntime, concurrency: int) -> type:
    from actors.rollout import Rollouts
    from broker.connection import connect
    from broker.registry import ActorRegistry
    from broker.tasks import worker_settings

    keys = rt.keys
    assert rt.redis.url, "an actor needs a Redis URL"
    redis_url = rt.redis.url

    async def beat(ctx: dict[str, Any]) -> None:
        reg, ro = ctx["actor_registry"], ctx["rollouts"]
        while True:
            await asyncio.sleep(rt.actor.heartbeat_s)
            with contextlib.suppress(Exception):
                await reg.heartbeat(ro.actor_id, ro.running, dict(ro.totals))

    async def on_startup(ctx: dict[str, Any]) -> None:
        r = connect(redis_url, rt.redis)
        ro = Rollouts(rt, r, slots=concurrency)
        await ro.warm_up()
        reg = ActorRegistry(r, keys)
        await reg.register(ro.actor_id, socket.gethostname(), os.getpid(), concurrency)
        ctx.update(actor_redis=r, rollouts=ro, actor_registry=reg)
        ctx["actor_beat"] = asyncio.create_task(beat(ctx))
        log.info("actor_started", actor_id=ro.actor_id, concurrency=concurrency,
                 grading_concurrency=rt.actor.grading_concurrency, run=keys.run)

    async def on_shutdown(ctx: dict[str, Any]) -> None:
        if (t := ctx.get("actor_beat")) is not None:
            t.cancel()
        ro = ctx.get("rollouts")
        if ro is not None:
            with contextlib.suppress(Exception):
                await ctx["actor_registry"].remove(ro.actor_id)
            await ro.aclose()
            log.info("actor_stopped", actor_id=ro.actor_id, totals=dict(ro.totals))
        if (r := ctx.get("actor_redis")) is not None:
            await r.aclose()

    async def rollout(ctx: dict[str, Any], payload: dict[str, Any]) -> Any:
        return await ctx["rollouts"].run(payload, int(ctx.get("job_try", 1)))

    # arq's jobs: the generating ones (Rollouts' slots; run_actor takes a job only into a free
    # one) and those grading past their last turn
    return worker_settings(rt.queue, keys, redis_url, rollout, on_startup=on_startup,
                           on_shutdown=on_shutdown, max_jobs=concurrency + rt.actor.grading_concurrency,
                           redis_cfg=rt.redis)


async def run_actor(rt: ActorRuntime, concurrency: int) -> None:
    import logging

    from broker.tasks import create_worker

    # arq's own lines (job started / finished / retried) go where swarl's logs go
    arq_log = logging.getLogger("arq")
    arq_log.setLevel(logging.INFO)
    for h in logging.getLogger("swarl").handlers:
        if h not in arq_log.handlers:
            arq_log.addHandler(h)
    settings = build_settings(rt, concurrency)

    def room(w: Any) -> int:
        ro = w.ctx.get("rollouts")  # set by on_startup, before the first poll
        return ro.room(w.job_counter) if ro is not None else 0

    async def admissible(w: Any, job_ids: list[str], want: int) -> list[int]:
        ro = w.ctx.get("rollouts")
        running = [j for j, t in w.tasks.items() if not t.done()]
        return await ro.admissible(job_ids, want, running) if ro is not None else []

    worker = create_worker(settings, job_completion_wait=max(0, int(rt.actor.shutdown_grace_s)),
                           room=room, admissible=admissible)
    try:
        await worker.async_run()
    except asyncio.CancelledError:
        pass  # arq cancels its main task on SIGTERM / SIGINT
    finally:
        await worker.close()
