"""What an actor process needs beyond its own config section, handed over by `swarl actor`."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from actors.config import ActorConfig
from broker.config import AdmissionConfig, QueueConfig, RedisConfig
from broker.keys import Keys


@dataclass(frozen=True)
class ActorRuntime:
    actor: ActorConfig
    keys: Keys
    redis: RedisConfig              # url set
    queue: QueueConfig
    admission: AdmissionConfig
    write_batch: int                # samples per pipelined XADD
    pool_url: str                   # where the envd pool answers
    envd_token: str | None
    tokenizer: str | None           # actor.tokenizer, else the served model's directory
    traj_dir: Path
    rollout_mode: str = "pinned"    # weight_sync.rollout_mode: "in-flight" lets versions move under episodes
