"""swe.grading: eval scripts (the row's own or the official harness's), patch checks and
SWE-bench grading with the harness's log parsers (row validation: test_rows.py)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from swe.grading import (
    APPLY_PATCH_FAIL,
    END_TEST_OUTPUT,
    START_TEST_OUTPUT,
    EvalReport,
    check_patch,
    eval_script_for,
    grade,
)
from swe.rows import listed_tests
from swe.tasks import load_tasks

LITE = Path(__file__).resolve().parents[2] / ".." / "shared" / "data" / "swe-bench-lite-test.json"


@pytest.fixture(scope="module")
def lite_rows() -> list[dict[str, Any]]:
    if not LITE.is_file():
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):  # CI provides the data: absent is a failure
            pytest.fail(f"{LITE} is absent: CI must provide the SWE-bench Lite rows in <repo>/../shared/data")
        pytest.skip(f"{LITE} is absent")
    return json.loads(LITE.read_text())


def _row(**over: Any) -> dict[str, Any]:
    row = {
        "repo": "sympy/sympy", "instance_id": "sympy__sympy-1", "base_commit": "abc123",
        "problem_statement": "x",
        "patch": "", "test_patch": "diff --git a/x b/x\n", "version": "1.7",
        "FAIL_TO_PASS": '["test_a"]', "PASS_TO_PASS": '["test_b", "test_c"]',
    }
    row.update(over)
    return row


# --- check_patch ------------------------------------------------------------------------------

def test_check_patch() -> None:
    good = load_tasks()[0]["patch"]
    assert check_patch(good) is None
    assert check_patch("") == "empty patch"
    assert check_patch("  \n") == "empty patch"
    assert check_patch(None) == "empty patch"
    assert "no `diff --git`" in check_patch("--- a/x\n+++ b/x\n@@ -1 +1 @@\n-a\n+b\n")
    assert "file headers" in check_patch("diff --git a/x b/x\n@@ -1 +1 @@\n-a\n+b\n")
    new_file = "diff --git a/n b/n\nnew file mode 100644\n--- /dev/null\n+++ b/n\n@@ -0,0 +1 @@\n+x\n"
    assert check_patch(new_file) is None


# --- eval scripts -----------------------------------------------------------------------------

def test_bundled_rows_use_their_own_eval_script() -> None:
    for row in load_tasks():
        assert eval_script_for(row) == row["eval_script"]


def test_unknown_repo_without_eval_script_is_refused() -> None:
    with pytest.raises(ValueError, match=r"^repo: 'acme/widgets' is unknown"):
        eval_script_for(_row(repo="acme/widgets"))
    with pytest.raises(ValueError, match=r"^version: '0.0.1' is unknown"):
        eval_script_for(_row(version="0.0.1"))


def test_harness_eval_script_for_real_swe_bench_lite_rows(lite_rows: list[dict[str, Any]]) -> None:
    for row in lite_rows:
        script = eval_script_for(row)
        assert script.startswith("#!/bin/bash\nset -uxo pipefail\n"), row["instance_id"]
        assert "conda activate testbed" in script and "cd /testbed" in script
        assert f"git checkout {row['base_commit']}" in script
        assert row["test_patch"] in script
        assert f": '{START_TEST_OUTPUT}'" in script and f": '{END_TEST_OUTPUT}'" in script


# Repos whose make_test_spec needs no network (its environment script downloads nothing).
OFFLINE_REPOS = {"psf/requests", "pytest-dev/pytest", "sphinx-doc/sphinx", "astropy/astropy",
                 "mwaskom/seaborn", "scikit-learn/scikit-learn"}


def test_eval_script_equals_make_test_spec(lite_rows: list[dict[str, Any]]) -> None:
    from swebench.harness.test_spec.test_spec import make_test_spec

    rows = [r for r in lite_rows if r["repo"] in OFFLINE_REPOS]
    assert len(rows) > 20
    for row in rows:
        assert eval_script_for(row) == make_test_spec(row).eval_script, row["instance_id"]


# --- grading ----------------------------------------------------------------------------------

def _status_line(repo: str, test: str, ok: bool) -> str:
    """A test result line the way each repo's runner prints it."""
    if repo == "django/django":
        return f"{test} ... {'ok' if ok else 'FAIL'}"
    if repo == "sympy/sympy":
        return f"{test} {'ok' if ok else 'F'}"
    return f"{'PASSED' if ok else 'FAILED'} {test}"


