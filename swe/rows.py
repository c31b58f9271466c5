"""Checking a SWE row where it enters swarl, whatever dataset it comes from.

Every row swarl runs is checked by `validate_row` where it enters: `swarl data prepare`,
`swarl enqueue` and `swarl eval` (through `read_rows`), and envd's /container/evaluate (the row
an actor sends as `instance`). A bad row raises `RowError`, naming where the row is (file line
or row index), its instance_id and the field.

The rules are the row's dataset family's (swe.adapters: SWE-bench, SWE-Gym, SWE-smith, R2E-Gym,
swarl's own tasks, and any adapter added there): its pydantic row model and cross-field checks.
Which family: the `family` argument, else a `data_source` that names one exactly (a family, an
alias or a dataset id an adapter lists), else the row's own `dataset_family`, else its shape
(swe.adapters.base says how; never a substring of a source name).

The row comes back as given (field forms kept: FAIL_TO_PASS stays a JSON string when it was
one; `listed_tests` reads either form), with JSON-safe values (parquet's timestamps and arrays
converted), fields the family derives filled (R2E-Gym's instance_id, ...), `image_name` set (the
Docker image is decided here, once, by the adapter, and nothing downstream derives it again) and
`dataset_family` set, so that envd grades it by the same adapter without guessing.

The eval script is not fixed here, although for rows whose repo and version the swebench
harness knows it could be: it is a pure function of fields the row already carries (repo,
version, base_commit, test_patch) under the harness version pyproject pins, so fixing it early
would add nothing the row does not determine; it would copy the test patch into every row
(about 20% more bytes for SWE-bench Lite, in every queued job and replayed sample); and
building it imports swebench (about 3 s, with docker, datasets and modal) into `swarl enqueue`
and every reader of rows. envd, which imports swebench to grade anyway, builds it where it runs
it (`swe.harness.eval_script_for`).

Files: `read_rows` reads JSONL for `swarl enqueue` / `swarl eval`: one record a line, either
prepared (`{"text", "metadata": {"instance", "data_source"}}`, what `swarl data prepare`
writes) or a raw row.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from swe.adapters import adapter_for
from swe.schema import RowError, listed_tests, valid_instance_id

__all__ = ["REQUIRED", "Row", "RowError", "SourceRow", "jsonl_rows", "listed_tests", "read_rows", "source_row",
           "validate_row"]

# What every row has once its adapter has normalised it, whichever the family.
REQUIRED = ("instance_id", "problem_statement", "repo", "FAIL_TO_PASS", "PASS_TO_PASS")


def validate_row(row: Any, data_source: str | None = None, *, family: str | None = None,
                 where: str | None = None) -> dict[str, Any]:
    """Check one raw row by its family's adapter; return a JSON-safe copy with `image_name` and
    `dataset_family` set (see the module's rules). `family` names the family (an unknown name
    is an error); `data_source` picks it only when it names one exactly; `where` goes into the
    RowError of a bad row."""
    if not isinstance(row, dict):
        raise RowError(f"must be a JSON object, got {type(row).__name__}", where=where)
    iid = row.get("instance_id")
    iid = iid if isinstance(iid, str) and valid_instance_id(iid) else None
    try:
        adapter = adapter_for(row, family, data_source)
    except RowError as e:
        raise RowError(e.msg, field=e.field, where=where, instance_id=iid) from None
    return adapter.validate(row, where=where)


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
              errors: list[RowError] | None = None, family: str | None = None) -> Iterator[Row]:
    """The valid rows of a JSONL file (prepared records or raw rows). A bad row raises its
    RowError, or, given `errors`, is appended there and skipped. A row's data_source is its
    record's, else `default_source`, else the file's name; `family` reads every row as that
    dataset family."""
    p = Path(path)
    for src in jsonl_rows(p):
        try:
            if isinstance(src, RowError):
                raise src
            source = src.data_source or default_source or p.name
            row = Row(src.where, validate_row(src.row, source, family=family, where=src.where), source)
        except RowError as e:
            if errors is None:
                raise
            errors.append(e)
            continue
        yield row
