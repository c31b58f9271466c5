"""The bundled SWE task suites, as SWE-bench-format rows:
- `bundled` (swe/tasks/tasks.jsonl): 32 hand-written bugs in 8 small repositories
  (swe/tasks/repos/<repo>/ and their bug specs swe/tasks/repos/<repo>.yaml);
- `generated` (swe/tasks/generated.jsonl): instances that must be read, one repository each,
  names and lines drawn per instance (swe/tasks/generated.py) — the demo's suite."""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import Any

_DIR = Path(__file__).resolve().parent
TASKS_JSONL = _DIR / "tasks.jsonl"
SUITES = {"bundled": TASKS_JSONL, "generated": _DIR / "generated.jsonl"}
SPLITS = ("all", "train", "heldout")
GENERATED_SPLITS = ("all", "train", "heldout", "heldout_family")


@lru_cache(maxsize=2)
def _rows(suite: str) -> tuple[str, ...]:
    return tuple(line for line in SUITES[suite].read_text().splitlines() if line.strip())


def load_tasks(split: str = "all", suite: str = "bundled") -> list[dict[str, Any]]:
    """A suite's tasks as SWE-bench-format rows (FAIL_TO_PASS / PASS_TO_PASS as JSON
    strings, as in SWE-bench) plus eval_script, image_name, log_parser and swarl_* fields.
    `split` for `bundled`: "all", "train" (3 per bug family) or "heldout" (1 per family); for
    `generated` also "heldout_family" (bug families training never sees)."""
    if suite not in SUITES:
        raise ValueError(f"suite: must be one of {', '.join(SUITES)}, got {suite!r}")
    splits = GENERATED_SPLITS if suite == "generated" else SPLITS
    if split not in splits:
        raise ValueError(f"split: must be one of {', '.join(splits)} for suite {suite}, got {split!r}")
    rows = [json.loads(line) for line in _rows(suite)]
    return [r for r in rows if split == "all" or r["swarl_split"] == split]


def get_task(instance_id: str) -> dict[str, Any]:
    for suite in SUITES:
        for row in load_tasks(suite=suite):
            if row["instance_id"] == instance_id:
                return row
    raise KeyError(f"instance_id: no bundled task {instance_id!r}")


def task_files(instance_id: str) -> dict[str, str]:
    """The files of the task's repository at its base commit (with the bug)."""
    from swe.tasks.generate import buggy_files
    from swe.tasks.generated import instance_files
    from swe.tasks.specs import load_specs

    for spec in load_specs():
        if spec.instance_id == instance_id:
            return buggy_files(spec)[0]
    files = instance_files(instance_id)
    if files is not None:
        return files
    raise KeyError(f"instance_id: no bundled task {instance_id!r}")


__all__ = ["GENERATED_SPLITS", "SPLITS", "SUITES", "TASKS_JSONL", "get_task", "load_tasks", "task_files"]
