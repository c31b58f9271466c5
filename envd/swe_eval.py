"""SWE-bench evaluation: a row's eval script, patch checks, grading a test log.

The functions take a row as `envd.rows.validate_row` accepts it (envd validates the row of an
evaluate request first).

Grading follows the official harness (PyPI `swebench` 4.1.x): the test output between the
`>>>>> Start Test Output` / `>>>>> End Test Output` lines is parsed by the repo's log parser
(MAP_REPO_TO_PARSER, or the row's `log_parser`, or pytest's for rows that bring their own
eval_script), and the instance is resolved when every FAIL_TO_PASS and PASS_TO_PASS test
passes (swebench's get_eval_tests_report + get_resolution_status). swebench is imported
lazily: it pulls in docker, datasets, modal and more.
"""

from __future__ import annotations

import re
from types import SimpleNamespace
from typing import Any

from pydantic import BaseModel, Field

from envd.rows import listed_tests

# The harness's framing and failure lines (swebench.harness.constants; copied so that
# building a script or checking a patch does not import swebench).
START_TEST_OUTPUT = ">>>>> Start Test Output"
END_TEST_OUTPUT = ">>>>> End Test Output"
APPLY_PATCH_FAIL = ">>>>> Patch Apply Failed"
HEREDOC = "EOF_114329324912"

# How the harness applies a model patch: strict first, then more forgiving (its run_evaluation).
PATCH_PATH = "/tmp/swarl_model.patch"
APPLY_PATCH_COMMANDS = [
    "git apply --verbose",
    "git apply --verbose --reject",
    "patch --batch --fuzz=5 -p1 -i",
]


class EvalReport(BaseModel):
    resolved: bool = Field(False, description="Every FAIL_TO_PASS and PASS_TO_PASS test passed.")
    tests_status: dict[str, str] = Field(default_factory=dict,
                                         description="Every test the parser found: id → PASSED/FAILED/SKIPPED/ERROR/XFAIL.")
    fail_to_pass: dict[str, str] = Field(default_factory=dict,
                                         description="FAIL_TO_PASS tests → status (MISSING when absent from the log).")
    pass_to_pass: dict[str, str] = Field(default_factory=dict,
                                         description="PASS_TO_PASS tests → status (MISSING when absent from the log).")
    error: str = Field("", description="Why grading could not run (patch failed, no test output markers, ...).")


def eval_script_for(inst: dict[str, Any]) -> str:
    """The row's own eval_script, else the official harness's: exactly what swebench 4.1's
    `make_test_spec(instance).eval_script` gives, built from the same make_eval_script_list
    call but without make_test_spec's environment script, which downloads requirement files
    for some repos (django, flask, matplotlib, pylint, xarray) and so fails offline."""
    if inst.get("eval_script"):
        return str(inst["eval_script"])
    from swebench.harness.constants import MAP_REPO_VERSION_TO_SPECS
    from swebench.harness.test_spec.create_scripts import make_eval_script_list

    specs = MAP_REPO_VERSION_TO_SPECS.get(inst["repo"])
    if specs is None:
        raise ValueError(f"repo: {inst['repo']!r} is unknown to the swebench harness; "
                         "the row must carry its own eval_script")
    if inst["version"] not in specs:
        raise ValueError(f"version: {inst['version']!r} is unknown to the swebench harness for {inst['repo']}")
    try:
        # make_test_spec's arguments: env "testbed", repo at /testbed.
        lines = make_eval_script_list(inst, specs[inst["version"]], "testbed", "/testbed",
                                      inst["base_commit"], inst["test_patch"])
    except Exception as e:
        raise ValueError(f"instance: the swebench harness could not build the eval script "
                         f"for {inst['instance_id']}: {type(e).__name__}: {e}") from e
    # TestSpec.eval_script's framing.
    return "\n".join(["#!/bin/bash", "set -uxo pipefail", *lines]) + "\n"


def check_patch(patch: str | None) -> str | None:
    """None if `patch` looks like a usable git diff, else the reason it is not."""
    if patch is None or not patch.strip():
        return "empty patch"
    if "diff --git" not in patch:
        return "not a git diff: no `diff --git` header"
    if not re.search(r"^--- (a/|/dev/null)", patch, re.M) or not re.search(r"^\+\+\+ (b/|/dev/null)", patch, re.M):
        return "not a git diff: no `--- a/` / `+++ b/` file headers"
    return None


