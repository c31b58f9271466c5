"""A verdict the code under test cannot forge: what envd puts into a grading container for the
referee (`plan`, `RefereePlan`), judged by envd.verdict.

A patch may change the package under test, and the tests import it, so the patch's code runs
inside the test process (and, through setup.py, in the eval script's install step). envd
therefore grades a row whose test command it knows how to observe (`RunnerCommand`: pytest,
django's unittest runner, sympy's bin/test) through envd/grader/:

- the referee (a process started after every step that could run the patch's code, holding a
  per-run key the test process never sees, non-dumpable) runs the test command with its runner
  started through boot.py, which loads the grader's observer and its channel before any file of
  the repository; the observer reports every test's outcome, read before the runner's own
  reporting can rewrite it, and the referee prints one signed line with the records;
- **canaries** (`Canary`): tests with fresh names, some that must pass and some that must fail,
  put among the row's FAIL_TO_PASS tests by the referee (never written in the eval script),
  each doing what one of the row's tests does (its header, its fixtures, its first statements
  up to a call): an attack on the tests that call the package hits them too;
- when every listed test passed and the canaries are right, up to MAX_ISOLATED FAIL_TO_PASS
  tests run again alone, each in a fresh process with a canary of each kind;
- an eval script that runs the project's code before the test command (SWE-bench's
  `pip install -e .`) is run in two parts (`RefereePlan.scripts`): the run files are written
  only after the first, once envd has checked from outside the container that no process of it
  is left and what it changed on disk (envd.daemon, swe.tamper.system_changes).

What this closes and what stays open: docs/security.md.
"""

from __future__ import annotations

import json
import random
import re
import secrets
import shlex
from dataclasses import dataclass, field
from typing import Any

from envd.grader import GRADER_DIR, GRADER_FILES
from swe.grading import END_TEST_OUTPUT, REAP_OTHERS, START_TEST_OUTPUT
from swe.tamper import RUNNER_PACKAGES, Tamper, infra_globs, row_test_files

__all__ = ["MAX_ISOLATED", "SIGNED", "STARTED", "Canary", "RefereePlan", "RunnerCommand", "added_lines",
           "canary_ids", "infra_changes", "parse_command", "plan", "strip_signed"]

MAX_ISOLATED = 3
SIGNED = "@@swarl-referee "
STARTED = "\n@@swarl-referee-started\n"
INFRA = "@@swarl-infra "
_WORDS = ("empty", "single", "twice", "large", "negative", "order", "zero", "default", "nested", "repeat",
          "boundary", "sorted", "mixed", "missing", "none", "many", "small", "first", "last", "copy", "values",
          "keys", "update", "round", "limit", "text", "blank", "case", "unicode", "reverse")
# Env assignments before the runner (`PYTHONWARNINGS='...' bin/test ...`).
_PREFIX = re.compile(r"""^(\s*(?:\w+=(?:'[^']*'|"[^"]*"|\S*)\s+)*)(.*)$""", re.S)
# Options that run the tests in other processes (xdist workers, forked children): not refereed.
_ELSEWHERE = re.compile(r"\s(-n|--numprocesses|--dist|--forked|--boxed|--tx)(\s|=|$)|\s-n\d")
# Lines of an eval script before the test command that run nothing of the project: anything
# else (pip install -e ., python setup.py, make) makes the script run in two parts.
_INERT = re.compile(r"^\s*(#|$|set\s|cd(\s|$)|git\s|source\s+\S*/activate\b|conda\s+activate\b|:\s|"
                    r"export\s+\w+=|echo\s|rm\s+-f\s+--\s+\"\$0\"$|EOF_\d+$)")
_HEREDOC = re.compile(r"<<-?\s*'?\"?(\w+)'?\"?\s*$")


