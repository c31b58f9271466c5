"""SWE-bench evaluation: a row's eval script, patch checks, grading a test log.

The functions take a row as `swe.rows.validate_row` accepts it (envd validates the row of an
evaluate request first). `eval_script_for` and `grade` are SWE-bench's semantics, which the
SWE-bench, SWE-Gym and swarl adapters use as they are and SWE-smith's with its own test command;
which one a row gets is its adapter's choice (swe.adapters, swe.harness).

Grading follows the official harness (PyPI `swebench` 4.1.x): the test output between the
`>>>>> Start Test Output` / `>>>>> End Test Output` lines is parsed by the repo's log parser
(MAP_REPO_TO_PARSER, or the row's `log_parser`, or pytest's for rows that bring their own
eval_script), and the instance is resolved when every FAIL_TO_PASS and PASS_TO_PASS test
passes (swebench's get_eval_tests_report + get_resolution_status). swebench is imported
lazily: it pulls in docker, datasets, modal and more.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

from pydantic import BaseModel, Field

from swe.schema import listed_tests

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
    forged: list[str] = Field(default_factory=list,
                              description="Signs the test output imitates the harness: a listed test reported "
                                          "both passed and failed, marker lines printed by the tests.")


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


# Framing a graded run (frame_script): the processes alive when the eval script starts (init,
# the container's main process, this exec's own chain) are noted; right after the test command
# every other process is killed, so nothing the patch started can print after the tests (a
# forged result or end marker). Without xtrace: the loops are noise.
NOTE_PROCESSES = 'swarl_pre=" $(cd /proc && echo [0-9]*) "'
REAP_OTHERS = """{ set +x; } 2>/dev/null
for swarl_d in /proc/[0-9]*; do
  swarl_q=${swarl_d#/proc/}
  case "$swarl_pre" in *" $swarl_q "*) ;; *) kill -9 "$swarl_q" 2>/dev/null ;; esac
done
"""


def frame_script(script: str) -> str:
    """The eval script as envd runs it for grading: cut at its end-of-test-output marker (what
    follows only restores the test files of a container about to be destroyed), with
    NOTE_PROCESSES first and REAP_OTHERS last. envd frames the output itself (frame_log), so the
    script prints no marker the grader trusts."""
    lines = script.splitlines()
    end = next((i for i, line in enumerate(lines) if END_TEST_OUTPUT in line), len(lines))
    head = 1 if lines and lines[0].startswith("#!") else 0
    return "\n".join([*lines[:head], NOTE_PROCESSES, *lines[head:end], REAP_OTHERS]) + "\n"


def frame_log(output: str, nonce: str) -> str:
    """The output of a framed script with envd's own markers, which carry `nonce` (never shown
    to the container): the test output starts after the first start marker line (printed before
    any test runs, so it cannot be forged) and ends with the output; marker lines printed by
    the tests themselves are plain text inside it."""
    head, sep, rest = output.partition(START_TEST_OUTPUT)
    if not sep:
        return output
    _, nl, tests = rest.partition("\n")
    return f"{head}{START_TEST_OUTPUT} {nonce}\n{tests if nl else ''}\n{END_TEST_OUTPUT} {nonce}\n"


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


_STATUSES = "PASSED|FAILED|SKIPPED|ERROR|XFAIL|XPASS"
_VERBOSE = re.compile(rf"^(\S+::\S.*?)\s+({_STATUSES})\b")
_SUMMARY = re.compile(rf"^({_STATUSES})\s+(\S+::\S.*?)(?:\s+-\s.*)?$")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def decolor(text: str) -> str:
    """`text` without ANSI colour codes."""
    return _ANSI.sub("", text)


def parse_pytest(log: str, spec: Any = None, *, xpass_passes: bool = True) -> dict[str, str]:
    """Test id -> status from pytest's verbose lines (`path::test STATUS`) and its -rA summary
    lines (`STATUS path::test - message`), colours stripped; XPASS counts as PASSED unless
    `xpass_passes` is False. A parser of swebench's signature (log, spec)."""
    out: dict[str, str] = {}
    for raw in log.splitlines():
        line = decolor(raw).strip()
        m = _VERBOSE.match(line)
        test, status = (m.group(1), m.group(2)) if m else (None, None)
        if m is None and (m := _SUMMARY.match(line)):
            test, status = m.group(2), m.group(1)
        if test and status:
            out[test.strip()] = "PASSED" if status == "XPASS" and xpass_passes else status
    return out


