"""R2E-Gym (R2E-Gym/R2E-Gym-Lite, -Subset, -V1): commits of real repositories turned into tasks,
graded by comparing the whole test run with its expected outcome.

Rows (the dataset cards): repo_name (`pandas`, `numpy`, ...), docker_image (one image per
commit, the repository at /testbed with `run_tests.sh` and the hidden tests `r2e_tests/`),
commit_hash, problem_statement, expected_output_json (a JSON object: test id -> PASSED / FAILED
/ ...), and metadata (parsed_commit_content, execution_result_content, modified_files,
relevant_files, prompt, counts). No instance_id, owner/name repo nor FAIL_TO_PASS. Shape: the row
has `docker_image` or `expected_output_json`.

How swarl maps it:
- instance_id `r2e-gym__<repo_name>-<commit_hash>` and repo `r2e-gym/<repo_name>` when the row
  has none; FAIL_TO_PASS: the tests expected to pass (so the tamper rules and the referee guard
  their files), PASS_TO_PASS empty, when the row has none;
- image: docker_image;
- start state: `setup_script` moves run_tests.sh and r2e_tests/ out of /testbed to /root, as
  R2E-Gym's runtime does, so the agent does not see the tests;
- test command: `bash run_tests.sh` (from /root, else /testbed) in /testbed with r2e_tests put
  back, between the harness's output markers;
- log parser: pytest's -rA lines, test ids cut at ` - `, colours stripped (R2E-Gym's
  parse_log_pytest + decolor_dict_keys);
- resolved: as R2E-Gym's _calculate_reward_r2e: the parsed results equal expected_output_json,
  the same number of tests and every test with its expected status (a test expected to fail
  must still fail).
"""

from __future__ import annotations

import json
import re
from typing import Annotated, Any, ClassVar

from pydantic import AfterValidator

from swe import grading
from swe.adapters.base import Adapter, register
from swe.grading import END_TEST_OUTPUT, START_TEST_OUTPUT, EvalReport
from swe.schema import InstanceId, NonEmptyStr, Repo, RowModel, TestIds

_NAME = re.compile(r"[^A-Za-z0-9_.\-]")


