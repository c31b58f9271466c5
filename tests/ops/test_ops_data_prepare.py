"""`swarl data prepare` on the real SWE-bench Lite rows and on bad rows built here."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from common.services import free_port
from swarl.data_prepare import DataError, prepare
from swe.rows import validate_row

REPO = Path(__file__).resolve().parents[2]
LITE = REPO.parent / "shared" / "data" / "swe-bench-lite-test.json"
SWARL = str(Path(sys.executable).parent / "swarl")

needs_lite = pytest.mark.skipif(not LITE.exists(), reason=f"real SWE-bench Lite rows not at {LITE}")


def lite_rows() -> list[dict]:
    return json.loads(LITE.read_text())


def gym_row(**over) -> dict:
    """A SWE-Gym-shaped row: test lists are real lists, no environment_setup_commit."""
    row = {
        "repo": "getmoto/moto", "instance_id": "getmoto__moto-5752", "base_commit": "b2300f1eae1",
        "patch": "diff --git a/x b/x\n", "test_patch": "diff --git a/t b/t\n",
        "problem_statement": "Ünïcode problem — keep me as is", "hints_text": "",
        "created_at": "2022-12-09T21:08:56Z", "version": "4.0",
        "FAIL_TO_PASS": ["tests/test_x.py::test_a"], "PASS_TO_PASS": [],
    }
    row.update(over)
    return row


def run_cli(*args: str, env: dict | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([SWARL, "data", "prepare", *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})}, cwd=REPO)


@needs_lite
def test_lite_file_to_prepared_records_with_exports(tmp_path):
    out = tmp_path / "out"
    p = run_cli("--source", str(LITE), "--split", "test", "--out", str(out),
                "--repo", "sympy/sympy", "--repo", "pytest", "--max-samples", "20")
    assert p.returncode == 0, p.stderr
    summary = json.loads(p.stdout.strip().splitlines()[-1])
    assert summary["rows_written"] == 20 and summary["errors"] == 0

    rows = {r["instance_id"]: r for r in lite_rows()}
    lines = (out / "test.jsonl").read_text().splitlines()
    assert len(lines) == 20
    ids = []
    for line in lines:
        rec = json.loads(line)
        inst = rec["metadata"]["instance"]
        # every field of the real row, unchanged (FAIL_TO_PASS stays a JSON string), plus its image and family
        assert inst == {**rows[inst["instance_id"]], "image_name": inst["image_name"], "dataset_family": "swe-bench"}
        assert rec["text"] == inst["problem_statement"]
        assert rec["metadata"]["data_source"] == "swe-bench-lite-test"
        assert inst["repo"] in ("sympy/sympy", "pytest-dev/pytest")
        ids.append(inst["instance_id"])
    assert (out / "instance_ids.txt").read_text().split() == ids

    images = (out / "docker_images.txt").read_text().split()
    assert len(images) == 20
    sympy_id = next(i for i in ids if i.startswith("sympy__"))
    want = f"docker.io/swebench/sweb.eval.x86_64.{sympy_id.replace('__', '_1776_')}:latest"
    assert want in images

    evals = [json.loads(x) for x in (out / "eval.jsonl").read_text().splitlines()]
    assert [e["metadata"]["instance"]["instance_id"] for e in evals] == ids
    assert all(e["metadata"]["image"] == e["metadata"]["instance"]["image_name"] in images for e in evals)
    report = json.loads((out / "prepare.json").read_text())
    assert report["repos"]["sympy/sympy"] + report["repos"].get("pytest-dev/pytest", 0) == 20


@needs_lite
def test_all_lite_rows_validate_and_counts_match():
    rows = lite_rows()
    for i, row in enumerate(rows):
        validate_row(row, where=f"row {i}")
    assert len({r["instance_id"] for r in rows}) == 300


def test_gym_rows_with_list_tests_and_unicode(tmp_path):
    src = tmp_path / "gym.jsonl"
    rows = [gym_row(), gym_row(instance_id="python__mypy-1", repo="python/mypy",
                               FAIL_TO_PASS=["a"], PASS_TO_PASS=["b", "c"])]
    src.write_text("\n".join(json.dumps(r, ensure_ascii=False) for r in rows) + "\n")
    res = prepare(str(src), tmp_path / "o", data_source="SWE-Gym/SWE-Gym")
    assert res.rows_written == 2 and res.split == "train"
    text = (tmp_path / "o" / "train.jsonl").read_text(encoding="utf-8")
    assert "Ünïcode problem — keep me as is" in text  # ensure_ascii off
    rec = json.loads(text.splitlines()[0])
    image = "docker.io/xingyaoww/sweb.eval.x86_64.getmoto_s_moto-5752:latest"
    assert rec["metadata"] == {"instance": {**rows[0], "image_name": image, "dataset_family": "swe-gym"},
                              "data_source": "SWE-Gym/SWE-Gym"}
    assert (tmp_path / "o" / "docker_images.txt").read_text().split()[0] == image


def test_parquet_and_prepared_inputs(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [gym_row(image_name=None),
            gym_row(instance_id="getmoto__moto-2", image_name="reg.local/moto:2")]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "d.parquet")
    res = prepare(str(tmp_path / "d.parquet"), tmp_path / "a")
    assert res.rows_written == 2
    assert (tmp_path / "a" / "docker_images.txt").read_text().split()[1] == "reg.local/moto:2"
    # a prepared file is a valid input too (re-filter it); its data_source is kept
    res2 = prepare(str(tmp_path / "a" / "train.jsonl"), tmp_path / "b", max_samples=1)
    assert res2.rows_written == 1
    rec = json.loads((tmp_path / "b" / "train.jsonl").read_text())
    assert rec["metadata"]["data_source"] == "d"
    assert rec["metadata"]["instance"]["instance_id"] == "getmoto__moto-5752"


BAD_ROWS = [
    ({"FAIL_TO_PASS": None}, "FAIL_TO_PASS", "missing"),
    ({"FAIL_TO_PASS": "not json ["}, "FAIL_TO_PASS", "JSON"),
    ({"FAIL_TO_PASS": "[]"}, "FAIL_TO_PASS", "empty"),
    ({"PASS_TO_PASS": [1, 2]}, "PASS_TO_PASS", "string"),
    ({"PASS_TO_PASS": {"a": 1}}, "PASS_TO_PASS", "list"),
    ({"repo": "no-slash"}, "repo", "owner/name"),
    ({"base_commit": 123}, "base_commit", "string"),
    ({"problem_statement": "  "}, "problem_statement", "empty"),
    ({"version": 4.0}, "version", "string"),
    ({"instance_id": "bad id/with slash"}, "instance_id", "valid id"),
]


@pytest.mark.parametrize(("over", "field", "words"), BAD_ROWS)
def test_bad_row_names_row_and_field(tmp_path, over, field, words):
    src = tmp_path / "bad.jsonl"
    src.write_text(json.dumps(gym_row(instance_id="ok__ok-1")) + "\n"
                   + json.dumps(gym_row(**over)) + "\n")
    with pytest.raises(DataError) as ei:
        prepare(str(src), tmp_path / "o")
    msg = str(ei.value)
    assert "bad.jsonl line 2" in msg and f"field {field!r}" in msg and words in msg
    if field != "instance_id":
        assert "instance_id=getmoto__moto-5752" in msg
    assert not (tmp_path / "o").exists()  # fail mode writes nothing


def test_skip_mode_writes_valid_rows_and_errors(tmp_path):
    src = tmp_path / "mixed.jsonl"
    src.write_text("\n".join([
        json.dumps(gym_row(instance_id="a__a-1")),
        "{not json",
        json.dumps(gym_row(instance_id="a__a-2", test_patch=None)),
        json.dumps(gym_row(instance_id="a__a-1")),  # duplicate
        json.dumps(["not", "an", "object"]),
        json.dumps(gym_row(instance_id="a__a-3")),
    ]) + "\n")
    with pytest.raises(DataError) as ei:
        prepare(str(src), tmp_path / "f")
    assert "4 invalid row(s)" in str(ei.value)
    res = prepare(str(src), tmp_path / "o", on_error="skip")
    assert (res.rows_written, res.errors) == (2, 4)
    assert (tmp_path / "o" / "instance_ids.txt").read_text().split() == ["a__a-1", "a__a-3"]
    errs = [json.loads(x) for x in (tmp_path / "o" / "errors.jsonl").read_text().splitlines()]
    assert [(e["where"], e["field"]) for e in errs] == [
        ("mixed.jsonl line 2", None), ("mixed.jsonl line 3", "test_patch"),
        ("mixed.jsonl line 4", "instance_id"), ("mixed.jsonl line 5", None)]
    assert "duplicate of mixed.jsonl line 1" in errs[2]["error"]
    # a clean run into the same directory leaves no stale errors.jsonl behind
    clean = tmp_path / "clean.jsonl"
    clean.write_text(json.dumps(gym_row(instance_id="a__a-7")) + "\n")
    prepare(str(clean), tmp_path / "o", split="train[:10]")
    assert not (tmp_path / "o" / "errors.jsonl").exists()
    assert (tmp_path / "o" / "train__10_.jsonl").exists()


def test_cli_bad_input_exit_2_and_clear(tmp_path):
    src = tmp_path / "bad.json"
    src.write_text(json.dumps([gym_row(), gym_row(instance_id="x__y-1", FAIL_TO_PASS=7)]))
    p = run_cli("--source", str(src), "--out", str(tmp_path / "o"))
    assert p.returncode == 2
    assert "bad.json row 1 (instance_id=x__y-1): field 'FAIL_TO_PASS'" in p.stderr
    p = run_cli("--source", str(src), "--out", str(tmp_path / "o"), "--on-error", "maybe")
    assert p.returncode == 2 and "--on-error" in p.stderr
    p = run_cli("--source", str(tmp_path / "missing.jsonl"), "--out", str(tmp_path / "o"))
    assert p.returncode == 2 and "no such file" in p.stderr
    p = run_cli("--source", str(src), "--out", str(tmp_path / "o"), "--repo", "nothing/here",
                "--on-error", "skip")
    assert p.returncode == 2 and "no rows left" in p.stderr


def test_hub_dataset_unreachable_fails_fast_and_clearly(tmp_path):
    # An endpoint where nothing listens stands in for "no internet" deterministically.
    env = {"HF_ENDPOINT": f"http://127.0.0.1:{free_port()}", "HF_HOME": str(tmp_path / "hf")}
    t0 = time.monotonic()
    p = run_cli("--source", "princeton-nlp/SWE-bench_Lite", "--out", str(tmp_path / "o"), env=env)
    assert p.returncode == 2
    assert "princeton-nlp/SWE-bench_Lite" in p.stderr and "not reachable" in p.stderr
    assert "split 'test'" in p.stderr  # the dataset's default split
    assert time.monotonic() - t0 < 30


def test_bundled_tasks_by_name_and_by_file(tmp_path):
    tasks = pytest.importorskip("swe.tasks")
    if not tasks.TASKS_JSONL.exists():
        pytest.skip("bundled tasks not generated")
    train = prepare("swarl-tasks", tmp_path / "t", split="train")
    held = prepare("swarl-tasks", tmp_path / "h", split="heldout")
    assert train.rows_written == len(tasks.load_tasks("train"))
    assert held.rows_written == len(tasks.load_tasks("heldout")) > 0
    train_ids = set((tmp_path / "t" / "instance_ids.txt").read_text().split())
    held_ids = set((tmp_path / "h" / "instance_ids.txt").read_text().split())
    assert train_ids and not train_ids & held_ids
    rec = json.loads((tmp_path / "h" / "heldout.jsonl").read_text().splitlines()[0])
    assert rec["metadata"]["data_source"] == "swarl-tasks"
    assert rec["metadata"]["instance"] == tasks.get_task(rec["metadata"]["instance"]["instance_id"])
    images = (tmp_path / "h" / "docker_images.txt").read_text().split()
    assert all(img == tasks.get_task(i)["image_name"] for img, i in
               zip(images, (tmp_path / "h" / "instance_ids.txt").read_text().split(), strict=True))
    # the same rows from the file itself
    res = prepare(str(tasks.TASKS_JSONL), tmp_path / "f")
    assert res.rows_written == len(tasks.load_tasks("all"))
    with pytest.raises(DataError, match="--split"):
        prepare("swarl-tasks", tmp_path / "x", split="test")


@needs_lite
def test_prepared_files_are_read_by_enqueue(tmp_path):
    """The consumer's reader (`swarl enqueue`, `swarl eval`) takes every prepared line."""
    from swe.rows import read_rows

    prepare(str(LITE), tmp_path / "o", split="test", max_samples=40)
    for name in ("test.jsonl", "eval.jsonl"):
        errors: list = []
        rows = list(read_rows(tmp_path / "o" / name, errors=errors))
        assert len(rows) == 40 and not errors
        assert {r.data_source for r in rows} == {"swe-bench-lite-test"}
        assert rows[0].instance["FAIL_TO_PASS"]  # checked by the reader (a JSON list of test ids)
        assert rows[0].instance["image_name"].startswith("docker.io/swebench/")