@dataclass(frozen=True)
class RunnerCommand:
    """The eval script's test command as the referee runs it: `prefix` (env assignments),
    `python` (`python -m pytest`) or `script` (a console script or a runner script), `rest`
    (the arguments as the script wrote them), `runner` (the observer boot.py loads)."""

    prefix: str
    kind: str        # module | script
    python: str
    script: str
    rest: str
    runner: str      # pytest | unittest | sympy

    def as_dict(self) -> dict[str, str]:
        return {"prefix": self.prefix, "kind": self.kind, "python": self.python, "script": self.script,
                "rest": self.rest}


def parse_command(line: str, repo: str = "") -> RunnerCommand | None:
    """How the referee runs `line` (None: a command it cannot observe: tox, xdist workers,
    django's or sympy's parallel modes)."""
    m = _PREFIX.match(line)
    if m is None:
        return None
    prefix, body = m.group(1), m.group(2).rstrip()
    words = body.split(None, 3)
    if not words:
        return None
    first = words[0]
    if re.fullmatch(r"(?:\S*/)?python[\d.]*", first) and words[1:3] == ["-m", "pytest"]:
        rest = body.split(None, 3)[3] if len(words) > 3 else ""
        cmd = RunnerCommand(prefix, "module", first, "", rest, "pytest")
    elif re.fullmatch(r"(?:\S*/)?(?:py\.test|pytest)", first):
        cmd = RunnerCommand(prefix, "script", "", first, body[len(first):].strip(), "pytest")
    elif re.fullmatch(r"(?:\./)?(?:\S*/)?runtests\.py", first) and "django" in repo:
        cmd = RunnerCommand(prefix, "script", "", first, body[len(first):].strip(), "unittest")
        if re.search(r"--parallel(\s+|=)(?!1\b)\S+", cmd.rest):
            return None
    elif re.fullmatch(r"(?:\./)?bin/test", first) and "sympy" in repo:
        cmd = RunnerCommand(prefix, "script", "", first, body[len(first):].strip(), "sympy")
        if re.search(r"--parallel\b|--no-subprocess\b", cmd.rest):
            return None
    else:
        return None
    if cmd.runner == "pytest" and _ELSEWHERE.search(" " + cmd.rest):
        return None
    return cmd


@dataclass(frozen=True)
class Canary:
    test_id: str     # as the row names tests: path::name, path::Class::name, `name (module.Class)`, name
    path: str
    must_pass: bool
    name: str
    cls: str | None = None
    sources: tuple[str, ...] = ()  # the row's tests (function names) of its file / class it may copy
    beside: tuple[str, ...] = ()   # the row's listed tests of its file / class

    def as_dict(self) -> dict[str, Any]:
        return {"path": self.path, "name": self.name, "must_pass": self.must_pass, "cls": self.cls,
                "sources": list(self.sources)}


