"""The bundled task suite: shape, splits, and tasks.jsonl in sync with its sources."""

from __future__ import annotations

import json
import re
from collections import Counter

import pytest

from swe.grading import check_patch
from swe.harness import image_for
from swe.rows import listed_tests, validate_row
from swe.tasks import TASKS_JSONL, get_task, load_tasks, task_files
from swe.tasks.generate import dumps, generate
from swe.tasks.specs import FAMILIES, REPOS_DIR, TaskSpecError, load_spec_file, load_specs

SWE_BENCH_FIELDS = ("repo", "instance_id", "base_commit", "patch", "test_patch", "problem_statement",
                    "hints_text", "created_at", "version", "FAIL_TO_PASS", "PASS_TO_PASS",
                    "environment_setup_commit")


def test_tasks_jsonl_is_in_sync_with_sources() -> None:
    # Regenerating (git commits with the fixed identity on this machine) gives the same bytes,
    # so base_commit is the sha the image's /testbed commit will have.
    assert TASKS_JSONL.read_text() == dumps(generate()), \
        "swe/tasks/tasks.jsonl is stale: run `python -m swe.tasks.generate`"


def test_suite_size_families_and_splits() -> None:
    rows = load_tasks()
    assert len(rows) == 32
    assert len({r["instance_id"] for r in rows}) == 32
    fam = Counter(r["swarl_family"] for r in rows)
    assert set(fam) == set(FAMILIES) and set(fam.values()) == {4}
    held = Counter(r["swarl_family"] for r in rows if r["swarl_split"] == "heldout")
    assert held == dict.fromkeys(FAMILIES, 1)
    assert len(load_tasks("train")) == 24 and len(load_tasks("heldout")) == 8
    assert {r["instance_id"] for r in load_tasks("train")}.isdisjoint(r["instance_id"] for r in load_tasks("heldout"))
    with pytest.raises(ValueError, match=r"^split: must be one of"):
        load_tasks("test")


@pytest.mark.parametrize("row", load_tasks(), ids=lambda r: r["instance_id"])
def test_row_is_a_swe_bench_row(row: dict) -> None:
    for key in SWE_BENCH_FIELDS:
        assert isinstance(row[key], str), key
    assert re.fullmatch(r"swarl-tasks__[a-z]+-\d", row["instance_id"])
    assert row["repo"] == "swarl-tasks/" + row["instance_id"].split("__")[1].rsplit("-", 1)[0]
    assert re.fullmatch(r"[0-9a-f]{40}", row["base_commit"]) and row["environment_setup_commit"] == row["base_commit"]
    assert row["version"] == "1.0" and row["hints_text"] == "" and row["log_parser"] == "pytest"
    assert validate_row(row) == row
    f2p, p2p = listed_tests(row, "FAIL_TO_PASS"), listed_tests(row, "PASS_TO_PASS")
    assert json.loads(row["FAIL_TO_PASS"]) == f2p and f2p
    assert len(p2p) >= 1
    test_file = re.findall(r"^diff --git a/(\S+)", row["test_patch"], re.M)
    assert len(test_file) == 1
    for t in f2p + p2p:
        assert t.startswith(test_file[0] + "::test_")
    assert row["image_name"] == image_for(row) == f"swarl/task.{row['instance_id'].split('__')[1]}:latest"


@pytest.mark.parametrize("row", load_tasks(), ids=lambda r: r["instance_id"])
def test_gold_patch_is_one_line_and_statement_describes_the_symptom(row: dict) -> None:
    assert check_patch(row["patch"]) is None and check_patch(row["test_patch"]) is None
    removed = [line for line in row["patch"].splitlines() if line.startswith("-") and not line.startswith("---")]
    added = [line for line in row["patch"].splitlines() if line.startswith("+") and not line.startswith("+++")]
    assert len(removed) == len(added) == 1
    assert "tests/" not in row["patch"] and "tests/" in row["test_patch"]
    # The issue text does not give the fix away.
    assert added[0][1:].strip() not in row["problem_statement"]
    assert len(row["problem_statement"].splitlines()) >= 3


@pytest.mark.parametrize("row", load_tasks(), ids=lambda r: r["instance_id"])
def test_fix_and_wrong_commands(row: dict) -> None:
    fix, wrong = row["swarl_fix_command"], row["swarl_wrong_commands"]
    assert fix.startswith("sed -i ") and "\n" not in fix and len(fix) < 200
    assert 2 <= len(wrong) <= 3 and len(set(wrong)) == len(wrong) and fix not in wrong
    path = re.findall(r"^\+\+\+ b/(\S+)", row["patch"], re.M)[0]
    assert all(w.startswith("sed -i ") and w.endswith(" " + path) for w in [fix, *wrong])


