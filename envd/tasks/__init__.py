"""The bundled SWE task suite: SWE-bench-format rows (envd/tasks/tasks.jsonl) generated from
small repositories (envd/tasks/repos/<repo>/) and their bug specs (envd/tasks/repos/<repo>.yaml)."""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import Any

TASKS_JSONL = Path(__file__).resolve().parent / "tasks.jsonl"
SPLITS = ("all", "train", "heldout")


@lru_cache(maxsize=1)
def _rows() -> tuple[str, ...]:
    return tuple(line for line in TASKS_JSONL.read_text().splitlines() if line.strip())


def load_tasks(split: str = "all") -> list[dict[str, Any]]:
    """The bundled tasks as SWE-bench-format rows (FAIL_TO_PASS / PASS_TO_PASS as JSON
    strings, as in SWE-bench) plus eval_script, image_name, log_parser and swarl_* fields.
    `split`: "all", "train" (3 per bug family) or "heldout" (1 per family)."""
    if split not in SPLITS:
        raise ValueError(f"split: must be one of {', '.join(SPLITS)}, got {split!r}")
    rows = [json.loads(line) for line in _rows()]
    return [r for r in rows if split == "all" or r["swarl_split"] == split]


def get_task(instance_id: str) -> dict[str, Any]:
    for row in load_tasks():
        if row["instance_id"] == instance_id:
            return row
    raise KeyError(f"instance_id: no bundled task {instance_id!r}")


def task_files(instance_id: str) -> dict[str, str]:
    """The files of the task's repository at its base commit (with the bug)."""
    from envd.tasks.generate import buggy_files
    from envd.tasks.specs import load_specs

    for spec in load_specs():
        if spec.instance_id == instance_id:
            return buggy_files(spec)[0]
    raise KeyError(f"instance_id: no bundled task {instance_id!r}")


__all__ = ["SPLITS", "TASKS_JSONL", "get_task", "load_tasks", "task_files"]