@dataclass
class RefereePlan:
    """One graded run through the referee: what envd puts into the container and how it judges."""

    token: str
    key: bytes
    command: RunnerCommand
    canaries: list[Canary]
    isolate: dict[str, list[str]]    # FAIL_TO_PASS id -> canary ids run beside it alone
    watch: dict[str, list[int]]      # non-test Python files the patch changed -> its added lines (audit)
    tests: list[str]                 # the row's test files (hashed)
    listed: list[str]                # FAIL_TO_PASS + PASS_TO_PASS
    modules: list[str] = field(default_factory=list)  # the test modules its ids name (reading them is audited)
    infra_keep: list[str] = field(default_factory=list)  # files the test patch changes (infrastructure or not)
    runner_files: list[str] = field(default_factory=list)  # the harness's test command's own files

    @property
    def run_dir(self) -> str:
        return f"/tmp/swarl-{self.token}"

    @property
    def runner(self) -> str:
        return self.command.runner

    def files(self) -> dict[str, bytes]:
        """Path in the container -> content (run.json is deleted by the referee when it starts;
        the path ending in / is the run directory)."""
        cfg = {"key": self.key.hex(), "runner": self.runner, "command": self.command.as_dict(),
               "canaries": [c.as_dict() for c in self.canaries], "isolate": self.isolate, "watch": self.watch,
               "tests": self.tests, "modules": self.modules, "listed": self.listed,
               "must_fail": [c.test_id for c in self.canaries if not c.must_pass]}
        out = {f"{self.run_dir}/": b""}  # put first, root's only (the files are 0600)
        out.update({f"{self.run_dir}/{name}": (GRADER_DIR / name).read_bytes() for name in GRADER_FILES})
        out[f"{self.run_dir}/run.json"] = json.dumps(cfg).encode()
        return out

    def scripts(self, script: str) -> tuple[str, str | None]:
        """The eval script (before swe.grading.frame_script) as envd runs it: one script whose test
        command is run by the referee, after every process the earlier steps left is killed;
        or, when those steps run the project's code (an install step), (the steps up to the
        test command, the referee's part): envd writes the run files between the two. Each
        part deletes itself first (the test patch it carries would tell the canaries from the
        tests the patch added)."""
        lines = script.splitlines()
        i = _test_command_line(lines)[0]
        assert i >= 0, "plan() only plans scripts whose test command the referee can run"
        head = 1 if lines and lines[0].startswith("#!") else 0
        runner = f'"$(command -v python3 || command -v python)" -I -S {self.run_dir}/referee.py {self.run_dir}'
        if not runs_project_code(lines[head:i]):
            return "\n".join([*lines[:head], 'rm -f -- "$0"', *lines[head:i], REAP_OTHERS.rstrip("\n"), runner,
                              *lines[i + 1:]]) + "\n", None
        env = f"/tmp/swarl-env-{self.token}.sh"
        first = "\n".join([*lines[:head], 'rm -f -- "$0"', *lines[head:i], REAP_OTHERS.rstrip("\n"),
                           f"export -p > {env}", f"echo \"cd $(printf '%q' \"$PWD\")\" >> {env}"]) + "\n"
        keep = " ".join(f"':!{p}'" for p in self.infra_keep)
        git = "git -c core.fsmonitor= -c core.hooksPath=/dev/null --no-pager"
        infra = " ".join(shlex.quote(f":(glob){g}") for g in infra_globs(self.runner_files))
        second = "\n".join(["#!/bin/bash", 'rm -f -- "$0"', f"source {env}", f"rm -f {env}",
                            f"echo \"{INFRA}$({git} status --porcelain --untracked-files=all -- {infra} {keep}"
                            " 2>&1 | tr '\\n' '|')\"", "set -uxo pipefail", runner,
                            *lines[i + 1:]]) + "\n"
        return first, second


def _test_command_line(lines: list[str], repo: str = "") -> tuple[int, RunnerCommand | None]:
    """The index of the script's test command (the one line between its start and end markers)
    and how the referee runs it."""
    start = next((i for i, line in enumerate(lines) if START_TEST_OUTPUT in line), None)
    if start is None:
        return -1, None
    end = next((i for i in range(start + 1, len(lines)) if END_TEST_OUTPUT in lines[i]), len(lines))
    body = [(i, line) for i, line in enumerate(lines[start + 1:end], start + 1) if line.strip()]
    if len(body) != 1:
        return -1, None
    return body[0][0], parse_command(body[0][1], repo)


def runs_project_code(lines: list[str]) -> bool:
    """Whether these eval-script lines run anything of the repository (an install step, a
    build): any command line but git, cd, set, conda activation, exports, markers."""
    end: str | None = None
    for line in lines:
        if end is not None:
            if line.strip() == end:
                end = None
            continue
        m = _HEREDOC.search(line)
        if m:
            end = m.group(1)
        if not _INERT.match(line):
            return True
    return False