def test_eval_script_frames_pytest_with_harness_markers() -> None:
    row = get_task("swarl-tasks__pagekit-1")
    script = row["eval_script"]
    lines = script.splitlines()
    start, end = lines.index(": '>>>>> Start Test Output'"), lines.index(": '>>>>> End Test Output'")
    assert lines[start + 1] == "python3 -m pytest -rA -p no:cacheprovider tests/test_pages.py"
    assert end == start + 2
    assert f"git checkout {row['base_commit']} tests/test_pages.py" in lines[:start]
    assert lines[-1] == f"git checkout {row['base_commit']} tests/test_pages.py"  # reset afterwards
    assert row["test_patch"] in script and "cd /testbed" in lines


def test_task_files_hold_the_bug_not_the_fix() -> None:
    row = get_task("swarl-tasks__textkit-1")
    files = task_files(row["instance_id"])
    assert 'sep: str = "_"' in files["textkit/slug.py"]
    assert {"README.md", "pyproject.toml", ".gitignore", "tests/test_slug.py"} <= set(files)
    assert not any("__pycache__" in p for p in files)
    with pytest.raises(KeyError, match="instance_id"):
        task_files("swarl-tasks__nope-1")


def test_commands_edit_the_buggy_line_on_the_host(tmp_path) -> None:
    """Fast check without Docker: the fix command restores the correct file exactly; each
    wrong command edits the same file into something else."""
    import subprocess

    from swe.tasks.generate import repo_files
    from swe.tasks.gitrepo import write_files

    for row in load_tasks():
        files = task_files(row["instance_id"])
        path = re.findall(r"^\+\+\+ b/(\S+)", row["patch"], re.M)[0]
        correct = repo_files(row["repo"].split("/", 1)[1])[path]
        for i, cmd in enumerate([row["swarl_fix_command"], *row["swarl_wrong_commands"]]):
            root = tmp_path / f"{row['instance_id']}-{i}"
            write_files(root, {path: files[path]})
            subprocess.run(["bash", "-c", cmd], cwd=root, check=True, timeout=30)
            edited = (root / path).read_text()
            assert edited != files[path], (row["instance_id"], cmd)
            assert (edited == correct) == (i == 0), (row["instance_id"], cmd)


# --- the spec files (swe/tasks/repos/<repo>.yaml) ---------------------------------------------

def test_every_repository_has_its_spec_file() -> None:
    specs = load_specs()
    assert len(specs) == 32 and {s.instance_id for s in specs} == {r["instance_id"] for r in load_tasks()}
    repos = {p.name for p in REPOS_DIR.iterdir() if p.is_dir() and not p.name.startswith(".")}
    assert {p.stem for p in REPOS_DIR.glob("*.yaml")} == repos


GOOD_TASK = """\
- n: 1
  family: off_by_one
  path: pkg/mod.py
  good: x + 1
  bad: x
  wrong: [x + 2, x - 1]
  test_path: tests/test_mod.py
  fail_to_pass: [test_it]
  tests: |
    def test_it():
        assert True
  statement: |
    It is wrong.
"""


@pytest.mark.parametrize(("text", "words"), [
    (GOOD_TASK.replace("family: off_by_one", "family: typo"), "task demo-1: field 'family': Input should be"),
    (GOOD_TASK.replace("  wrong: [x + 2, x - 1]\n", ""), "task demo-1: field 'wrong': Field required"),
    (GOOD_TASK.replace("wrong: [x + 2, x - 1]", "wrong: [x + 2]"), "task demo-1: field 'wrong': "),
    (GOOD_TASK.replace("path: pkg/mod.py", "path: ../mod.py"), "task demo-1: field 'path': Value error, must be a path"),
    (GOOD_TASK.replace("- n: 1", "- n: 0"), "task demo-0: field 'n': Input should be greater than or equal to 1"),
    (GOOD_TASK.replace("- n: 1\n", "- nn: 1\n"), "task #1: field 'n': Field required"),
    (GOOD_TASK + "  colour: red\n", "task demo-1: field 'colour': Extra inputs are not permitted"),
    (GOOD_TASK + "  repo: other\n", "task demo-1: field 'repo': given by the file's name"),
    (GOOD_TASK + GOOD_TASK, "field 'n': each task needs its own number"),
    ("- [not, a, mapping]\n", "task #1: expected a mapping of fields, got list"),
    ("n: 1\n", "expected a non-empty list of tasks, got dict"),
    ("- n: 1\n  tests: |\n bad indent\n", "not valid YAML"),
])
def test_a_bad_spec_file_names_file_task_and_field(tmp_path, text: str, words: str) -> None:
    path = tmp_path / "demo.yaml"
    path.write_text(text)
    with pytest.raises(TaskSpecError) as ei:
        load_spec_file(path)
    assert str(ei.value).startswith(f"{path}: ") and words in str(ei.value), str(ei.value)


def test_a_good_spec_file_loads() -> None:
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "demo.yaml"
        path.write_text(GOOD_TASK)
        (spec,) = load_spec_file(path)
    assert (spec.repo, spec.name, spec.instance_id) == ("demo", "demo-1", "swarl-tasks__demo-1")
    assert spec.wrong == ("x + 2", "x - 1") and spec.tests.startswith("def test_it") and not spec.heldout
