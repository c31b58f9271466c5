"""One SWE row model: what a SWE-bench / SWE-Gym / bundled-task row must hold, checked in one place.

Every row swarl runs is checked by `validate_row` where it enters: `swarl data prepare`,
`swarl enqueue` and `swarl eval` (through `read_rows`), and envd's /container/evaluate (the row
an actor sends as `instance`). A bad row raises `RowError`, naming where the row is (file line
or row index), its instance_id and the field.

The rules:
- always: `instance_id` (letters, digits, `_ . -`), `problem_statement` (not empty), `repo`
  (owner/name), `FAIL_TO_PASS` (not empty) and `PASS_TO_PASS`: lists of test ids, or their
  JSON encoding as SWE-bench has them;
- `eval_script`, when the row brings one, is a non-empty string; without one, `base_commit`,
  `test_patch` and `version` are required too (the harness builds the script from them);
- every other known field, when present and not null, is a string (a float `version` is
  refused: 3.10 and 3.1 would be the same number).

The row comes back as given (field forms kept: FAIL_TO_PASS stays a JSON string when it was
one; `listed_tests` reads either form), with JSON-safe values (parquet's timestamps and arrays
converted) and `image_name` set: the Docker image is decided here, once, by
`swe.images.image_for` from the row and its data_source, and nothing downstream derives it
again.

The eval script is not fixed here, although for rows whose repo and version the swebench
harness knows it could be: it is a pure function of fields the row already carries (repo,
version, base_commit, test_patch) under the harness version pyproject pins, so fixing it early
would add nothing the row does not determine; it would copy the test patch into every row
(about 20% more bytes for SWE-bench Lite, in every queued job and replayed sample); and
building it imports swebench (about 3 s, with docker, datasets and modal) into `swarl enqueue`
and every reader of rows. envd, which imports swebench to grade anyway, builds it where it runs
it (`swe.grading.eval_script_for`).

Files: `read_rows` reads JSONL for `swarl enqueue` / `swarl eval`: one record a line, either
prepared (`{"text", "metadata": {"instance", "data_source"}}`, what `swarl data prepare`
writes) or a raw row.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from swe.images import image_for

__all__ = ["Row", "RowError", "SourceRow", "jsonl_rows", "listed_tests", "read_rows", "source_row",
           "validate_row"]

REQUIRED = ("instance_id", "problem_statement", "repo", "FAIL_TO_PASS", "PASS_TO_PASS")
# Needed to build the harness's eval script when the row brings no eval_script of its own.
SCRIPT_FIELDS = ("base_commit", "test_patch", "version")
OPTIONAL_STR = ("patch", "hints_text", "created_at", "environment_setup_commit", "image_name",
                "difficulty", "log_parser", "data_source")
_INSTANCE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$")
_REPO = re.compile(r"^[A-Za-z0-9_.\-]+/[A-Za-z0-9_.\-]+$")


class RowError(ValueError):
    """A row that cannot be used: where it is, its instance_id (when valid) and the field."""

    def __init__(self, msg: str, *, field: str | None = None, where: str | None = None,
                 instance_id: str | None = None) -> None:
        self.msg, self.field, self.where, self.instance_id = msg, field, where, instance_id
        head = " ".join(p for p in (where, f"(instance_id={instance_id})" if instance_id else None) if p)
        body = f"field {field!r}: {msg}" if field else msg
        super().__init__(f"{head}: {body}" if head else body)

    def brief(self) -> str:
        """`<where>: <field>: <msg>`, the one-line form `swarl enqueue` and `swarl eval` print."""
        return ": ".join(p for p in (self.where, self.field, self.msg) if p)

    def as_dict(self) -> dict[str, Any]:
        return {"where": self.where, "instance_id": self.instance_id, "field": self.field,
                "error": self.msg}


def listed_tests(row: dict[str, Any], key: str) -> list[str]:
    """FAIL_TO_PASS / PASS_TO_PASS as a list: a JSON-encoded string (SWE-bench) or a list (SWE-Gym)."""
    value = row.get(key)
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as e:
            raise RowError(f"not a JSON list of test ids: {e.msg}", field=key) from None
    if not isinstance(value, list | tuple):
        raise RowError(f"expected a list of test ids, got {type(value).__name__}", field=key)
    bad = [t for t in value if not isinstance(t, str) or not t]
    if bad:
        raise RowError(f"test ids must be non-empty strings, got {bad[0]!r}", field=key)
    return list(value)


def validate_row(row: Any, data_source: str | None = None, *, where: str | None = None) -> dict[str, Any]:
    """Check one raw row; return a JSON-safe copy with `image_name` set (see the module's rules).

    `data_source` (e.g. the dataset id) picks SWE-Gym or SWE-bench image naming; `where` goes
    into the RowError of a bad row."""
    if not isinstance(row, dict):
        raise RowError(f"must be a JSON object, got {type(row).__name__}", where=where)
    out = {str(k): _jsonable(v) for k, v in row.items()}
    iid = out.get("instance_id")
    iid = iid if isinstance(iid, str) and _INSTANCE_ID.match(iid) else None

    def bad(fld: str, msg: str) -> RowError:
        return RowError(msg, field=fld, where=where, instance_id=iid)

    for fld in REQUIRED:
        if out.get(fld) is None:
            raise bad(fld, "missing (a required field)")
    for fld in ("instance_id", "problem_statement", "repo", *OPTIONAL_STR, *SCRIPT_FIELDS, "eval_script"):
        if out.get(fld) is not None and not isinstance(out[fld], str):
            raise bad(fld, f"must be a string, got {type(out[fld]).__name__}")
    if iid is None:
        raise bad("instance_id", f"{out['instance_id']!r} is not a valid id (letters, digits, _ . -)")
    for fld in ("problem_statement", "repo"):
        if not out[fld].strip():
            raise bad(fld, "must not be empty")
    if not _REPO.match(out["repo"]):
        raise bad("repo", f"{out['repo']!r} is not owner/name")
    try:
        fail_to_pass = listed_tests(out, "FAIL_TO_PASS")
        listed_tests(out, "PASS_TO_PASS")
    except RowError as e:
        raise bad(e.field or "", e.msg) from None
    if not fail_to_pass:
        raise bad("FAIL_TO_PASS", "empty: nothing would show the issue resolved")
    if out.get("eval_script") is not None:
        if not out["eval_script"].strip():
            raise bad("eval_script", "must not be empty when present")
    else:
        for fld in SCRIPT_FIELDS:
            if not (out.get(fld) or "").strip():
                raise bad(fld, "missing: required to build the eval script (the row has no eval_script)")
    try:
        out["image_name"] = image_for(out, data_source)
    except ValueError as e:
        raise bad("image_name", str(e)) from None
    return out


def _jsonable(v: Any) -> Any:
    """Values from parquet / pandas (timestamps, numpy scalars and arrays) → JSON types."""
    if isinstance(v, dt.datetime | dt.date):
        return v.isoformat()
    if hasattr(v, "tolist") and not isinstance(v, str | bytes):
        return v.tolist()
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [_jsonable(x) for x in v]
    return v


# -- reading ---------------------------------------------------------------------------


@dataclass(frozen=True)
class SourceRow:
    """A raw row and where it came from, before validation."""

    where: str                # "data.jsonl line 3", "SWE-Gym/SWE-Gym[train] row 17"
    row: Any
    data_source: str | None   # a prepared record's metadata.data_source, else None


@dataclass(frozen=True)
class Row:
    """A validated row (`instance`, image_name set) and its data_source."""

    where: str
    instance: dict[str, Any]
    data_source: str


def source_row(where: str, record: Any) -> SourceRow:
    """Unwrap a prepared record ({"text", "metadata": {"instance", "data_source"}}: its
    problem_statement defaults to `text`); any other value is a raw row."""
    if not isinstance(record, dict) or "metadata" not in record:
        return SourceRow(where, record, None)
    meta = record["metadata"]
    if not isinstance(meta, dict) or not isinstance(meta.get("instance"), dict):
        raise RowError("missing or not an object", field="metadata.instance", where=where)
    instance = dict(meta["instance"])
    if "problem_statement" not in instance and isinstance(record.get("text"), str):
        instance["problem_statement"] = record["text"]
    return SourceRow(where, instance, str(meta.get("data_source") or "") or None)


def jsonl_rows(path: Path) -> Iterator[SourceRow | RowError]:
    """The records of a JSONL file, one a line (blank lines skipped); a line that is not JSON,
    or a malformed prepared record, comes as its RowError so that readers can go on."""
    for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{path.name} line {lineno}"
        try:
            yield source_row(where, json.loads(line))
        except json.JSONDecodeError as e:
            yield RowError(f"not valid JSON: {e.msg} (column {e.colno})", where=where)
        except RowError as e:
            yield e


def read_rows(path: str | Path, default_source: str | None = None,
              errors: list[RowError] | None = None) -> Iterator[Row]:
    """The valid rows of a JSONL file (prepared records or raw rows). A bad row raises its
    RowError, or, given `errors`, is appended there and skipped. A row's data_source is its
    record's, else `default_source`, else the file's name."""
    p = Path(path)
    for src in jsonl_rows(p):
        try:
            if isinstance(src, RowError):
                raise src
            source = src.data_source or default_source or p.name
            row = Row(src.where, validate_row(src.row, source, where=src.where), source)
        except RowError as e:
            if errors is None:
                raise
            errors.append(e)
            continue
        yield row
