"""Reading task rows for `swarl enqueue`: the seed's prepared JSONL ({"text", "metadata":
{"instance", "data_source"}}) or raw SWE-bench / SWE-Gym rows, one JSON object per line."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REQUIRED = ("instance_id", "problem_statement")


class RowError(ValueError):
    def __init__(self, line: int, message: str) -> None:
        super().__init__(f"line {line}: {message}")
        self.line = line


@dataclass
class Row:
    line: int
    instance: dict[str, Any]
    data_source: str


def parse_row(line_no: int, text: str, default_source: str) -> Row:
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:
        raise RowError(line_no, f"not valid JSON: {e.msg} (column {e.colno})") from None
    if not isinstance(obj, dict):
        raise RowError(line_no, f"expected a JSON object, got {type(obj).__name__}")
    source = default_source
    if "metadata" in obj:  # the seed's prepared format
        meta = obj["metadata"]
        if not isinstance(meta, dict) or not isinstance(meta.get("instance"), dict):
            raise RowError(line_no, "metadata.instance: missing or not an object")
        inst = dict(meta["instance"])
        source = str(meta.get("data_source") or default_source)
        if "problem_statement" not in inst and isinstance(obj.get("text"), str):
            inst["problem_statement"] = obj["text"]
    else:
        inst = dict(obj)
    for f in REQUIRED:
        if not isinstance(inst.get(f), str) or not inst[f].strip():
            raise RowError(line_no, f"{f}: missing or not a non-empty string")
    try:
        from envd.swe_eval import normalize_instance  # one validator for SWE rows
    except ImportError:  # pragma: no cover - envd is part of the package
        normalize_instance = None
    if normalize_instance is not None:
        try:
            inst = normalize_instance(inst)
        except ValueError as e:
            raise RowError(line_no, f"{inst.get('instance_id')}: {e}") from None
    return Row(line_no, inst, source)


def read_rows(path: str | Path, skip_bad: bool, errors: list[RowError]) -> Iterator[Row]:
    """Yield valid rows; bad ones are appended to `errors` (skip_bad) or raised."""
    p = Path(path)
    for i, text in enumerate(p.read_text().splitlines(), start=1):
        if not text.strip():
            continue
        try:
            yield parse_row(i, text, p.name)
        except RowError as e:
            if not skip_bad:
                raise
            errors.append(e)
