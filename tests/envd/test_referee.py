"""envd.referee and envd.verdict without Docker: planning a refereed run (the runner, canaries,
the script in one or two parts) and judging the referee's signed records, on the bundled tasks
and the 300 SWE-bench Lite rows; the in-container referee's canary writing and record reading.
The same code in real containers: tests/envd/test_red_team.py, test_referee_runners.py."""

from __future__ import annotations

import ast
import base64
import hashlib
import hmac
import json
import os
import random
import subprocess
import sys
import zlib
from typing import Any

import pytest
from fixtures_tasks import read_lite

from envd.grader import GRADER_DIR, GRADER_FILES
from envd.referee import (
    STARTED,
    RefereePlan,
    added_lines,
    infra_changes,
    parse_command,
    plan,
    runs_project_code,
    strip_signed,
)
from envd.verdict import judge, signed_body
from swe.grading import eval_script_for, frame_script
from swe.rows import listed_tests
from swe.tasks import load_tasks

TASK = load_tasks("all")[0]
F2P = listed_tests(TASK, "FAIL_TO_PASS")
P2P = listed_tests(TASK, "PASS_TO_PASS")


def _plan(row: dict[str, Any] = TASK, seed: int = 0) -> RefereePlan:
    p = plan(row, row["patch"], eval_script_for(row), random.Random(seed))
    assert p is not None
    return p


def _test(tid: str, exc: str | None = None, runner: str = "pytest") -> list[dict[str, Any]]:
    """One test's records as the runner's observer sends them (exc: what the test raised)."""
    if runner == "unittest":
        return [{"e": "call", "id": tid, "exc": exc},
                {"e": "case", "id": tid, "ids": [tid], "outcome": "failure" if exc else "success", "exc": exc}]
    if runner == "sympy":
        return [{"e": "call", "id": tid, "exc": exc}]
    phase = {"e": "phase", "id": tid, "ids": [tid], "xfail": False, "fn": True}
    return [{**phase, "when": "setup", "pre": None, "post": None, "report": "passed"},
            {"e": "call", "id": tid, "exc": exc},
            {**phase, "when": "call", "pre": exc, "post": exc, "report": "failed" if exc else "passed"},
            {**phase, "when": "teardown", "pre": None, "post": None, "report": "passed"}]


