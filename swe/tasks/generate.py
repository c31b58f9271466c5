"""Generate the bundled task rows (swe/tasks/tasks.jsonl) from the repositories and their
spec files (swe/tasks/repos/<repo>.yaml).

`python -m swe.tasks.generate` rewrites tasks.jsonl; `--check` exits 1 when it is stale.
"""

from __future__ import annotations

import json
import re
import shlex
import sys
import tempfile
from pathlib import Path
from typing import Any

from swe.tasks.gitrepo import commit_all, diff_after, write_files
from swe.tasks.specs import REPO_PREFIX, REPOS_DIR, TaskSpec, load_specs, task_image_name

TASKS_JSONL = Path(__file__).resolve().parent / "tasks.jsonl"
HEREDOC = "EOF_114329324912"
_SKIP = {"__pycache__", ".pytest_cache"}


def repo_files(repo: str) -> dict[str, str]:
    """The correct (bug-free) files of a bundled repository, by relative path."""
    root = REPOS_DIR / repo
    if not root.is_dir():
        raise ValueError(f"repo: no bundled repository {repo!r} under {REPOS_DIR}")
    out = {}
    for p in sorted(root.rglob("*")):
        if p.is_file() and not _SKIP.intersection(p.relative_to(root).parts) and p.suffix != ".pyc":
            out[p.relative_to(root).as_posix()] = p.read_text()
    return out


def _target(spec: TaskSpec, text: str) -> int:
    """0-based index of the one line the bug lives on."""
    hits = [i for i, line in enumerate(text.splitlines()) if spec.good in line and spec.anchor in line]
    if len(hits) != 1:
        raise ValueError(f"{spec.name}: `good` fragment {spec.good!r} found on {len(hits)} lines of {spec.path}")
    return hits[0]


def _swap(line: str, old: str, new: str, name: str) -> str:
    if line.count(old) != 1:
        raise ValueError(f"{name}: fragment {old!r} must occur once on its line: {line!r}")
    return line.replace(old, new)


def buggy_files(spec: TaskSpec) -> tuple[dict[str, str], int]:
    """The repository at the task's base commit (the bug injected), and the bug's 1-based line."""
    files = repo_files(spec.repo)
    lines = files[spec.path].splitlines(keepends=True)
    i = _target(spec, files[spec.path])
    lines[i] = _swap(lines[i], spec.good, spec.bad, spec.name)
    files[spec.path] = "".join(lines)
    return files, i + 1


def _bre(s: str) -> str:
    return re.sub(r"([\\.\[\]*^$/])", r"\\\1", s)


def _repl(s: str) -> str:
    return re.sub(r"([\\&/])", r"\\\1", s)


def sed_command(path: str, lineno: int, old: str, new: str) -> str:
    """One `sed -i` that turns `old` into `new` on line `lineno` of `path`."""
    return f"sed -i {shlex.quote(f'{lineno}s/{_bre(old)}/{_repl(new)}/')} {path}"


def _test_names(source: str) -> list[str]:
    return re.findall(r"^def (test_\w+)\(", source, flags=re.M)


def eval_script(base_commit: str, test_patch: str, test_files: list[str]) -> str:
    """SWE-Gym-Subset style: reset the test files, apply the test patch, run pytest between
    the harness's marker lines, reset the test files again."""
    files = " ".join(test_files)
    return "\n".join([
        "#!/bin/bash",
        "set -uxo pipefail",
        "cd /testbed",
        "git config --global --add safe.directory /testbed",
        "git status",
        f"git -c core.fileMode=false diff {base_commit}",
        f"git checkout {base_commit} {files}",
        f"git apply -v - <<'{HEREDOC}'\n{test_patch}\n{HEREDOC}",
        ": '>>>>> Start Test Output'",
        f"python3 -m pytest -rA -p no:cacheprovider {files}",
        ": '>>>>> End Test Output'",
        f"git checkout {base_commit} {files}",
        "",
    ])


def build_row(spec: TaskSpec) -> dict[str, Any]:
    files, lineno = buggy_files(spec)
    fixed_line = files[spec.path].splitlines()[lineno - 1]
    good_line = _swap(fixed_line, spec.bad, spec.good, spec.name)
    fixed = files[spec.path].splitlines(keepends=True)
    fixed[lineno - 1] = good_line + "\n"
    new_tests = files[spec.test_path] + "\n\n" + spec.tests.lstrip("\n")
    with tempfile.TemporaryDirectory(prefix="swarl-task-") as tmp:
        root = Path(tmp)
        write_files(root, files)
        base_commit = commit_all(root)
        patch = diff_after(root, {spec.path: "".join(fixed)})
        test_patch = diff_after(root, {spec.test_path: new_tests})
    all_tests = _test_names(new_tests)
    for t in spec.fail_to_pass:
        if t not in all_tests:
            raise ValueError(f"{spec.name}: FAIL_TO_PASS test {t} is not in {spec.test_path}")
    f2p = [f"{spec.test_path}::{t}" for t in spec.fail_to_pass]
    p2p = [f"{spec.test_path}::{t}" for t in all_tests if t not in spec.fail_to_pass]
    iid = spec.instance_id
    return {
        "repo": f"{REPO_PREFIX}/{spec.repo}",
        "instance_id": iid,
        "base_commit": base_commit,
        "patch": patch,
        "test_patch": test_patch,
        "problem_statement": spec.statement,
        "hints_text": "",
        "created_at": spec.created_at,
        "version": "1.0",
        "FAIL_TO_PASS": json.dumps(f2p),
        "PASS_TO_PASS": json.dumps(p2p),
        "environment_setup_commit": base_commit,
        "eval_script": eval_script(base_commit, test_patch, [spec.test_path]),
        "image_name": task_image_name(iid),
        "log_parser": "pytest",
        "dataset_family": "swarl",
        "swarl_family": spec.family,
        "swarl_split": "heldout" if spec.heldout else "train",
        "swarl_fix_command": sed_command(spec.path, lineno, spec.bad, spec.good),
        "swarl_wrong_commands": [sed_command(spec.path, lineno, spec.bad, w) for w in spec.wrong],
    }


def generate() -> list[dict[str, Any]]:
    rows = [build_row(spec) for spec in load_specs()]
    ids = [r["instance_id"] for r in rows]
    if len(set(ids)) != len(ids):
        raise ValueError("instance_id: duplicated in specs")
    return rows


def dumps(rows: list[dict[str, Any]]) -> str:
    return "".join(json.dumps(r, ensure_ascii=False, sort_keys=False) + "\n" for r in rows)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    try:
        text = dumps(generate())
    except ValueError as e:  # a bad spec file (TaskSpecError) or a spec that does not fit its repo
        print(f"swe.tasks.generate: {e}", file=sys.stderr)
        return 2
    return write_or_check(TASKS_JSONL, text, "--check" in args, "swe.tasks.generate")


def write_or_check(path: Path, text: str, check: bool, module: str) -> int:
    """Write the rows to `path`, or with `check` exit 1 when `path` differs (stale)."""
    if check:
        if (path.read_text() if path.exists() else "") != text:
            print(f"{path} is stale: run `python -m {module}`", file=sys.stderr)
            return 1
        return 0
    path.write_text(text)
    print(f"wrote {path} ({text.count(chr(10))} tasks)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