def expected_outputs(text: str) -> dict[str, str]:
    """expected_output_json as test id (cut at ` - `) -> status."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"not a JSON object of test id -> status: {e.msg}") from None
    if not isinstance(value, dict) or not value:
        raise ValueError("must be a non-empty JSON object of test id -> status")
    bad = [k for k, v in value.items() if not isinstance(v, str) or not k]
    if bad:
        raise ValueError(f"test {bad[0]!r}: status must be a string")
    return {_key(k): v for k, v in value.items()}


def _expected(v: str) -> str:
    expected_outputs(v)
    return v


def _key(test: str) -> str:
    return grading.decolor(test).split(" - ")[0].strip()


class R2EGymRow(RowModel):
    repo_name: NonEmptyStr
    docker_image: NonEmptyStr
    commit_hash: NonEmptyStr
    problem_statement: NonEmptyStr
    expected_output_json: Annotated[str, AfterValidator(_expected)]
    instance_id: InstanceId
    repo: Repo
    FAIL_TO_PASS: TestIds
    PASS_TO_PASS: TestIds


def parse_r2e(log: str, spec: Any = None) -> dict[str, str]:
    return {_key(k): v for k, v in grading.parse_pytest(log, spec, xpass_passes=False).items()}


@register
class R2EGym(Adapter):
    family = "r2e-gym"
    aliases = ("r2egym", "r2e")
    hub_datasets: ClassVar[dict[str, str]] = {"R2E-Gym/R2E-Gym-Lite": "train", "R2E-Gym/R2E-Gym-Subset": "train",
                                              "R2E-Gym/R2E-Gym-V1": "train"}
    model = R2EGymRow
    description = ("R2E-Gym: the row's docker_image, its run_tests.sh, resolved when every test's "
                   "status equals expected_output_json")

    def matches(self, row: dict[str, Any]) -> bool:
        return ("docker_image" in row or "expected_output_json" in row) and \
            not str(row.get("repo") or "").startswith("swarl-tasks/")

    def normalise(self, row: dict[str, Any]) -> dict[str, Any]:
        name, commit = row.get("repo_name"), row.get("commit_hash")
        if isinstance(name, str) and name.strip():
            if "instance_id" not in row and isinstance(commit, str) and commit.strip():
                row["instance_id"] = f"r2e-gym__{_NAME.sub('_', name)}-{_NAME.sub('_', commit)}"
            row.setdefault("repo", f"r2e-gym/{_NAME.sub('_', name)}")
        text = row.get("expected_output_json")
        if "FAIL_TO_PASS" not in row and isinstance(text, str):
            try:
                row["FAIL_TO_PASS"] = [t for t, s in expected_outputs(text).items() if s == "PASSED"]
            except ValueError:
                pass  # the model names expected_output_json
        if "FAIL_TO_PASS" in row:
            row.setdefault("PASS_TO_PASS", [])
        return row

    def image_name(self, row: dict[str, Any]) -> str:
        return str(row["docker_image"])

    def setup_script(self, row: dict[str, Any]) -> str:
        # were the test files tracked, their removal would sit in the agent's diff and the patch
        # would not apply after this same script in the grading container: committed away then
        return ("cd /testbed\n"
                "if [ -f run_tests.sh ]; then mv run_tests.sh /root/run_tests.sh; fi\n"
                "if [ -d r2e_tests ]; then rm -rf /root/r2e_tests && mv r2e_tests /root/r2e_tests; fi\n"
                "if [ -n \"$(git status --porcelain -- run_tests.sh r2e_tests 2>/dev/null)\" ]; then\n"
                "  git add -u && git -c user.name=swarl -c user.email=swarl@localhost "
                "commit -q --no-verify -m 'test files moved out'\nfi\n")

    def eval_script(self, row: dict[str, Any]) -> str:
        return "\n".join([
            "#!/bin/bash", "set -uxo pipefail", "export PATH=/root/.venv/bin:/root/.local/bin:$PATH",
            "cd /testbed",
            "if [ -d /root/r2e_tests ]; then rm -rf r2e_tests && cp -r /root/r2e_tests r2e_tests; fi",
            "swarl_rt=/root/run_tests.sh; [ -f \"$swarl_rt\" ] || swarl_rt=/testbed/run_tests.sh",
            f": '{START_TEST_OUTPUT}'", 'bash "$swarl_rt"', f": '{END_TEST_OUTPUT}'"]) + "\n"

    def grade(self, row: dict[str, Any], log: str, nonce: str | None = None) -> EvalReport:
        expected = expected_outputs(row["expected_output_json"])
        missing = EvalReport(fail_to_pass=dict.fromkeys(expected, "MISSING"))
        section = grading.test_section(log, nonce)
        if grading.APPLY_PATCH_FAIL in log:
            return missing.model_copy(update={"error": "harness reported 'Patch Apply Failed'"})
        if section is None:
            return missing.model_copy(update={"error": "no test output: the log lacks the harness's "
                                                       f"{START_TEST_OUTPUT!r} / {END_TEST_OUTPUT!r} lines"})
        status = parse_r2e(section)
        forged = grading.forged_results(parse_r2e, section, None, list(expected))
        if nonce and (START_TEST_OUTPUT in section or END_TEST_OUTPUT in section):
            forged.append("the test output holds the harness's marker lines (printed by the code under test)")
        same = len(status) == len(expected) and all(status.get(t) == s for t, s in expected.items())
        return EvalReport(resolved=same and not forged, forged=forged, tests_status=status,
                          fail_to_pass={t: status.get(t, "MISSING") for t in expected},
                          error="" if status else "the log parser found no test results")