def _log(repo: str, passing: list[str], failing: list[str] = ()) -> str:  # type: ignore[assignment]
    body = [_status_line(repo, t, True) for t in passing] + [_status_line(repo, t, False) for t in failing]
    return "\n".join(["+ git apply -v -", "Applied patch cleanly.", f"+ : '{START_TEST_OUTPUT}'",
                      *body, f"+ : '{END_TEST_OUTPUT}'", "+ git checkout abc tests"]) + "\n"


def test_grade_real_rows_with_their_repo_parser(lite_rows: list[dict[str, Any]]) -> None:
    for row in lite_rows:
        tests = listed_tests(row, "FAIL_TO_PASS") + listed_tests(row, "PASS_TO_PASS")
        ok = grade(row, _log(row["repo"], tests))
        assert ok.resolved and not ok.error, row["instance_id"]
        first = listed_tests(row, "FAIL_TO_PASS")[0]
        bad = grade(row, _log(row["repo"], [t for t in tests if t != first], [first]))
        assert not bad.resolved and bad.fail_to_pass[first] in ("FAILED", "ERROR"), row["instance_id"]


def test_grade_bundled_task() -> None:
    row = load_tasks()[0]
    f2p, p2p = listed_tests(row, "FAIL_TO_PASS"), listed_tests(row, "PASS_TO_PASS")
    ok = grade(row, _log(row["repo"], f2p + p2p))
    assert ok == EvalReport(resolved=True, tests_status=dict.fromkeys(f2p + p2p, "PASSED"),
                            fail_to_pass=dict.fromkeys(f2p, "PASSED"), pass_to_pass=dict.fromkeys(p2p, "PASSED"))
    # A broken PASS_TO_PASS test unresolves it; a test missing from the log counts as failed.
    broken = grade(row, _log(row["repo"], f2p + p2p[1:], p2p[:1]))
    assert not broken.resolved and broken.pass_to_pass[p2p[0]] == "FAILED"
    missing = grade(row, _log(row["repo"], p2p))
    assert not missing.resolved and missing.fail_to_pass[f2p[0]] == "MISSING"


def test_grade_only_reads_between_the_markers() -> None:
    row = load_tasks()[0]
    f2p, p2p = listed_tests(row, "FAIL_TO_PASS"), listed_tests(row, "PASS_TO_PASS")
    # A "PASSED" line printed outside the framed section (e.g. by the agent's patch) is ignored.
    log = _log(row["repo"], p2p, f2p)
    log = "PASSED " + f2p[0] + "\n" + log
    assert not grade(row, log).resolved


def test_grade_errors() -> None:
    row = load_tasks()[0]
    nomark = grade(row, "PASSED tests/test_items.py::test_line_total\n")
    assert not nomark.resolved and "lacks the harness" in nomark.error
    assert set(nomark.fail_to_pass.values()) == {"MISSING"}
    failed_apply = grade(row, f"error: patch failed\n{APPLY_PATCH_FAIL}\n")
    assert not failed_apply.resolved and "Patch Apply Failed" in failed_apply.error
    empty_section = grade(row, _log(row["repo"], []))
    assert not empty_section.resolved and "no test results" in empty_section.error
    with pytest.raises(ValueError, match=r"^log_parser: unknown parser"):
        grade({**row, "log_parser": "nosuch"}, _log(row["repo"], []))


def test_grade_uses_the_row_log_parser_or_pytest_for_own_scripts() -> None:
    row = _row(repo="acme/widgets", eval_script="pytest", FAIL_TO_PASS=["t::a"], PASS_TO_PASS=[])
    assert grade(row, _log("x", ["t::a"])).resolved  # pytest parser by default
    django_style = {**row, "log_parser": "django"}
    assert grade(django_style, _log("django/django", ["t::a"])).resolved
    with pytest.raises(ValueError, match=r"^repo: no log parser"):
        grade({k: v for k, v in row.items() if k != "eval_script"} | {"test_patch": "x", "version": "1"},
              _log("x", ["t::a"]))