def plan(inst: dict[str, Any], patch: str, script: str, rng: random.Random | None = None,
         off: frozenset[str] = frozenset()) -> RefereePlan | None:
    """How to run `script` (the eval script, before framing) through the referee; None when its test
    command is not one the referee can observe (sphinx's tox, parallel runners: graded from the
    log, docs/security.md) or, for pytest, no FAIL_TO_PASS test names a file. A unittest row
    whose FAIL_TO_PASS tests are named only by their docstrings gets no canaries (nothing tells
    their class). `off`: "canaries", "audit" left out (EnvdConfig.grader_off, for tests)."""
    from swe.schema import listed_tests
    from swe.tamper import runner_files

    _i, cmd = _test_command_line(script.splitlines(), str(inst.get("repo", "")))
    if cmd is None:
        return None
    rng = rng or random.SystemRandom()
    f2p, p2p = listed_tests(inst, "FAIL_TO_PASS"), listed_tests(inst, "PASS_TO_PASS")
    tests = sorted(row_test_files(inst))
    places = _places(cmd.runner, f2p, p2p, inst, tests)
    if not places and cmd.runner == "pytest":
        return None
    taken = set(f2p) | set(p2p)
    canaries: list[Canary] = []
    for (path, cls), (sources, beside, stems) in ({} if "canaries" in off else places).items():
        for must_pass in (True, False, False, True):
            canaries.append(_canary(cmd.runner, path, cls, must_pass, stems, sources, beside, taken, rng))
    isolate: dict[str, list[str]] = {}
    for t in rng.sample(f2p, min(MAX_ISOLATED, len(f2p))):
        mine = [c for c in canaries if t in c.beside]
        isolate[t] = [next(c.test_id for c in mine if not c.must_pass),
                      next(c.test_id for c in mine if c.must_pass)] if mine else []
    watch = {path: lines for path, lines in added_lines(patch).items()
             if path.endswith(".py") and path not in tests and lines
             and not any(f"/{pkg}" in f"/{path}" for pkg in RUNNER_PACKAGES)}
    if inst.get("repo") == "pytest-dev/pytest" or "audit" in off:  # pytest's rows: the runner is the package
        watch = {}
    return RefereePlan(token=secrets.token_hex(8), key=secrets.token_bytes(32), command=cmd, canaries=canaries,
                       isolate=isolate, watch=watch, tests=tests, listed=f2p + p2p,
                       modules=sorted({t.split("::", 1)[0] for t in f2p + p2p if "::" in t} |
                                      {c.path for c in canaries}),
                       infra_keep=sorted(_patch_paths(inst.get("test_patch") or "")),
                       runner_files=sorted(runner_files(inst)))


def _patch_paths(patch: str) -> set[str]:
    return {m.group(2) for m in re.finditer(r"^diff --git a/(\S+) b/(\S+)$", patch, re.M)}


def _unittest_parts(test_id: str) -> tuple[str, str, str] | None:
    """(module, Class, method) of a django-style id `method (module.Class)` or
    `method (module.Class.method)`; None for a docstring line."""
    m = re.fullmatch(r"(\w+) \(([\w.]+)\)", test_id)
    if m is None:
        return None
    dotted = m.group(2).split(".")
    if dotted[-1] == m.group(1) and len(dotted) > 2:
        dotted = dotted[:-1]
    return ".".join(dotted[:-1]), dotted[-1], m.group(1)


