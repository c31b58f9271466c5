"""Learner checkpoints: <run_dir>/learner/checkpoints/step_XXXXXXXX/ written to a temp dir and
renamed into place (a kill -9 mid-write leaves no half checkpoint), plus a `latest` pointer.

Each holds the backend's model (HF safetensors) + optimizer + scheduler, the RNG states, and
`state.json`: step, policy version, every consumed sample id and every decided group id, the
drop counters and the decided token counts. Resume = load the newest one; what it records is exactly what was trained.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Protocol

import numpy as np
import torch

from common.files import atomic_write_text, fsync_dir


class ModelStore(Protocol):
    """What writes and reads a checkpoint's model part: a backend, or rank 0's Trainer (which
    has every rank write its own part)."""

    def save(self, path: Path) -> None: ...
    def load(self, path: Path) -> None: ...


@dataclass
class LearnerState:
    step: int = 0
    version: int = 0
    consumed: list[str] = field(default_factory=list)
    closed_groups: list[str] = field(default_factory=list)
    dropped: dict[str, int] = field(default_factory=dict)
    dropped_stale: dict[str, int] = field(default_factory=dict)
    trained_samples: int = 0
    trained_tokens: int = 0
    # generated tokens the learner decided, by what (trained, loss_masked, dropped_<reason>):
    # the stats hash's learner fields, exact across a kill (learner.loop)
    tokens: dict[str, int] = field(default_factory=dict)


def ckpt_root(run_dir: str | Path) -> Path:
    return Path(run_dir) / "learner" / "checkpoints"


def save(run_dir: str | Path, model: ModelStore, state: LearnerState, keep: int = 2) -> Path:
    root = ckpt_root(run_dir)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step_{state.step:08d}"
    tmp = root / f".tmp_step_{state.step:08d}_{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    model.save(tmp)
    torch.save({"torch": torch.get_rng_state(), "numpy": np.random.get_state(),
                "python": random.getstate()}, tmp / "rng.pt")
    (tmp / "state.json").write_text(json.dumps({**asdict(state), "time": time.time()}))
    for f in tmp.rglob("*"):
        if f.is_file():
            with open(f, "rb") as fh:
                os.fsync(fh.fileno())
    if final.exists():  # a re-save of the same step (resume before any new step)
        shutil.rmtree(final)
    os.rename(tmp, final)
    fsync_dir(root)
    atomic_write_text(root / "latest", final.name)
    _prune(root, keep)
    return final


def _prune(root: Path, keep: int) -> None:
    steps = sorted(p for p in root.glob("step_*") if p.is_dir())
    for p in steps[: max(0, len(steps) - max(1, keep))]:
        shutil.rmtree(p, ignore_errors=True)
    for p in root.glob(".tmp_step_*"):
        shutil.rmtree(p, ignore_errors=True)


def latest(run_dir: str | Path) -> Path | None:
    root = ckpt_root(run_dir)
    ptr = root / "latest"
    if ptr.exists():
        p = root / ptr.read_text().strip()
        if (p / "state.json").exists():
            return p
    steps = sorted(p for p in root.glob("step_*") if (p / "state.json").exists())
    return steps[-1] if steps else None


def load(path: Path, model: ModelStore) -> LearnerState:
    model.load(path)
    rng = torch.load(path / "rng.pt", weights_only=False)
    torch.set_rng_state(rng["torch"])
    np.random.set_state(rng["numpy"])
    random.setstate(rng["python"])
    raw = json.loads((path / "state.json").read_text())
    raw.pop("time", None)
    return LearnerState(**raw)
