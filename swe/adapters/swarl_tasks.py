"""swarl's own suites (swe/tasks: the hand-written `bundled` suite and the `generated` one).

Rows: SWE-bench's format with repo `swarl-tasks/<name>`, their own `eval_script` (pytest on the
task's test files), `log_parser: pytest` and `swarl_*` fields (family, split, ...). Shape: the
repo starts with `swarl-tasks/`.

- image: `swarl/task.<name>-<n>:latest`, built locally (envd.images, `swarl images build`);
- test command: the row's eval_script; log parser: swebench's pytest parser;
- resolved: SWE-bench's rule (every FAIL_TO_PASS and PASS_TO_PASS test passes).
"""

from __future__ import annotations

from typing import Any

from swe.adapters.base import register
from swe.adapters.swebench import SweBenchFormat
from swe.tasks.specs import REPO_PREFIX, task_image_name


@register
class SwarlTasks(SweBenchFormat):
    family = "swarl"
    aliases = ("swarl-tasks",)
    description = "swarl's bundled and generated suites: their own eval_script, pytest, local images"

    def matches(self, row: dict[str, Any]) -> bool:
        return str(row.get("repo") or "").startswith(f"{REPO_PREFIX}/")

    def image_name(self, row: dict[str, Any]) -> str:
        return str(row.get("image_name") or task_image_name(row["instance_id"]))
