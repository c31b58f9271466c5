"""swe.rows: the one SWE row validator (bad rows named by where, instance_id and field;
image_name set once) and the JSONL reader of `swarl enqueue` / `swarl eval`."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

import pytest

from swe.rows import RowError, listed_tests, read_rows, validate_row
from swe.tasks import load_tasks


def _row(**over: Any) -> dict[str, Any]:
    row = {
        "repo": "sympy/sympy", "instance_id": "sympy__sympy-1", "base_commit": "abc123",
        "problem_statement": "x", "patch": "", "test_patch": "diff --git a/x b/x\n", "version": "1.7",
        "environment_setup_commit": "abc123",
        "FAIL_TO_PASS": '["test_a"]', "PASS_TO_PASS": '["test_b", "test_c"]',
    }
    row.update(over)
    return row


def _error(row: Any, **kw: Any) -> RowError:
    with pytest.raises(RowError) as ei:
        validate_row(row, **kw)
    return ei.value


# --- the rules ------------------------------------------------------------------------------

def test_accepts_json_strings_and_lists_and_keeps_their_form() -> None:
    swe_bench = validate_row(_row())
    swe_gym = validate_row(_row(FAIL_TO_PASS=["test_a"], PASS_TO_PASS=["test_b", "test_c"]))
    assert swe_bench["FAIL_TO_PASS"] == '["test_a"]' and swe_gym["FAIL_TO_PASS"] == ["test_a"]
    for row in (swe_bench, swe_gym):
        assert listed_tests(row, "FAIL_TO_PASS") == ["test_a"]
        assert listed_tests(row, "PASS_TO_PASS") == ["test_b", "test_c"]


def test_does_not_modify_its_input_and_refuses_a_float_version() -> None:
    row = _row()
    out = validate_row(row)
    assert "image_name" not in row and out["image_name"] and out is not row
    e = _error(_row(version=1.7))  # 3.10 and 3.1 would be the same number
    assert e.field == "version" and "must be a string" in e.msg


@pytest.mark.parametrize("field", ["instance_id", "problem_statement", "repo", "FAIL_TO_PASS", "PASS_TO_PASS"])
def test_names_a_missing_field(field: str) -> None:
    row = _row()
    del row[field]
    e = _error(row, where="d.jsonl line 3")
    assert e.field == field and e.msg.startswith("missing")
    assert str(e).startswith("d.jsonl line 3") and f"field {field!r}: missing" in str(e)
    if field != "instance_id":
        assert e.instance_id == "sympy__sympy-1" and "(instance_id=sympy__sympy-1)" in str(e)


@pytest.mark.parametrize("field", ["base_commit", "test_patch", "version"])
def test_needs_script_fields_without_eval_script(field: str) -> None:
    row = _row()
    del row[field]
    e = _error(row)
    assert e.field == field and "required to build the eval script" in e.msg
    validate_row({**row, "eval_script": "echo hi"})  # a row with its own script is fine


@pytest.mark.parametrize(("over", "field", "words"), [
    ({"FAIL_TO_PASS": "[test_a"}, "FAIL_TO_PASS", "not a JSON list"),
    ({"FAIL_TO_PASS": []}, "FAIL_TO_PASS", "empty"),
    ({"PASS_TO_PASS": [1, 2]}, "PASS_TO_PASS", "test ids must be non-empty strings"),
    ({"PASS_TO_PASS": {"a": 1}}, "PASS_TO_PASS", "expected a list"),
    ({"repo": ""}, "repo", "must not be empty"),
    ({"repo": "no-slash"}, "repo", "owner/name"),
    ({"problem_statement": "  "}, "problem_statement", "must not be empty"),
    ({"base_commit": 123}, "base_commit", "must be a string"),
    ({"image_name": ["x"]}, "image_name", "must be a string"),
    ({"eval_script": " "}, "eval_script", "must not be empty"),
    ({"instance_id": "bad id/with slash"}, "instance_id", "not a valid id"),
])
def test_names_a_malformed_field(over: dict[str, Any], field: str, words: str) -> None:
    e = _error(_row(**over))
    assert e.field == field and words in e.msg, str(e)
    assert e.instance_id == (None if field == "instance_id" else "sympy__sympy-1")


def test_a_row_must_be_an_object() -> None:
    e = _error(["not", "a", "row"], where="d.json row 4")
    assert e.field is None and str(e) == "d.json row 4: must be a JSON object, got list"


# --- image_name -----------------------------------------------------------------------------

def test_image_name_is_set_once_from_the_row_and_its_data_source() -> None:
    swe_bench = validate_row(_row())
    assert swe_bench["image_name"] == "docker.io/swebench/sweb.eval.x86_64.sympy_1776_sympy-1:latest"
    gym = _row(instance_id="getmoto__moto-5752", repo="getmoto/moto")
    assert validate_row(gym, "SWE-Gym/SWE-Gym")["image_name"] == \
        "docker.io/xingyaoww/sweb.eval.x86_64.getmoto_s_moto-5752:latest"
    own = validate_row(_row(image_name="reg.local/custom:1"), "SWE-Gym/SWE-Gym")
    assert own["image_name"] == "reg.local/custom:1"
    assert validate_row(own) == own  # validating again changes nothing
    for task in load_tasks():
        assert validate_row(task, "swarl-tasks") == task  # bundled rows carry theirs already


def test_values_become_json_types() -> None:
    when = dt.datetime(2024, 1, 2, 3, 4, 5)
    out = validate_row(_row(created_at=when, FAIL_TO_PASS=("test_a",)))
    assert out["created_at"] == "2024-01-02T03:04:05" and out["FAIL_TO_PASS"] == ["test_a"]
    json.dumps(out)


# --- reading JSONL --------------------------------------------------------------------------

def _write(path: Path, lines: list[Any]) -> Path:
    path.write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines))
    return path


def test_read_rows_prepared_and_raw_records(tmp_path: Path) -> None:
    raw = _row(instance_id="a__a-1")
    prepared_row = _row(instance_id="a__a-2", repo="getmoto/moto")
    del prepared_row["problem_statement"]  # a prepared record's text stands in for it
    prepared = {"text": "the issue", "metadata": {"instance": prepared_row, "data_source": "SWE-Gym/SWE-Gym"}}
    rows = list(read_rows(_write(tmp_path / "d.jsonl", [raw, "", prepared])))
    assert [r.where for r in rows] == ["d.jsonl line 1", "d.jsonl line 3"]
    assert [r.data_source for r in rows] == ["d.jsonl", "SWE-Gym/SWE-Gym"]
    assert rows[0].instance == validate_row(raw)
    assert rows[1].instance["problem_statement"] == "the issue"
    assert rows[1].instance["image_name"].startswith("docker.io/xingyaoww/")
    assert next(read_rows(tmp_path / "d.jsonl", default_source="x/y")).data_source == "x/y"


def test_read_rows_bad_lines_raise_or_are_collected(tmp_path: Path) -> None:
    path = _write(tmp_path / "d.jsonl", [
        _row(instance_id="a__a-1"), "{not json", {"instance_id": "x"},
        {"text": "t", "metadata": {"instance": "nope"}}, _row(instance_id="a__a-2"),
    ])
    with pytest.raises(RowError) as ei:
        list(read_rows(path))
    assert ei.value.where == "d.jsonl line 2" and "not valid JSON" in ei.value.msg
    errors: list[RowError] = []
    rows = list(read_rows(path, errors=errors))
    assert [r.instance["instance_id"] for r in rows] == ["a__a-1", "a__a-2"]
    assert [(e.where, e.field) for e in errors] == [
        ("d.jsonl line 2", None), ("d.jsonl line 3", "problem_statement"),  # read as SWE-bench's format
        ("d.jsonl line 4", "metadata.instance")]
    assert errors[1].brief().startswith("d.jsonl line 3: problem_statement: missing")
    with pytest.raises(FileNotFoundError):
        list(read_rows(tmp_path / "absent.jsonl"))