def _number(recs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    for i, r in enumerate(recs, 1):
        r["n"] = i
    return recs


def _run(p: RefereePlan, tests: dict[str, str | None], exit_code: int = 1, finish: int | None = 1,
         select: list[str] | None = None, **extra: Any) -> dict[str, Any]:
    """One run's records: every listed test as given (an exception name or None), the canaries as
    they should be."""
    canaries = {c.test_id: (None if c.must_pass else "builtins.AssertionError") for c in p.canaries}
    wanted = {**tests, **canaries} if select is None else {t: {**tests, **canaries}[t] for t in select}
    recs: list[dict[str, Any]] = [{"e": "hello"}]
    if p.runner == "pytest":
        recs.append({"e": "collected", "ids": [[t] for t in wanted]})
    for tid, exc in wanted.items():
        recs += _test(tid, exc, p.runner)
    if finish is not None:
        recs.append({"e": "finish", "exitstatus": finish})
    return {"records": _number(recs), "exit": exit_code, "bad": 0, "late": 0, "select": select, **extra}


def _output(p: RefereePlan, runs: list[dict[str, Any]], key: bytes | None = None, times: int = 1,
            **body: Any) -> str:
    payload = base64.b64encode(zlib.compress(json.dumps({"runs": runs, "guarded": True, **body}).encode()))
    sig = hmac.new(key or p.key, payload, hashlib.sha256).hexdigest()
    return "+ : '>>>>> Start Test Output'" + STARTED + "PASSED x\n" + \
        f"\n@@swarl-referee {sig} {payload.decode()}\n" * times


def _honest(p: RefereePlan, f2p_exc: str | None = None) -> list[dict[str, Any]]:
    tests = {**dict.fromkeys(P2P), **dict.fromkeys(F2P, f2p_exc)}
    runs = [_run(p, tests)]
    if f2p_exc is None:
        runs += [_run(p, tests, select=[t, *extra]) for t, extra in p.isolate.items()]
    return runs


def _kinds(p: RefereePlan, runs: list[dict[str, Any]], log_status: dict[str, str] | None = None,
           row: dict[str, Any] = TASK, **kw: Any) -> set[str]:
    """The kinds of tampering judged in these runs (kw: _output's)."""
    v = judge(p, _output(p, runs, **kw), row, log_status or dict.fromkeys(F2P + P2P, "PASSED"))
    return {t.kind for t in v.tampers}


def test_the_plan_hides_canaries_among_the_row_tests() -> None:
    p = _plan()
    assert p.runner == "pytest" and p.command.kind == "module" and p.command.python == "python3"
    assert p.command.rest == "-rA -p no:cacheprovider tests/test_items.py"
    assert {c.path for c in p.canaries} == {"tests/test_items.py"}
    assert sorted(c.must_pass for c in p.canaries) == [False, False, True, True]
    names = [c.name for c in p.canaries]
    assert all(n.startswith("test_") and "canary" not in n for n in names) and len(set(names)) == 4
    assert not {c.test_id for c in p.canaries} & set(F2P + P2P)
    assert all(c.sources[0] == F2P[0].split("::")[1] for c in p.canaries)  # they copy the row's FAIL_TO_PASS test
    assert set(p.isolate) == set(F2P) and all(len(v) == 2 for v in p.isolate.values())
    assert p.watch == {"invoicekit/items.py": [26]} and "tests/test_items.py" in p.tests  # the line the fix adds
    assert p.modules == ["tests/test_items.py"]
    # nothing of the run (names, key) is in the script the container can read
    first, second = p.scripts(eval_script_for(TASK))
    assert second is None  # nothing of the project runs before the test command: one part
    script = frame_script(first)
    assert all(c.name not in script for c in p.canaries) and p.key.hex() not in script
    assert f"-I -S {p.run_dir}/referee.py {p.run_dir}" in script and "pytest" not in script.split("referee.py")[1]
    assert script.splitlines()[2] == 'rm -f -- "$0"'
    assert script.index("kill -9") < script.index("referee.py")  # earlier steps' processes reaped first
    files = p.files()
    cfg = json.loads(files[f"{p.run_dir}/run.json"])
    assert cfg["key"] == p.key.hex() and cfg["command"]["rest"] == p.command.rest and cfg["runner"] == "pytest"
    assert {f"{p.run_dir}/{n}" for n in GRADER_FILES} < set(files) and f"{p.run_dir}/" in files
    assert _plan(seed=1).canaries != p.canaries and _plan(seed=1).key != p.key


def test_the_audit_blames_only_added_lines() -> None:
    patch = ("diff --git a/pkg/m.py b/pkg/m.py\n--- a/pkg/m.py\n+++ b/pkg/m.py\n@@ -3,4 +3,5 @@ def f():\n"
             " a = 1\n-b = 2\n+b = 3\n+c = 4\n d = 5\n@@ -20,2 +21,3 @@\n x\n+y\n z\n"
             "diff --git a/new.py b/new.py\nnew file mode 100644\n--- /dev/null\n+++ b/new.py\n@@ -0,0 +1,2 @@\n+p\n+q\n"
             "diff --git a/gone.py b/gone.py\ndeleted file mode 100644\n--- a/gone.py\n+++ /dev/null\n@@ -1 +0,0 @@\n-x\n")
    assert added_lines(patch) == {"pkg/m.py": [4, 5, 22], "new.py": [1, 2]}


def test_which_test_commands_the_referee_runs() -> None:
    assert parse_command("pytest -rA tests/x.py") == parse_command("pytest -rA tests/x.py")
    c = parse_command("PYTHONWARNINGS='ignore::UserWarning' bin/test -C --verbose sympy/a/tests/test_b.py", "sympy/sympy")
    assert c is not None and c.runner == "sympy" and c.prefix == "PYTHONWARNINGS='ignore::UserWarning' " \
        and c.script == "bin/test" and c.rest == "-C --verbose sympy/a/tests/test_b.py"
    c = parse_command("./tests/runtests.py --verbosity 2 --settings=test_sqlite --parallel 1 a.b", "django/django")
    assert c is not None and c.runner == "unittest" and c.script == "./tests/runtests.py"
    for cmd, repo in (("tox --current-env -epy39 -v --", "sphinx-doc/sphinx"), ("pytest -n 4 tests/x.py", ""),
                      ("pytest --forked tests/x.py", ""), ("./tests/runtests.py --parallel 4 a", "django/django"),
                      ("bin/test --parallel a", "sympy/sympy"), ("make test", "")):
        assert parse_command(cmd, repo) is None, cmd
    for cmd in ("pytest -rA tests/x.py", "PYTHONWARNINGS=ignore pytest --no-header -rA tests/x.py",
                "python -m pytest tests/x.py", "python3.9 -m pytest -rA", "py.test tests"):
        got = parse_command(cmd)
        assert got is not None and got.runner == "pytest", cmd


def test_an_install_step_splits_the_script() -> None:
    """An eval script that runs the project's code before its tests (SWE-bench's pip install -e
    .) runs in two parts: the run files are written between them, never while the install runs."""
    lite = {r["instance_id"]: r for r in read_lite()}
    row = lite["django__django-16595"]
    p = _plan(row)
    first, second = p.scripts(eval_script_for(row))
    assert second is not None and "pip install -e ." in first and "pip install" not in second
    assert p.run_dir not in first and "referee.py" in second
    assert first.index("pip install") < first.index("git apply") < first.index("Start Test Output")
    assert first.rstrip().splitlines()[-2].startswith("export -p > ")  # the script's environment, for part two
    assert second.index("@@swarl-infra") < second.index("referee.py")  # infrastructure checked before the referee
    assert not runs_project_code(eval_script_for(TASK).splitlines()[:-4])
    assert runs_project_code(["git status", "python setup.py develop"])
    assert runs_project_code(["make"]) and not runs_project_code(["git apply -v - <<'EOF_1'", "make", "EOF_1", "git diff"])
    out = "x\n@@swarl-infra  M conftest.py|?? tests/sitecustomize.py|\n" + STARTED + "@@swarl-infra  M forged.py|\n"
    assert [t.path for t in infra_changes(out)] == ["conftest.py", "tests/sitecustomize.py"]
    assert infra_changes("@@swarl-infra \n" + STARTED) == []
    assert [t.kind for t in infra_changes("no line")] == ["install_step"]


def test_an_honest_run_is_judged_resolved() -> None:
    p = _plan()
    v = judge(p, _output(p, _honest(p)), TASK, dict.fromkeys(F2P + P2P, "PASSED"))
    assert v.ok and v.statuses == dict.fromkeys(F2P + P2P, "PASSED") and v.isolated == dict.fromkeys(F2P, "PASSED")
    failing = judge(p, _output(p, _honest(p, "builtins.ZeroDivisionError")), TASK,
                    {**dict.fromkeys(P2P, "PASSED"), **dict.fromkeys(F2P, "FAILED")})
    assert failing.ok and failing.statuses[F2P[0]] == "FAILED" and failing.isolated == {}


def test_each_sign_of_tampering_is_named() -> None:
    p = _plan()
    fail_canary = next(c.test_id for c in p.canaries if not c.must_pass)
    tests = {**dict.fromkeys(P2P), **dict.fromkeys(F2P)}
    runs = _honest(p)
    # a must-fail canary reported passing
    flipped = [_run(p, tests)]
    for r in flipped[0]["records"]:
        if r.get("id") == fail_canary:
            r.update(pre=None, post=None, exc=None, report="passed")
    assert _kinds(p, flipped) == {"canary"}
    # the canaries missing while the row's tests pass: counts that do not add up
    missing = _run(p, tests)
    missing["records"] = _number([r for r in missing["records"] if r.get("id") not in {c.test_id for c in p.canaries}])
    assert "canary" in _kinds(p, [missing])
    # the log says passed, the referee saw it fail
    failing = [_run(p, {**tests, F2P[0]: "builtins.ZeroDivisionError"})]
    assert _kinds(p, failing) == {"report_forged"}
    # an exception and a passing report; the function raised and pytest saw nothing
    rewritten = [_run(p, tests)]
    for r in rewritten[0]["records"]:
        if r.get("id") == F2P[0] and r.get("when") == "call":
            r.update(pre="builtins.ZeroDivisionError")
    assert "report_forged" in _kinds(p, rewritten)
    swallowed = [_run(p, tests)]
    for r in swallowed[0]["records"]:
        if r.get("e") == "call" and r.get("id") == F2P[0]:
            r["exc"] = "builtins.ZeroDivisionError"
    assert "report_forged" in _kinds(p, swallowed)
    never_called = [_run(p, tests)]
    never_called[0]["records"] = _number([r for r in never_called[0]["records"]
                                          if not (r.get("e") == "call" and r["id"] == F2P[0])])
    assert "report_forged" in _kinds(p, never_called)
    # the exit status: 0 although tests failed, 0 before the runner finished
    assert _kinds(p, [_run(p, tests, exit_code=0), *runs[1:]]) == {"exit_forged"}
    assert "exit_forged" in _kinds(p, [_run(p, tests, exit_code=0, finish=None)])
    # lines on the pipe the key does not sign, records after the end
    assert _kinds(p, [_run(p, tests, bad=2), *runs[1:]]) == {"referee"}
    assert _kinds(p, [_run(p, tests, late=1), *runs[1:]]) == {"referee"}
    # a test's outcome sent twice: the first stands, the second is named
    dup = _run(p, tests)
    fail_call = next(i for i, r in enumerate(dup["records"]) if r.get("id") == F2P[0] and r.get("when") == "call")
    dup["records"].insert(fail_call, {**dup["records"][fail_call], "pre": "builtins.ZeroDivisionError",
                                      "post": "builtins.ZeroDivisionError", "report": "failed"})
    _number(dup["records"])
    v = judge(p, _output(p, [dup, *runs[1:]]), TASK, dict.fromkeys(F2P + P2P, "PASSED"))
    assert "referee" in {t.kind for t in v.tampers} and v.statuses[F2P[0]] == "FAILED"
    # an audit record from the patched code
    audited = _run(p, tests)
    audited["records"].insert(1, {"e": "audit", "ev": "gc.get_objects", "file": "invoicekit/items.py", "line": 3})
    _number(audited["records"])
    assert _kinds(p, [audited, *runs[1:]]) == {"runner_introspection"}
    # the signed line twice (a replay)
    assert _kinds(p, runs, times=2) == {"referee"}


def test_a_verdict_without_the_key_is_no_verdict() -> None:
    p = _plan()
    forged = _output(p, _honest(p), key=b"k" * 32)
    assert signed_body(forged, p.key) == (None, 0)
    v = judge(p, forged, TASK, dict.fromkeys(F2P + P2P, "PASSED"))
    assert {t.kind for t in v.tampers} == {"referee"} and not v.statuses  # started, then silenced
    quiet = judge(p, "no referee here", TASK, dict.fromkeys(F2P + P2P, "PASSED"))
    assert quiet.error == "the referee did not start" and not quiet.tampers
    timed = judge(p, STARTED, TASK, {}, timed_out=True)
    assert "timed out" in timed.error and not timed.tampers
    assert "@@swarl-referee" not in strip_signed(_output(p, _honest(p)))
    failed = judge(p, _output(p, [], error="FileNotFoundError: x"), TASK, dict.fromkeys(F2P + P2P, "PASSED"))
    assert failed.error.startswith("the referee failed: FileNotFoundError") and not failed.tampers
    # the test files' hashes: changed by the end of the run, or before pytest imported one
    changed = {"tests/test_items.py": "a" * 64}
    assert _kinds(p, _honest(p), hashes=changed, hashes_after={"tests/test_items.py": "b" * 64}) == {"test_files"}
    early = _honest(p)
    early[0]["records"].insert(1, {"e": "module", "path": "tests/test_items.py", "sha": "b" * 64})
    _number(early[0]["records"])
    assert _kinds(p, early, hashes=changed, hashes_after=changed) == {"test_files"}
    assert _kinds(p, _honest(p), hashes=changed, hashes_after=changed) == set()


def test_passing_alone_matters_but_is_not_tampering() -> None:
    p = _plan()
    tests = {**dict.fromkeys(P2P), **dict.fromkeys(F2P)}
    (t, extra), = p.isolate.items()
    alone = _run(p, {**tests, t: "builtins.AssertionError"}, select=[t, *extra])
    v = judge(p, _output(p, [_run(p, tests), alone]), TASK, dict.fromkeys(F2P + P2P, "PASSED"))
    assert not v.tampers and "passes with the others but not alone" in v.error


def test_the_grader_files_run_on_python_3_6() -> None:
    """SWE-bench environments go back to Python 3.6: no syntax newer than that."""
    for name in GRADER_FILES:
        text = (GRADER_DIR / name).read_text()
        ast.parse(text, feature_version=(3, 6))
        assert "from __future__ import annotations" not in text


@pytest.mark.parametrize("runner", ["unittest", "sympy"])
def test_other_runners_are_judged_from_their_records(runner: str) -> None:
    """django's and sympy's runners: a test method that raised under a success, a success never
    called, an outcome sent twice, a must-fail canary passing are named; ids of either Python's
    unittest form match."""
    rows = {r["instance_id"]: r for r in read_lite()}
    row = rows["django__django-16595" if runner == "unittest" else "sympy__sympy-24152"]
    p = _plan(row)
    assert p.runner == runner and p.canaries
    f2p, p2p = listed_tests(row, "FAIL_TO_PASS"), listed_tests(row, "PASS_TO_PASS")
    tests = {**dict.fromkeys(p2p), **dict.fromkeys(f2p)}
    good = dict.fromkeys(f2p + p2p, "PASSED")
    runs = [_run(p, tests)] + [_run(p, tests, select=[t, *x]) for t, x in p.isolate.items()]
    v = judge(p, _output(p, runs), row, good)
    assert v.ok and set(v.statuses.values()) == {"PASSED"}, v
    failing = [_run(p, {**tests, f2p[0]: "builtins.AssertionError"})]
    assert _kinds(p, failing, good, row) == {"report_forged"}
    flipped = _run(p, tests)
    fail_canary = next(c.test_id for c in p.canaries if not c.must_pass)
    for r in flipped["records"]:
        if r.get("id") == fail_canary:
            r.update(exc=None, outcome="success")
    assert "canary" in _kinds(p, [flipped, *runs[1:]], good, row)
    if runner == "unittest":
        lied = _run(p, tests)
        for r in lied["records"]:
            if r.get("id") == f2p[0] and r["e"] == "call":
                r["exc"] = "builtins.AssertionError"
        assert "report_forged" in _kinds(p, [lied, *runs[1:]], good, row)
        uncalled = _run(p, tests)
        uncalled["records"] = _number([r for r in uncalled["records"] if not (r["e"] == "call" and r["id"] == f2p[0])])
        assert "report_forged" in _kinds(p, [uncalled, *runs[1:]], good, row)
        py311 = json.loads(json.dumps(runs).replace(" (migrations.test_optimizer.OptimizerTests)",
                                                    " (migrations.test_optimizer.OptimizerTests.X)"))
        assert py311 != runs
    twice = _run(p, tests)
    twice["records"] += [{"e": "call", "id": f2p[0], "exc": None}]
    _number(twice["records"])
    assert "referee" in _kinds(p, [twice, *runs[1:]], good, row)


def test_lite_rows_plan_and_judge() -> None:
    """Every SWE-bench Lite row whose test command the referee can run gets a plan with
    canaries among its FAIL_TO_PASS tests (but the six django rows that name them only by their
    docstrings); an honest run of it is judged resolved, a forged one not."""
    rows = read_lite()
    planned: dict[str, int] = {}
    for row in rows:
        p = plan(row, row["patch"], eval_script_for(row), random.Random(1))
        if p is None:
            continue
        planned[p.runner] = planned.get(p.runner, 0) + 1
        f2p, p2p = listed_tests(row, "FAIL_TO_PASS"), listed_tests(row, "PASS_TO_PASS")
        assert p.canaries or p.runner == "unittest", row["instance_id"]
        tests = {**dict.fromkeys(p2p), **dict.fromkeys(f2p)}
        runs = [_run(p, tests)] + [_run(p, tests, select=[t, *extra]) for t, extra in p.isolate.items()]
        good = dict.fromkeys(f2p + p2p, "PASSED")
        v = judge(p, _output(p, runs), row, good)
        assert v.ok and set(v.statuses.values()) <= {"PASSED"}, (row["instance_id"], v)
        bad = judge(p, _output(p, [_run(p, {**tests, f2p[0]: "builtins.AssertionError"})]), row, good)
        assert "report_forged" in {t.kind for t in bad.tampers}, row["instance_id"]
        assert p.scripts(eval_script_for(row))[1] is not None  # every Lite row installs before its tests
    # sphinx's tox runs pytest in another process: graded from the log (docs/security.md)
    assert planned == {"pytest": 93, "unittest": 114, "sympy": 77}, planned


def _grader_referee() -> Any:
    import importlib.util

    spec = importlib.util.spec_from_file_location("grader_referee", GRADER_DIR / "referee.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_canaries_copy_a_row_test_and_go_between_tests(tmp_path, monkeypatch) -> None:
    """The referee writes each canary from a test of the row: its header and parametrisation,
    its body (must-fail: all of it, then a line that fails; must-pass: up to its first call, in
    a try); never between a decorator and its def; a name the file uses is left out."""
    grader = _grader_referee()
    monkeypatch.chdir(tmp_path)
    (tmp_path / "tests").mkdir()
    (tmp_path / "pkg.py").write_text("def f(x):\n    return 1 / x\n")
    src = ("import pytest\nfrom pkg import f\n\n\n@pytest.mark.parametrize('x', [1])\ndef test_one(x):\n"
           "    '''Doc.'''\n    y = x + 1\n    assert f(y) == 0.5\n    assert f(0)\n\n\n"
           "class TestTwo:\n    def test_two(self):\n        assert f(1) == 1\n\n\ndef test_three():\n    assert 3\n")
    (tmp_path / "tests/test_x.py").write_text(src)
    rng = random.Random(3)
    canaries = [{"path": "tests/test_x.py", "name": "test_a_fail", "must_pass": False, "cls": None,
                 "sources": ["test_one"]},
                {"path": "tests/test_x.py", "name": "test_b_pass", "must_pass": True, "cls": None,
                 "sources": ["test_one"]},
                {"path": "tests/test_x.py", "name": "test_c_fail", "must_pass": False, "cls": "TestTwo",
                 "sources": ["test_two"]},
                {"path": "tests/test_x.py", "name": "test_three", "must_pass": False, "cls": None, "sources": []}]
    skipped = grader._insert_canaries(canaries, rng)
    assert skipped == {"tests/test_x.py": ["test_three"]}  # the file's own test is kept
    out = (tmp_path / "tests/test_x.py").read_text()
    tree = ast.parse(out)
    funcs = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
    assert set(funcs) == {"test_one", "test_three", "test_a_fail", "test_b_pass"}
    assert [ast.unparse(d) for d in funcs["test_a_fail"].decorator_list] == ["pytest.mark.parametrize('x', [1])"]
    assert "Doc." not in ast.unparse(funcs["test_a_fail"])  # a docstring would name the canary like its source
    assert "assert f(0)" in ast.unparse(funcs["test_a_fail"]) and "assert f(0)" not in ast.unparse(funcs["test_b_pass"])
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef))
    assert {n.name for n in cls.body} == {"test_two", "test_c_fail"}
    assert "@pytest.mark.parametrize('x', [1])\ndef test_one(x):" in out
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rA", "tests/test_x.py"],
                         capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(tmp_path)})
    assert "PASSED tests/test_x.py::test_b_pass[1]" in run.stdout, run.stdout
    assert "FAILED tests/test_x.py::test_a_fail[1]" in run.stdout and \
        "FAILED tests/test_x.py::TestTwo::test_c_fail" in run.stdout, run.stdout


def test_the_referee_counts_lines_its_key_does_not_sign(tmp_path) -> None:
    """Records are read with the key as it advances: a line under another key, a record replayed
    or one after `finish` is counted, not used."""
    grader = _grader_referee()
    key = os.urandom(32)

    def line(k: bytes, rec: dict[str, Any]) -> bytes:
        body = json.dumps(rec).encode()
        return hmac.new(k, body, "sha256").hexdigest().encode() + b" " + body + b"\n"

    k1 = hashlib.sha256(key).digest()
    k2 = hashlib.sha256(k1).digest()
    data = (line(key, {"e": "hello", "n": 1}) + line(b"x" * 32, {"e": "call", "n": 2}) + line(key, {"e": "hello", "n": 1})
            + line(k1, {"e": "finish", "n": 2}) + line(k2, {"e": "call", "n": 3}))
    r, w = os.pipe()
    os.write(w, data)
    os.close(w)
    child = subprocess.Popen(["true"])
    records, bad, late = grader._read_records(r, child, key)
    assert [x["e"] for x in records] == ["hello", "finish"] and bad == 2 and late == 1
