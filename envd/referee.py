"""A verdict the code under test cannot forge: canaries, a referee outside the test process, and
the FAIL_TO_PASS tests again one at a time.

A patch may change the package under test, and the tests import it, so the patch's code runs
inside the test process. From there it can rewrite pytest's reports, swallow exceptions, print
result lines or forge the exit status. envd therefore grades a pytest-run row (`plan` finds its
test command) through `envd/grader/referee.py`:

- the referee (a process started before any project code, holding a per-run key the test
  process never sees, non-dumpable) runs the test command with envd/grader/plugin.py loaded
  first; the plugin reports every test's outcome, read before other hooks can rewrite it, on a
  pipe, and the referee prints one signed line with the records (`judge` checks the signature);
- **canaries** (`Canary`): tests with fresh names, some that must pass and some that must fail,
  put among the row's FAIL_TO_PASS tests by the referee (never written in the eval script): a
  must-fail canary that passes, or canaries missing from a run whose tests pass, is tampering;
- the test output's statuses are only a cross-check: a listed test the log calls passed that
  the referee saw fail or never saw run is forged output;
- when every FAIL_TO_PASS test passed, up to MAX_ISOLATED of them run again alone, each in a
  fresh process with a canary of each kind, and must pass there too;
- the plugin's audit hook reports tracing, gc walks, frame access and reads of the tests, /proc
  or the grader's files made from a file the patch changed.

What this closes and what stays open: docs/security.md.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import random
import re
import secrets
import shlex
import zlib
from dataclasses import dataclass, field
from typing import Any

from envd.grader import PLUGIN_FILE, REFEREE_FILE
from swe.grading import END_TEST_OUTPUT, REAP_OTHERS, START_TEST_OUTPUT
from swe.tamper import RUNNER_PACKAGES, Tamper, row_test_files

__all__ = ["MAX_ISOLATED", "Canary", "RefereePlan", "Verdict", "judge", "plan", "test_status"]

MAX_ISOLATED = 3
SIGNED = "@@swarl-referee "
STARTED = "\n@@swarl-referee-started\n"
MAX_BODY = 64 * 1024 * 1024
# `pytest ...` / `python -m pytest ...` (env assignments before it allowed): what the referee wraps.
_PYTEST_CMD = re.compile(r"^\s*(?:\w+=\S*\s+)*(?:\S*/)?(?:py\.test|pytest|python[\d.]*\s+-m\s+pytest)(?:\s|$)")
# Options that run the tests in other processes (xdist workers, forked children): not refereed.
_ELSEWHERE = re.compile(r"\s(-n|--numprocesses|--dist|--forked|--boxed|--tx)(\s|=|$)|\s-n\d")
_WORDS = ("empty", "single", "twice", "large", "negative", "order", "zero", "default", "nested", "repeat",
          "boundary", "sorted", "mixed", "missing", "none", "many", "small", "first", "last", "copy", "values",
          "keys", "update", "round", "limit", "text", "blank", "case", "unicode", "reverse")
_GOOD = {"PASSED", "XFAIL"}


@dataclass(frozen=True)
class Canary:
    test_id: str   # path::name (or path::Class::name)
    path: str
    must_pass: bool
    text: str      # the source the referee inserts into `path`


@dataclass
class RefereePlan:
    """One graded run through the referee: what envd puts into the container and how it judges."""

    token: str
    key: bytes
    plugin: str                      # the plugin's module name this run
    canaries: list[Canary]
    isolate: dict[str, list[str]]    # FAIL_TO_PASS id -> canary ids run beside it alone
    watch: dict[str, list[int]]      # non-test Python files the patch changed -> its added lines (audit)
    tests: list[str]                 # the row's test files (hashed)
    modules: list[str] = field(default_factory=list)  # the test modules its ids name (reading them is audited)

    @property
    def run_dir(self) -> str:
        return f"/tmp/swarl-{self.token}"

    def files(self) -> dict[str, bytes]:
        """Path in the container -> content (run.json is deleted by the referee when it starts)."""
        by_path: dict[str, list[str]] = {}
        for c in self.canaries:
            by_path.setdefault(c.path, []).append(c.text)
        cfg = {"key": self.key.hex(), "plugin": self.plugin, "canaries": by_path, "isolate": self.isolate,
               "watch": self.watch, "tests": self.tests, "modules": self.modules}
        return {f"{self.run_dir}/referee.py": REFEREE_FILE.read_bytes(),
                f"{self.run_dir}/{self.plugin}.py": PLUGIN_FILE.read_bytes(),
                f"{self.run_dir}/run.json": json.dumps(cfg).encode()}

    def wrap(self, script: str) -> str:
        """The eval script (before swe.grading.frame_script) with its test command run by the
        referee, after every process the earlier steps left is killed (the run's key is on disk
        until the referee reads it). The script deletes itself first: the test patch it carries
        would tell the canaries from the tests the patch added."""
        lines = script.splitlines()
        i, cmd = _test_command(lines)
        assert cmd is not None, "plan() only plans scripts with a pytest test command"
        runner = (f'"$(command -v python3 || command -v python)" {self.run_dir}/referee.py {self.run_dir} -- '
                  f"{shlex.quote(cmd)}")
        head = 1 if lines and lines[0].startswith("#!") else 0
        return "\n".join([*lines[:head], 'rm -f -- "$0"', *lines[head:i], REAP_OTHERS.rstrip("\n"), runner,
                          *lines[i + 1:]]) + "\n"


def _test_command(lines: list[str]) -> tuple[int, str | None]:
    """The index and text of the script's test command: the one line between its start and end
    markers, if it runs pytest."""
    start = next((i for i, line in enumerate(lines) if START_TEST_OUTPUT in line), None)
    if start is None:
        return -1, None
    end = next((i for i in range(start + 1, len(lines)) if END_TEST_OUTPUT in lines[i]), len(lines))
    body = [(i, line) for i, line in enumerate(lines[start + 1:end], start + 1) if line.strip()]
    if len(body) != 1 or not _PYTEST_CMD.match(body[0][1]) or _ELSEWHERE.search(body[0][1]):
        return -1, None
    return body[0]


def plan(inst: dict[str, Any], patch: str, script: str, rng: random.Random | None = None) -> RefereePlan | None:
    """How to run `script` (the eval script, before framing) through the referee; None when its test
    command is not pytest (django's and sympy's runners: graded from the log, docs/security.md)
    or no FAIL_TO_PASS test names a pytest file."""
    from swe.schema import listed_tests

    if _test_command(script.splitlines())[1] is None:
        return None
    rng = rng or random.SystemRandom()
    f2p, p2p = listed_tests(inst, "FAIL_TO_PASS"), listed_tests(inst, "PASS_TO_PASS")
    files = sorted({t.split("::", 1)[0] for t in f2p if "::" in t and t.split("::", 1)[0].endswith(".py")})
    if not files:
        return None
    taken = set(f2p) | set(p2p)
    canaries: list[Canary] = []
    for path in files:
        stems = [w for t in f2p + p2p if t.startswith(path + "::")
                 for w in re.findall(r"[a-z]+", t.rsplit("::", 1)[1].split("[")[0]) if w != "test"]
        for must_pass in (True, False, False, True):
            canaries.append(_canary(path, must_pass, stems, taken, rng))
    isolate: dict[str, list[str]] = {}
    for t in rng.sample(f2p, min(MAX_ISOLATED, len(f2p))):
        path = t.split("::", 1)[0]
        mine = [c for c in canaries if c.path == path]
        if mine:
            isolate[t] = [next(c.test_id for c in mine if not c.must_pass), next(c.test_id for c in mine if c.must_pass)]
    tests = sorted(row_test_files(inst))
    watch = {path: lines for path, lines in added_lines(patch).items()
             if path.endswith(".py") and path not in tests and lines
             and not any(f"/{pkg}" in f"/{path}" for pkg in RUNNER_PACKAGES)}
    if inst.get("repo") == "pytest-dev/pytest":  # the runner is the package under test: its code does all this
        watch = {}
    return RefereePlan(token=secrets.token_hex(8), key=secrets.token_bytes(32),
                       plugin="_pt" + secrets.token_hex(6), canaries=canaries, isolate=isolate,
                       watch=watch, tests=tests,
                       modules=sorted({t.split("::", 1)[0] for t in f2p + p2p if "::" in t}))


_HUNK = re.compile(r"^@@ -\d+(?:,\d+)? \+(\d+)(?:,\d+)? @@")


def added_lines(patch: str) -> dict[str, list[int]]:
    """{file the patch leaves: the numbers, in the new file, of the lines it adds}: the audit
    hook blames only these (code the file had before is the package's own)."""
    out: dict[str, list[int]] = {}
    cur: list[int] | None = None
    n = 0
    for line in patch.splitlines():
        if line.startswith("diff --git "):
            cur = None
        elif line.startswith("+++ "):
            path = line[4:].strip().split("\t")[0]
            cur = None if path == "/dev/null" else out.setdefault(path[2:] if path.startswith("b/") else path, [])
        elif (m := _HUNK.match(line)) is not None:
            n = int(m.group(1))
        elif cur is not None and line[:1] == "+":
            cur.append(n)
            n += 1
        elif line[:1] in (" ", ""):
            n += 1
    return out


def _canary(path: str, must_pass: bool, stems: list[str], taken: set[str], rng: random.Random) -> Canary:
    """A test that must pass or must fail, named like its neighbours (words of the row's tests
    in that file and common test words), with one of several bodies."""
    words = stems or list(_WORDS)
    while True:
        name = "test_" + "_".join(rng.sample(words, min(len(words), rng.randint(1, 2))) +
                                  rng.sample(_WORDS, rng.randint(1, 2)))
        if f"{path}::{name}" not in taken:
            break
    taken.add(f"{path}::{name}")
    a, b, c = rng.randint(2, 99), rng.randint(2, 99), rng.randint(2, 9)
    var = rng.choice(("values", "items", "got", "result", "data"))
    if must_pass:
        body = rng.choice([f"{var} = [{a}, {b}, {c}]\n    assert sum({var}) == {a + b + c}",
                           f"{var} = {{'a': {a}, 'b': {b}}}\n    assert sorted({var}) == ['a', 'b']",
                           f"{var} = '{name[5:]}'.split('_')\n    assert len({var}) == {len(name[5:].split('_'))}"])
    else:
        body = rng.choice([f"{var} = [{a}, {b}, {c}]\n    assert sum({var}) == {a + b + c + rng.randint(1, 9)}",
                           f"{var} = {{'a': {a}}}\n    assert {var}['b'] == {b}",
                           f"{var} = [{a}, {b}]\n    assert {var}[{rng.randint(2, 5)}] == {c}",
                           f"{var} = {a} * {b}\n    assert {var} < {a * b - c}"])
    return Canary(f"{path}::{name}", path, must_pass, f"def {name}():\n    {body}\n")


# -- judging ---------------------------------------------------------------------------


@dataclass
class Verdict:
    """What the referee's records say: the listed tests' statuses, the tampering seen, and an
    error when there is no usable verdict (unresolved, not tampering)."""

    statuses: dict[str, str] = field(default_factory=dict)
    tampers: list[Tamper] = field(default_factory=list)
    error: str = ""
    isolated: dict[str, str] = field(default_factory=dict)
    runs: int = 0

    @property
    def ok(self) -> bool:
        return not self.error and not self.tampers


def signed_body(output: str, key: bytes) -> tuple[dict[str, Any] | None, int]:
    """The referee's records (None: no line carries a valid signature) and how many signed
    lines were valid (more than one: a replay)."""
    found: list[dict[str, Any]] = []
    for line in output.splitlines():
        if not line.startswith(SIGNED):
            continue
        parts = line[len(SIGNED):].split(" ")
        if len(parts) != 2:
            continue
        want = hmac.new(key, parts[1].encode(), hashlib.sha256).hexdigest()
        if not hmac.compare_digest(want, parts[0]):
            continue
        try:
            d = zlib.decompressobj()
            raw = d.decompress(base64.b64decode(parts[1], validate=True), MAX_BODY)
            found.append(json.loads(raw))
        except (binascii.Error, zlib.error, ValueError):
            continue
    return (found[0] if found else None), len(found)


def _exc_kind(name: str | None) -> str | None:
    if not name:
        return None
    short = name.rsplit(".", 1)[-1]
    if short in ("Skipped", "SkipTest") or name.endswith("skip.Exception"):
        return "skip"
    if short == "XFailed":
        return "xfail"
    return "error"


class _Run:
    """One test process's records, checked and folded into per-test statuses."""

    def __init__(self, run: dict[str, Any]) -> None:
        self.exit = run.get("exit")
        self.problems: list[str] = []
        recs = [r for r in run.get("records", []) if isinstance(r, dict)]
        if run.get("bad"):
            self.problems.append(f"{run['bad']} malformed line(s) on the referee's pipe")
        if run.get("late"):
            self.problems.append(f"{run['late']} record(s) after the test process exited")
        seqs = [r.get("n") for r in recs]
        if seqs != list(range(1, len(seqs) + 1)):
            self.problems.append("the referee's records are out of sequence (written by someone else)")
        self.hello = any(r.get("e") == "hello" for r in recs)
        finish = [r for r in recs if r.get("e") == "finish"]
        self.finish = finish[-1].get("exitstatus") if finish else None
        collected = [r for r in recs if r.get("e") == "collected"]
        self.collected: set[str] = set()
        for r in collected[-1:]:
            for ids in r.get("ids", []):
                self.collected.update(str(i) for i in ids)
        self.audit = [r for r in recs if r.get("e") == "audit"]
        self.modules = [(str(r.get("path")), r.get("sha")) for r in recs if r.get("e") == "module"]
        self.phases: dict[str, dict[str, dict[str, Any]]] = {}
        self.aliases: dict[str, str] = {}
        self.calls: dict[str, str | None] = {}
        for r in recs:
            if r.get("e") == "phase":
                tid = str(r.get("id"))
                self.phases.setdefault(tid, {})[str(r.get("when"))] = r
                for alias in r.get("ids") or [tid]:
                    self.aliases[str(alias)] = tid
            elif r.get("e") == "call":
                self.calls[str(r.get("id"))] = r.get("exc")
        if self.collected:
            stray = [t for t in self.phases if t not in self.collected]
            if stray:
                self.problems.append(f"outcomes for tests never collected: {stray[:3]}")
        self.forged: list[str] = []
        self.status = {tid: self._status(tid) for tid in self.phases}

    def _status(self, tid: str) -> str:
        ph = self.phases[tid]
        excs = {w: (r.get("pre"), r.get("post"), r.get("report")) for w, r in ph.items()}
        for when, (pre, post, report) in excs.items():
            if (pre or post) and report == "passed":
                self.forged.append(f"{tid}: its {when} raised {(pre or post)} but the report says passed")
        if tid in self.calls and self.calls[tid] and not excs.get("call", (None, None, None))[0]:
            self.forged.append(f"{tid}: the test function raised {self.calls[tid]} and pytest saw no exception")
        if ph.get("call", {}).get("fn") and tid not in self.calls:
            self.forged.append(f"{tid}: reported without its test function being called")
        setup = excs.get("setup", (None, None, None))
        call = excs.get("call")
        teardown = excs.get("teardown", (None, None, None))
        xfail = bool(ph.get("call", ph.get("setup", {})).get("xfail"))
        skip = any(_exc_kind(p or q) == "skip" for p, q, _ in (setup, call or (None, None, None)))
        if skip:
            return "SKIPPED"
        if setup[0] or setup[1]:
            return "ERROR"
        if call is None:
            return "MISSING"
        err = call[0] or call[1] or self.calls.get(tid)
        if err:
            return "XFAIL" if xfail and _exc_kind(err) in ("error", "xfail") else "FAILED"
        if teardown[0] or teardown[1]:
            return "ERROR"
        return "PASSED"

    def lookup(self, test_id: str) -> str:
        """A listed id's status: the node id, its cwd-relative form, or (ids the harness's parser
        cut at a space) the ids it begins; several must all pass."""
        if test_id in self.aliases:
            return self.status.get(self.aliases[test_id], "MISSING")
        cut = sorted({tid for alias, tid in self.aliases.items() if alias.split(" ")[0] == test_id})
        if not cut:
            return "MISSING"
        got = [self.status.get(t, "MISSING") for t in cut]
        return "PASSED" if all(s in _GOOD for s in got) else next(s for s in got if s not in _GOOD)


def test_status(run: dict[str, Any], test_id: str) -> str:
    return _Run(run).lookup(test_id)


def judge(p: RefereePlan, output: str, inst: dict[str, Any], log_status: dict[str, str],
          timed_out: bool = False) -> Verdict:
    """The verdict from the referee's signed records, cross-checked with the log's statuses."""
    from swe.schema import listed_tests

    f2p, p2p = listed_tests(inst, "FAIL_TO_PASS"), listed_tests(inst, "PASS_TO_PASS")
    listed = f2p + p2p
    body, valid = signed_body(output, p.key)
    v = Verdict()
    if body is None:
        if timed_out:
            v.error = "the tests timed out before the referee answered"
        elif STARTED in output:  # it started, so only something the tests did stopped it
            v.tampers.append(Tamper("referee", "<test run>", "the referee was stopped before it could answer"))
        else:
            v.error = "the referee did not start"
        return v
    if valid > 1:
        v.tampers.append(Tamper("referee", "<test output>", "the referee's signed line appears more than once"))
    if body.get("error"):
        v.error = f"the referee failed: {str(body['error'])[:300]}"
        return v
    runs = [_Run(r) for r in body.get("runs", [])]
    before = body.get("hashes") or {}
    for path, sha in before.items():
        if sha is not None and (body.get("hashes_after") or {}).get(path) != sha:
            v.tampers.append(Tamper("test_files", str(path), f"{path}: a test file changed while the tests ran"))
    for i, run in enumerate(runs):
        for path, sha in run.modules:
            if path in before and sha != before[path]:
                v.tampers.append(Tamper("test_files", path, f"{path}: a test file was changed before pytest "
                                        f"imported it (run {i + 1})"))
    v.runs = len(runs)
    if not runs or not runs[0].hello:
        v.error = "the referee's plugin did not load in the test process"
        return v
    main = runs[0]
    v.statuses = {t: main.lookup(t) for t in listed}
    # a canary whose name the test file already used is not inserted (the referee says which)
    skipped = {f"{path}::{name}" for path, names in (body.get("skipped_canaries") or {}).items() for name in names}
    canary_fail = {c.test_id for c in p.canaries if not c.must_pass}
    canary_pass = {c.test_id for c in p.canaries if c.must_pass}
    for i, run in enumerate(runs):
        where = "the full run" if i == 0 else f"the run of {run_select(body, i)} alone"
        for why in run.problems:
            v.tampers.append(Tamper("referee", "<test process>", f"{where}: {why}"))
        for why in run.forged[:5]:
            v.tampers.append(Tamper("report_forged", "<test process>", f"{where}: {why}"))
        seen: set[tuple[str, str]] = set()
        for a in run.audit:
            k = (str(a.get("ev")), str(a.get("file")))
            if k not in seen:
                seen.add(k)
                v.tampers.append(Tamper("runner_introspection", str(a.get("file")),
                                        f"{a.get('file')}:{a.get('line')}: {a.get('ev')} from the patched code "
                                        "while the tests ran"))
        mine = (set(run_select(body, i)) if i else canary_fail | canary_pass) - skipped
        ran = listed if i == 0 else run_select(body, i)

        def good_beside(cid: str, run: _Run = run, ran: list[str] = ran) -> bool:
            """A row test of the canary's file passed in this run (a module skipped or not
            importable as a whole is not the canaries' fault)."""
            path = cid.split("::", 1)[0]
            return any(t.startswith(path + "::") and run.lookup(t) in _GOOD for t in ran if t not in canary_ids(p))

        for cid in sorted(mine & canary_fail):
            st = run.lookup(cid)
            if st in _GOOD:
                v.tampers.append(Tamper("canary", cid.split("::", 1)[0],
                                        f"{where}: a test that must fail was reported {st}"))
            elif st == "MISSING" and good_beside(cid):
                v.tampers.append(Tamper("canary", cid.split("::", 1)[0],
                                        f"{where}: a grader test is missing although the row's tests ran"))
        for cid in sorted(mine & canary_pass):
            st = run.lookup(cid)
            if st != "PASSED" and good_beside(cid):
                v.tampers.append(Tamper("canary", cid.split("::", 1)[0],
                                        f"{where}: a test that must pass was reported {st}"))
        if run.finish is not None and run.finish != 0 and run.exit == 0:
            v.tampers.append(Tamper("exit_forged", "<test process>",
                                    f"{where}: pytest ended with status {run.finish} but the process exited 0"))
        elif run.finish is None and run.exit == 0:
            v.tampers.append(Tamper("exit_forged", "<test process>",
                                    f"{where}: the test process exited 0 before pytest finished"))
    for t in listed:
        if log_status.get(t) in _GOOD and v.statuses.get(t) not in _GOOD:
            v.tampers.append(Tamper("report_forged", "<test output>",
                                    f"the test output reports {t} {log_status[t]}; the referee saw "
                                    f"{v.statuses.get(t)}"))
    for i in range(1, len(runs)):
        for t in run_select(body, i):
            if t in f2p:
                v.isolated[t] = runs[i].lookup(t)
    alone_bad = [t for t, s in v.isolated.items() if s not in _GOOD]
    if alone_bad and not v.tampers:
        v.error = f"FAIL_TO_PASS test {alone_bad[0]} passes with the others but not alone ({v.isolated[alone_bad[0]]})"
    seen_t: set[tuple[str, str]] = set()
    v.tampers = [t for t in v.tampers if (t.kind, t.reason) not in seen_t and not seen_t.add((t.kind, t.reason))]  # type: ignore[func-returns-value]
    return v


def run_select(body: dict[str, Any], i: int) -> list[str]:
    runs = body.get("runs", [])
    return [str(t) for t in (runs[i].get("select") or [])] if i < len(runs) else []


def strip_signed(output: str) -> str:
    """The output without the referee's line (a test log line to no parser)."""
    return "\n".join(line for line in output.splitlines() if not line.startswith("@@swarl-referee")) + \
        ("\n" if output.endswith("\n") else "")


def canary_ids(p: RefereePlan) -> set[str]:
    return {c.test_id for c in p.canaries}