def test_section(log: str, nonce: str | None = None) -> str | None:
    """The test output between the start and end markers (with `nonce`: envd's own), else None."""
    start, end = (f"{START_TEST_OUTPUT} {nonce}", f"{END_TEST_OUTPUT} {nonce}") if nonce else \
        (START_TEST_OUTPUT, END_TEST_OUTPUT)
    if start not in log or end not in log:
        return None
    return log.split(start, 1)[1].split(end, 1)[0]


_GOOD, _BAD = {"PASSED", "XFAIL"}, {"FAILED", "ERROR"}


def forged_results(parser: Any, section: str, spec: Any, tests: list[str]) -> list[str]:
    """Listed tests the output reports both passed and failed: a runner reports each test once,
    so the other line was printed by the code under test (the parser keeps the last one)."""
    seen: dict[str, set[str]] = {}
    wanted = set(tests)
    for line in section.splitlines():
        if not any(t in line for t in wanted):
            continue
        for test, status in (parser(line, spec) or {}).items():
            if test in wanted:
                seen.setdefault(test, set()).add(status)
    return [f"{t}: reported both {'/'.join(sorted(v & _GOOD))} and {'/'.join(sorted(v & _BAD))}"
            for t, v in sorted(seen.items()) if v & _GOOD and v & _BAD]


def grade(inst: dict[str, Any], log: str, nonce: str | None = None, *,
          parser: Callable[[str, Any], dict[str, str]] | None = None) -> EvalReport:
    """Grade the output of the eval script (`log`) against the row, SWE-bench style. With
    `nonce`, only markers carrying it (frame_log's) delimit the test output. `parser` (a
    swebench-style `parse(log, spec)`) replaces the one the row's repo / log_parser picks."""
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
    parser = parser or _parser_for(inst)
    for bad in (APPLY_PATCH_FAIL, RESET_FAILED, TESTS_ERROR, TESTS_TIMEOUT):
        if bad in log:
            return missing.model_copy(update={"error": f"harness reported {bad.strip('> ')!r}"})
    start, end = (f"{START_TEST_OUTPUT} {nonce}", f"{END_TEST_OUTPUT} {nonce}") if nonce else \
        (START_TEST_OUTPUT, END_TEST_OUTPUT)
    if start not in log or end not in log:
        return missing.model_copy(update={"error": "no test output: the log lacks the harness's "
                                                   f"{START_TEST_OUTPUT!r} / {END_TEST_OUTPUT!r} lines"})
    # Parsers only read instance_id from the spec; a full TestSpec needs a known repo.
    spec = SimpleNamespace(instance_id=inst["instance_id"], repo=inst["repo"], version=inst.get("version"),
                           FAIL_TO_PASS=f2p, PASS_TO_PASS=p2p)
    section = log.split(start, 1)[1].split(end, 1)[0]
    status = parser(section, spec) or parser(log, spec)  # the harness's fallback, as in get_logs_eval
    forged = forged_results(parser, section, spec, f2p + p2p)
    if nonce and (START_TEST_OUTPUT in section or END_TEST_OUTPUT in section):
        forged.append("the test output holds the harness's marker lines (printed by the code under test)")
    eval_type = EvalType.FAIL_ONLY if inst["repo"] in FAIL_ONLY_REPOS else EvalType.PASS_AND_FAIL
    report = get_eval_tests_report(status, {FAIL_TO_PASS: f2p, PASS_TO_PASS: p2p}, eval_type=eval_type)
    resolved = get_resolution_status(report) == ResolvedStatus.FULL.value and not forged
    return EvalReport(
        resolved=resolved, forged=forged,
        tests_status=dict(status),
        fail_to_pass={t: status.get(t, "MISSING") for t in f2p},
        pass_to_pass={t: status.get(t, "MISSING") for t in p2p},
        error="" if status else "the log parser found no test results",
    )
