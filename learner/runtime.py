"""What the learner process needs beyond its own config section, handed over by `swarl learner`."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from broker.config import AdmissionConfig, RedisConfig, ReplayConfig
from broker.keys import Keys
from learner.config import LearnerConfig


@dataclass(frozen=True)
class LearnerRuntime:
    learner: LearnerConfig
    admission: AdmissionConfig      # batch_size and max_staleness: the staleness rule
    replay: ReplayConfig
    keys: Keys
    redis: RedisConfig              # url set
    run_dir: Path
    seed: int
    model_dir: str | None           # learner.model_dir, else the model the servers start from
