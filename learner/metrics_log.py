"""Per-step metrics to <run_dir>/metrics.jsonl and TensorBoard (<run_dir>/tb), and the log of
trained sample ids (<run_dir>/learner/trained.jsonl) that makes exactly-once checkable."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any


def truncate_after(path: Path, step: int) -> int:
    """Drop lines whose "step" > step (written after the checkpoint we resume from)."""
    if not path.exists():
        return 0
    kept, dropped = [], 0
    for line in path.read_text().splitlines():
        try:
            doc = json.loads(line)
        except json.JSONDecodeError:  # a line cut by kill -9
            dropped += 1
            continue
        if int(doc.get("step", 0)) <= step:
            kept.append(line)
        else:
            dropped += 1
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(k + "\n" for k in kept))
    os.replace(tmp, path)
    return dropped


class MetricsLog:
    def __init__(self, run_dir: str | Path, tensorboard: bool = True) -> None:
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.path = self.run_dir / "metrics.jsonl"
        self._tb = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(str(self.run_dir / "tb"))

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        doc = {"step": step, **metrics}
        with open(self.path, "a") as f:
            f.write(json.dumps(doc, default=float) + "\n")
        if self._tb is not None:
            for k, v in metrics.items():
                if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v):
                    self._tb.add_scalar(k, v, step)
            self._tb.flush()

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()
            self._tb = None


class TrainedIds:
    """Appends {"step": n, "ids": [...]} per step, fsynced before the step's checkpoint."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def append(self, step: int, ids: list[str]) -> None:
        with open(self.path, "a") as f:
            f.write(json.dumps({"step": step, "ids": ids}) + "\n")
            f.flush()
            os.fsync(f.fileno())
