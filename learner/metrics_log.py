"""Per-step metrics to <run_dir>/metrics.jsonl and TensorBoard (<run_dir>/tb), and the log of
trained sample ids (<run_dir>/learner/trained.jsonl) that makes exactly-once checkable.

metrics.jsonl holds two kinds of rows: the learner's, one per step (`step`, `version`, ...), and
the eval worker's, one per evaluated policy version (`step` = the step that published it,
`eval_version`, `eval/resolve_rate`, ...; see EvalLog). `read_metrics` reads both."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

from common.files import atomic_write_text


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
    atomic_write_text(path, "".join(k + "\n" for k in kept))
    return dropped


EVAL_VERSION = "eval_version"  # the policy version an eval row measured
EVAL_WEIGHTS = "eval_weights"  # which weights of it (a version published again has other weights)


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """Every row of a metrics.jsonl (a line cut by a crash is left out)."""
    rows: list[dict[str, Any]] = []
    p = Path(path)
    if not p.exists():
        return rows
    for line in p.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows


def eval_metrics(result: dict[str, Any]) -> dict[str, float]:
    """The numbers of an eval result (broker.evals), named eval/<name>: the summary's numbers
    (resolve_rate, resolved, episodes, avg_steps, ...), pass@k, the error count, the duration."""
    out: dict[str, float] = {}
    summary = result.get("summary") or {}
    for k, v in summary.items():
        if isinstance(v, int | float) and not isinstance(v, bool):
            out[f"eval/{k}"] = v
    for k, v in (summary.get("pass_at_k") or {}).items():
        out[f"eval/pass@{k}"] = v
    out["eval/errors"] = sum(int(n) for n in (summary.get("errors") or {}).values())
    if result.get("started") and result.get("finished"):
        out["eval/duration_s"] = round(float(result["finished"]) - float(result["started"]), 3)
    return out


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

    def log_eval(self, step: int, version: int, metrics: dict[str, float], weights: str | None = None) -> None:
        """One eval row: metrics.jsonl {"step", "eval_version", "eval_weights", eval/...};
        TensorBoard both by the step that published the version (eval/<name>) and by version
        (eval_by_version/<name>)."""
        doc = {"step": step, EVAL_VERSION: version, **({EVAL_WEIGHTS: weights} if weights else {}), **metrics}
        with open(self.path, "a") as f:  # one write of one line: appends from two processes stay whole
            f.write(json.dumps(doc, default=float) + "\n")
        if self._tb is not None:
            for k, v in metrics.items():
                if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v):
                    self._tb.add_scalar(k, v, step)
                    self._tb.add_scalar(k.replace("eval/", "eval_by_version/", 1), v, version)
            self._tb.flush()

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()
            self._tb = None


class EvalLog:
    """The eval worker's sink: each evaluated version (and weights: a version published again
    with other weights is evaluated again) once in metrics.jsonl and TensorBoard, however often it
    is handed over (the worker hands every recorded result over again when it starts, so one that
    died between Redis and this file loses no row). Skipped and failed versions have no numbers:
    they are in Redis (`swarl status`) and the worker's log."""

    def __init__(self, run_dir: str | Path, tensorboard: bool = True) -> None:
        self.log = MetricsLog(run_dir, tensorboard=tensorboard)
        self.seen = {(int(r[EVAL_VERSION]), r.get(EVAL_WEIGHTS)) for r in read_metrics(self.log.path)
                     if EVAL_VERSION in r}

    def __call__(self, result: dict[str, Any]) -> None:
        v, weights = int(result["version"]), result.get("weights")
        if result.get("status") != "done" or (v, weights) in self.seen:
            return
        step = result.get("step")
        self.log.log_eval(int(step) if step is not None else v, v, eval_metrics(result), weights)
        self.seen.add((v, weights))

    def close(self) -> None:
        self.log.close()


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
