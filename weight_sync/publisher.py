"""The learner's WeightPublisher: persist a version, record it, hand it to the coordinator."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable, Iterable
from typing import Any

import redis.asyncio as aioredis
import torch

from broker.config import RedisConfig
from broker.keys import Keys
from broker.registry import PolicyRegistry
from common.logs import get_logger
from weight_sync import checkpoints
from weight_sync.config import WeightSyncConfig
from weight_sync.coordinator import Coordinator, default_client_factory
from weight_sync.coordinator_thread import CoordinatorThread
from weight_sync.protocols import ClientFactory, NamedTensors
from weight_sync.transports.distributed import Snapshot

log = get_logger("weight_sync")


class Publisher:
    """publish(version, step, named_tensors):
    1. distributed transport: snapshot the tensors (CPU copies: the whole model, held until
       every live server has it) and offer them to the coordinator, which starts loading them
       into ready servers at once;
    2. write the HF checkpoint (temp dir + rename, sha256 per file) — servers that join or
       restart load it, and it is the disk transport's payload. With the disk transport the
       tensors stream into it from `named_tensors` as they come: one shard is held, never
       the model;
    3. PolicyRegistry.publish(version, manifest): current = version;
    4. wake the coordinator (disk transport: it starts the rolling update now);
    5. with weight_sync.wait_rollout, wait until every live server has tried the version.
    Returns the manifest. The learner may go on training as soon as it returns: nothing
    here keeps a reference to its live parameters. `named_tensors` is called once, and what it
    returns is consumed once, to the end, on one worker thread (the learner's stream is a
    collective of its ranks)."""

    def __init__(self, cfg: WeightSyncConfig, redis: aioredis.Redis, keys: Keys, run_dir: str,
                 base_model_dir: str | None, coordinator: CoordinatorThread | None) -> None:
        self.cfg, self.keys, self.run_dir, self.base_model_dir = cfg, keys, run_dir, base_model_dir
        self.policy = PolicyRegistry(redis, keys)
        self.coordinator = coordinator
        self.last_version = 0  # the newest version this publisher recorded

    async def publish(self, version: int, step: int, named_tensors: NamedTensors) -> dict[str, Any]:
        t0 = time.monotonic()
        coord = self.coordinator
        if self.cfg.transport == "distributed" and coord is not None:
            snap = await asyncio.to_thread(Snapshot.take, version, named_tensors())
            coord.offer(snap)
            # The disk copy only serves servers that join later: let the broadcasts that can
            # start now go first instead of competing with them for CPU and memory bandwidth.
            await coord.wait_quiet(version, self.cfg.disk_write_defer_s)
            tensors: Iterable[tuple[str, torch.Tensor]] = snap.tensors
        else:
            tensors = named_tensors()
        manifest = await asyncio.to_thread(
            checkpoints.write_checkpoint, self.run_dir, version, step, tensors,
            self.base_model_dir, self.cfg.shard_mb)
        if coord is not None and not self.cfg.verify_own_checkpoints:
            coord.trust(manifest)
        await self.policy.publish(version, manifest)
        self.last_version = max(self.last_version, version)
        log.info("version_published", version=version, step=step, bytes=manifest["bytes"],
                 files=len(manifest["files"]), write_s=manifest["write_s"],
                 publish_s=round(time.monotonic() - t0, 3))
        if coord is not None:
            coord.wake()
            if self.cfg.wait_rollout:
                ok = await coord.wait_rolled(
                    version, self.cfg.drain_timeout_s + self.cfg.update_timeout_s + 60)
                if not ok:
                    log.warning("rollout_not_finished", version=version)
        return manifest

    def metrics(self) -> dict[str, float]:
        """The coordinator's counters (empty without a coordinator)."""
        return self.coordinator.metrics() if self.coordinator is not None else {}

    async def close(self, finish_rollout: bool = False) -> None:
        """Stop the coordinator; with finish_rollout (a clean stop), first let the last
        published version reach every live server, for at most stop_rollout_timeout_s."""
        coord = self.coordinator
        if coord is None:
            return
        wait_s = self.cfg.stop_rollout_timeout_s
        if finish_rollout and self.last_version and wait_s > 0:
            t0 = time.monotonic()
            ok = await coord.wait_rolled(self.last_version, wait_s)
            log.info("stop_rollout", version=self.last_version, rolled=ok,
                     seconds=round(time.monotonic() - t0, 3))
        await asyncio.to_thread(coord.stop)


def _redis_maker(redis_cfg: RedisConfig | None, redis: aioredis.Redis) -> Callable[[], aioredis.Redis]:
    """A client for the coordinator's own loop: the configured URL, else the learner's
    client's connection settings."""

    def make() -> aioredis.Redis:
        if redis_cfg is not None and redis_cfg.url:
            from broker.connection import connect

            return connect(redis_cfg.url, redis_cfg)
        pool = redis.connection_pool
        return aioredis.Redis(connection_pool=aioredis.ConnectionPool(
            connection_class=pool.connection_class, **pool.connection_kwargs))

    return make


def make_publisher(ws: WeightSyncConfig, redis: aioredis.Redis, keys: Keys,
                   run_dir: str | os.PathLike[str], base_model_dir: str | None,
                   api_key: str | None = None, redis_cfg: RedisConfig | None = None,
                   start_coordinator: bool = True,
                   client_factory: ClientFactory | None = None, eval_every: int = 0) -> Publisher:
    """The publisher the learner uses, with its rolling-update coordinator started on a thread
    of its own (start_coordinator=False: publish only; run a Coordinator elsewhere).
    `api_key` is the inference servers' key (weight_sync.api_key wins); `eval_every`
    (eval.every_versions) keeps the versions due for evaluation on disk until evaluated."""
    thread = None
    if start_coordinator:
        key = ws.api_key or api_key or os.environ.get("SWARL_INFERENCE_API_KEY")
        factory = client_factory or default_client_factory(key, ws.update_timeout_s)
        thread = CoordinatorThread(_redis_maker(redis_cfg, redis),
                                   lambda r: Coordinator(ws, r, keys, str(run_dir), factory,
                                                                 eval_every=eval_every))
        thread.start()
    return Publisher(ws, redis, keys, str(run_dir), base_model_dir, thread)