def apply_patch_script(patch: str, path: str = PATCH_PATH, cwd: str = "/testbed") -> str:
    """Bash that writes `patch` to `path` and applies it the way the harness does (three
    attempts); prints APPLY_PATCH_FAIL and exits 1 when none applies."""
    body = patch if patch.endswith("\n") else patch + "\n"
    attempts = " || ".join(f"{cmd} {path}" for cmd in APPLY_PATCH_COMMANDS)
    return (f"cd {cwd}\ncat > {path} <<'{HEREDOC}'\n{body}{HEREDOC}\n"
            f"if ! ( {attempts} ); then echo '{APPLY_PATCH_FAIL}'; exit 1; fi\n")


def _parser_for(inst: dict[str, Any]):
    from swebench.harness.log_parsers import MAP_REPO_TO_PARSER
    from swebench.harness.log_parsers import python as py_parsers

    name = inst.get("log_parser")
    if name:
        fn = getattr(py_parsers, f"parse_log_{name}", None)
        if fn is None:
            raise ValueError(f"log_parser: unknown parser {name!r} (swebench has parse_log_<name> for "
                             "pytest, pytest_v2, pytest_options, django, sympy, matplotlib, ...)")
        return fn
    if inst["repo"] in MAP_REPO_TO_PARSER:
        return MAP_REPO_TO_PARSER[inst["repo"]]
    if inst.get("eval_script"):
        return py_parsers.parse_log_pytest
    raise ValueError(f"repo: no log parser known for {inst['repo']!r}; set the row's log_parser")


def grade(inst: dict[str, Any], log: str) -> EvalReport:
    """Grade the output of the eval script (`log`) against the row, SWE-bench style."""
    from swebench.harness.constants import (
        FAIL_ONLY_REPOS,
        FAIL_TO_PASS,
        PASS_TO_PASS,
        RESET_FAILED,
        TESTS_ERROR,
        TESTS_TIMEOUT,
        EvalType,
        ResolvedStatus,
    )
    from swebench.harness.grading import get_eval_tests_report, get_resolution_status

    f2p, p2p = listed_tests(inst, "FAIL_TO_PASS"), listed_tests(inst, "PASS_TO_PASS")
    missing = EvalReport(fail_to_pass=dict.fromkeys(f2p, "MISSING"), pass_to_pass=dict.fromkeys(p2p, "MISSING"))
    parser = _parser_for(inst)
    for bad in (APPLY_PATCH_FAIL, RESET_FAILED, TESTS_ERROR, TESTS_TIMEOUT):
        if bad in log:
            return missing.model_copy(update={"error": f"harness reported {bad.strip('> ')!r}"})
    if START_TEST_OUTPUT not in log or END_TEST_OUTPUT not in log:
        return missing.model_copy(update={"error": "no test output: the log lacks the harness's "
                                                   f"{START_TEST_OUTPUT!r} / {END_TEST_OUTPUT!r} lines"})
    # Parsers only read instance_id from the spec; a full TestSpec needs a known repo.
    spec = SimpleNamespace(instance_id=inst["instance_id"], repo=inst["repo"], version=inst.get("version"),
                           FAIL_TO_PASS=f2p, PASS_TO_PASS=p2p)
    section = log.split(START_TEST_OUTPUT, 1)[1].split(END_TEST_OUTPUT, 1)[0]
    status = parser(section, spec) or parser(log, spec)  # the harness's fallback, as in get_logs_eval
    eval_type = EvalType.FAIL_ONLY if inst["repo"] in FAIL_ONLY_REPOS else EvalType.PASS_AND_FAIL
    report = get_eval_tests_report(status, {FAIL_TO_PASS: f2p, PASS_TO_PASS: p2p}, eval_type=eval_type)
    resolved = get_resolution_status(report) == ResolvedStatus.FULL.value
    return EvalReport(
        resolved=resolved,
        tests_status=dict(status),
        fail_to_pass={t: status.get(t, "MISSING") for t in f2p},
        pass_to_pass={t: status.get(t, "MISSING") for t in p2p},
        error="" if status else "the log parser found no test results",
    )
