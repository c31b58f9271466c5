"""Wiring for `swarl learner`: model, backend, checkpoint resume, Redis, publisher, signals."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

from common.logs import get_logger
from learner import checkpoint
from learner.checkpoint import LearnerState
from learner.ranks import Ranks, catch_stop_signals, init_ranks, shutdown
from learner.runtime import LearnerRuntime
from learner.trainer import RankWorker, Trainer, follow

log = get_logger("learner")

# (the learner's Redis client, the base model directory) -> a WeightPublisher
PublisherFactory = Callable[[Any, str], Any]


class ResumeError(RuntimeError):
    """Refused to start: a checkpoint exists without --resume, or --resume without one."""


def base_model_dir(rt: LearnerRuntime) -> str:
    d = rt.model_dir
    if not d:
        raise ResumeError("learner.model_dir (or inference.model) must name an HF model directory")
    if not (Path(d) / "config.json").exists():
        raise ResumeError(f"learner.model_dir: {d} has no config.json")
    return d


async def run_learner(rt: LearnerRuntime, resume: bool,
                      publisher_factory: PublisherFactory | None = None) -> LearnerState | None:
    """Train until stopped. Under torchrun every rank calls this: rank 0 runs the loop (Redis,
    checkpoints, publishing) and returns its state; every other rank carries out rank 0's
    commands (learner/trainer.py `follow`) and returns None. `publisher_factory` (None: versions
    are only counted) makes rank 0's publisher."""
    import torch

    lcfg = rt.learner
    torch.set_num_threads(max(1, lcfg.threads))
    torch.manual_seed(rt.seed)
    ranks = init_ranks(lcfg.dist_timeout_s)
    clean = False
    try:
        state = await _run(rt, ranks, resume, publisher_factory)
        clean = True
        return state
    finally:
        shutdown(ranks, clean)


async def _run(rt: LearnerRuntime, ranks: Ranks, resume: bool,
               publisher_factory: PublisherFactory | None) -> LearnerState | None:
    """Everything that holds the model (so it is gone before the process group, see shutdown)."""
    from learner.backends import make_backend

    lcfg = rt.learner
    # the same checks on every rank (same config, same shared run directory), before any
    # collective, so a refusal ends every rank alike
    base = base_model_dir(rt)
    ckpt = checkpoint.latest(rt.run_dir)
    if ckpt is not None and not resume:
        raise ResumeError(f"{ckpt} exists: pass --resume to continue this run, or use a new run.dir")
    if ranks.distributed and not rt.redis.url:
        raise ResumeError("redis.url: required under torchrun (the ranks cannot share a private Redis)")
    backend = make_backend(lcfg, base, base if lcfg.kl_coef else None)
    worker = RankWorker(backend, lcfg)
    if not ranks.leader:
        catch_stop_signals(ranks)
        follow(worker, ranks)
        return None
    trainer = Trainer(worker, ranks)
    try:
        return await _lead(rt, trainer, ckpt if resume else None, base, publisher_factory)
    finally:
        trainer.close()


async def _lead(rt: LearnerRuntime, trainer: Trainer, ckpt: Path | None, base: str,
                publisher_factory: PublisherFactory | None) -> LearnerState:
    from broker.connection import connect
    from learner.loop import Learner

    if ckpt is not None:
        state = await asyncio.to_thread(checkpoint.load, ckpt, trainer)
    else:
        state = LearnerState()
        log.info("fresh_start", run_dir=str(rt.run_dir))
    assert rt.redis.url, "the learner needs a Redis URL"
    redis = connect(rt.redis.url, rt.redis)
    publisher = None
    if publisher_factory is not None and rt.learner.publish != "none":
        publisher = publisher_factory(redis, base)
    learner = Learner(rt, redis, trainer, publisher, state)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, learner.stop)
    clean = False
    try:
        state = await learner.run()
        clean = True
        return state
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
        if publisher is not None:
            await publisher.close(finish_rollout=clean)
        await redis.aclose()
