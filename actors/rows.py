"""Rows that reach the actors straight from a file (slime's sample metadata, `swarl eval
--data`) are checked here, once, before any episode: a SWE row with its `image_name` set."""

from __future__ import annotations

from typing import Any


def file_row(row: Any, data_source: str | None = None) -> dict[str, Any]:
    """The row, validated by envd's row model, with `image_name`; a ValueError (envd's
    RowError) naming the first bad field."""
    from envd.rows import validate_row

    return validate_row(row, data_source)