def _places(runner: str, f2p: list[str], p2p: list[str], inst: dict[str, Any], tests: list[str]
            ) -> dict[tuple[str, str | None], tuple[list[str], list[str], list[str]]]:
    """Where canaries go, per (file, class or None): (the row's tests there they may copy,
    first the FAIL_TO_PASS ones; the row's listed ids there; words of their names)."""
    out: dict[tuple[str, str | None], tuple[list[str], list[str], list[str]]] = {}

    def add(key: tuple[str, str | None], name: str, tid: str, copy: bool) -> None:
        sources, beside, stems = out.setdefault(key, ([], [], []))
        if copy and name not in sources:
            sources.append(name)
        beside.append(tid)
        stems += [w for w in re.findall(r"[a-z]+", name) if w != "test"]

    def locate(tid: str) -> tuple[tuple[str, str | None], str | None] | None:
        if runner == "pytest":
            if "::" not in tid or not tid.split("::", 1)[0].endswith(".py"):
                return None
            parts = tid.split("::")
            name = parts[-1].split("[")[0]
            cls = parts[1] if len(parts) == 3 else None
            return (parts[0], cls), name if len(parts) <= 3 else None
        if runner == "unittest":
            got = _unittest_parts(tid)
            if got is None:
                return None
            module, cls, name = got
            return (f"tests/{module.replace('.', '/')}.py", cls), name
        name = tid.split("[")[0]
        path = _sympy_file(name, inst, tests)
        return ((path, None), name) if path else None

    for tid in f2p:
        got = locate(tid)
        if got and got[1]:
            add(got[0], got[1], tid, True)
    for tid in p2p:
        got = locate(tid)
        if got and got[1] and got[0] in out:
            add(got[0], got[1], tid, True)
    return out


def _sympy_file(name: str, inst: dict[str, Any], tests: list[str]) -> str | None:
    """The test file of a sympy test named only by its function: the one whose test patch
    defines it, else the only test file."""
    patch = inst.get("test_patch") or ""
    cur = None
    for line in patch.splitlines():
        if line.startswith("+++ b/"):
            cur = line[6:].strip()
        elif cur and re.match(rf"^(?:[+ ]|@@ .*@@ )def {re.escape(name)}\(", line):
            return cur
    files = [t for t in tests if t.endswith(".py") and "/tests/" in f"/{t}"]
    return files[0] if len(files) == 1 else None


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


def _canary(runner: str, path: str, cls: str | None, must_pass: bool, stems: list[str], sources: list[str],
            beside: list[str], taken: set[str], rng: random.Random) -> Canary:
    """A test that must pass or must fail, named like its neighbours (words of the row's tests
    there and common test words); the referee writes its body from one of `sources`."""
    words = stems or list(_WORDS)
    while True:
        name = "test_" + "_".join(rng.sample(words, min(len(words), rng.randint(1, 2))) +
                                  rng.sample(_WORDS, rng.randint(1, 2)))
        tid = _test_id(runner, path, cls, name)
        if tid not in taken and name not in sources:
            break
    taken.add(tid)
    return Canary(tid, path, must_pass, name, cls, tuple(sources[:4]), tuple(beside))


def _test_id(runner: str, path: str, cls: str | None, name: str) -> str:
    if runner == "pytest":
        return f"{path}::{cls}::{name}" if cls else f"{path}::{name}"
    if runner == "unittest":
        module = path.removeprefix("tests/").removesuffix(".py").replace("/", ".")
        return f"{name} ({module}.{cls})"
    return name


def strip_signed(output: str) -> str:
    """The output without the referee's and the infrastructure check's lines (a test log line
    to no parser)."""
    return "\n".join(line for line in output.splitlines()
                     if not line.startswith(("@@swarl-referee", INFRA))) + ("\n" if output.endswith("\n") else "")


def canary_ids(p: RefereePlan) -> set[str]:
    return {c.test_id for c in p.canaries}


def infra_changes(output: str) -> list[Tamper]:
    """The test infrastructure the install step changed, as the second part's git check printed
    it before the referee started (nothing of the project runs before that line)."""
    head = output.split(STARTED.strip(), 1)[0]
    line = next((x for x in head.splitlines() if x.startswith(INFRA)), None)
    if line is None:
        return [Tamper("install_step", "<eval script>", "the test infrastructure could not be checked after the "
                                                        "install step")]
    changed = [x[3:].strip() or x for x in line[len(INFRA):].split("|") if x.strip()]  # porcelain: `XY path`
    return [Tamper("install_step", x, f"{x}: test infrastructure changed by the install step") for x in changed[:5]]
