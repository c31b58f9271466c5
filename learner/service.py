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
from learner.runtime import LearnerRuntime

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
                      publisher_factory: PublisherFactory | None = None) -> LearnerState:
    """Train until stopped; `publisher_factory` (None: versions are only counted) publishes."""
    import torch

    from broker.connection import connect
    from learner.backends import make_backend
    from learner.loop import Learner

    lcfg = rt.learner
    torch.set_num_threads(max(1, lcfg.threads))
    torch.manual_seed(rt.seed)
    base = base_model_dir(rt)
    ckpt = checkpoint.latest(rt.run_dir)
    if ckpt is not None and not resume:
        raise ResumeError(f"{ckpt} exists: pass --resume to continue this run, or use a new run.dir")
    backend = make_backend(lcfg, base, base if lcfg.kl_coef else None)
    state = checkpoint.load(ckpt, backend) if (resume and ckpt is not None) else LearnerState()
    if resume and ckpt is None:
        log.info("resume_without_checkpoint", run_dir=str(rt.run_dir))
    assert rt.redis.url, "the learner needs a Redis URL"
    redis = connect(rt.redis.url, rt.redis)
    publisher = None
    if publisher_factory is not None and lcfg.publish != "none":
        publisher = publisher_factory(redis, base)
    learner = Learner(rt, redis, backend, publisher, state)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, learner.stop)
    try:
        return await learner.run()
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
        if publisher is not None:
            await publisher.close()
        await redis.aclose()
