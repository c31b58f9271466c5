"""SWE-bench (full, Lite, Verified): the official harness's rows, images and grading.

Rows: twelve string fields (repo, instance_id, base_commit, patch, test_patch, problem_statement,
hints_text, created_at, version, FAIL_TO_PASS, PASS_TO_PASS, environment_setup_commit; Verified
adds difficulty), FAIL_TO_PASS / PASS_TO_PASS as JSON-encoded lists. Shape: the row has
`environment_setup_commit` (SWE-Gym's rows have no such column).

- image: `docker.io/swebench/sweb.eval.x86_64.<instance_id, "__" -> "_1776_">:latest`, lower case
  (the harness's instance_image_key);
- test command: the harness's eval script for the row's repo and version (swebench 4.1's
  make_eval_script_list: reset the test files, apply test_patch, run the repo's test_cmd between
  the output markers), or the row's own `eval_script`;
- log parser: the harness's parser for the repo (MAP_REPO_TO_PARSER), or the row's `log_parser`;
- resolved: every FAIL_TO_PASS and PASS_TO_PASS test passes (FAIL_ONLY repos: FAIL_TO_PASS
  only), as the harness's get_eval_tests_report / get_resolution_status decide.
"""

from __future__ import annotations

from typing import Any, ClassVar

from swe import grading
from swe.adapters.base import Adapter, register
from swe.grading import EvalReport
from swe.schema import (
    InstanceId,
    NonEmptyStr,
    Repo,
    RowError,
    RowModel,
    TestIds,
    check_tests_and_scripts,
)

# Needed to build the harness's eval script when the row brings no eval_script of its own.
SCRIPT_FIELDS = ("base_commit", "test_patch", "version")
# The other fields of the format (and swarl's own), strings when present and not null.
OPTIONAL_STR = ("patch", "hints_text", "created_at", "environment_setup_commit", "image_name",
                "difficulty", "log_parser", "data_source")


class SweBenchRow(RowModel):
    instance_id: InstanceId
    problem_statement: NonEmptyStr
    repo: Repo
    FAIL_TO_PASS: TestIds
    PASS_TO_PASS: TestIds
    base_commit: str | None = None
    test_patch: str | None = None
    version: str | None = None
    eval_script: str | None = None
    patch: str | None = None
    hints_text: str | None = None
    created_at: str | None = None
    environment_setup_commit: str | None = None
    image_name: str | None = None
    difficulty: str | None = None
    log_parser: str | None = None
    data_source: str | None = None


class SweBenchFormat(Adapter):
    """The SWE-bench row format and harness; SWE-Gym and swarl's own tasks share them."""

    model = SweBenchRow

    def check(self, row: dict[str, Any]) -> None:
        check_tests_and_scripts(row, ("eval_script",))
        if row.get("eval_script") is not None:
            return
        for fld in SCRIPT_FIELDS:
            if not (row.get(fld) or "").strip():
                raise RowError("missing: required to build the eval script (the row has no "
                               "eval_script)", field=fld)

    def eval_script(self, row: dict[str, Any]) -> str:
        return grading.eval_script_for(row)

    def grade(self, row: dict[str, Any], log: str, nonce: str | None = None) -> EvalReport:
        return grading.grade(row, log, nonce)


def swebench_image(instance_id: str) -> str:
    return f"docker.io/swebench/sweb.eval.x86_64.{instance_id.replace('__', '_1776_')}:latest".lower()


def foreign_shape(row: dict[str, Any]) -> bool:
    """Rows of swarl's bundled suites or of R2E-Gym (their adapters claim them)."""
    return str(row.get("repo") or "").startswith("swarl-tasks/") or \
        "docker_image" in row or "expected_output_json" in row


@register
class SweBench(SweBenchFormat):
    family = "swe-bench"
    aliases = ("swebench", "swe-bench-lite", "swe-bench-verified")
    hub_datasets: ClassVar[dict[str, str]] = {
        "princeton-nlp/SWE-bench": "test", "princeton-nlp/SWE-bench_Lite": "test",
        "princeton-nlp/SWE-bench_Verified": "test", "SWE-bench/SWE-bench": "test",
        "SWE-bench/SWE-bench_Lite": "test", "SWE-bench/SWE-bench_Verified": "test",
    }
    description = ("SWE-bench full/Lite/Verified: the swebench harness's eval script, log parser "
                   "and FAIL_TO_PASS + PASS_TO_PASS resolution")

    def matches(self, row: dict[str, Any]) -> bool:
        return "environment_setup_commit" in row and not foreign_shape(row)

    def image_name(self, row: dict[str, Any]) -> str:
        return str(row.get("image_name") or swebench_image(row["instance_id"]))
