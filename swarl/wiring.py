"""How the roof hands each component what it needs: its own sections of the SwarlConfig, the
run's Keys and a Redis section with its URL set (a private server a command started, if any)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from actors.runtime import ActorRuntime
from learner.runtime import LearnerRuntime
from learner.service import PublisherFactory
from swarl.config import SwarlConfig


def actor_runtime(cfg: SwarlConfig, redis_url: str | None = None) -> ActorRuntime:
    a = cfg.actor
    if not cfg.pool.url and a.environment == "envd":
        raise ValueError("pool.url: not set (where actors reach `swarl pool serve`)")
    return ActorRuntime(
        actor=a, keys=cfg.keys, redis=cfg.redis_at(redis_url) if redis_url else cfg.redis,
        queue=cfg.queue, admission=cfg.admission, write_batch=cfg.replay.write_batch,
        pool_url=cfg.pool.url or "", envd_token=cfg.envd.token, tokenizer=a.tokenizer or cfg.inference.model,
        traj_dir=Path(a.traj_dir or Path(cfg.run.dir) / "trajectories"),
        rollout_mode=cfg.weight_sync.rollout_mode)


def learner_runtime(cfg: SwarlConfig, redis_url: str | None = None) -> LearnerRuntime:
    return LearnerRuntime(
        learner=cfg.learner, admission=cfg.admission, replay=cfg.replay, keys=cfg.keys,
        redis=cfg.redis_at(redis_url) if redis_url else cfg.redis, run_dir=Path(cfg.run.dir),
        seed=cfg.run.seed, model_dir=cfg.learner.model_dir or cfg.inference.model)


def publisher_factory(cfg: SwarlConfig, redis_url: str | None = None) -> PublisherFactory:
    """weight_sync's publisher for the learner (its coordinator on a thread of the learner)."""

    def make(redis: Any, base_model_dir: str) -> Any:
        from weight_sync import make_publisher

        return make_publisher(cfg.weight_sync, redis, cfg.keys, cfg.run.dir, base_model_dir,
                              api_key=cfg.inference.api_key,
                              redis_cfg=cfg.redis_at(redis_url) if redis_url else cfg.redis,
                              eval_every=cfg.eval.every_versions or 0)

    return make
