"""Cursor pagination for APIs that return pages of records."""

from __future__ import annotations

from collections.abc import Sequence


def next_cursor(records: Sequence[dict], key: str = "id") -> str | None:
    """The cursor for the page after `records`: the last record's key, None for an empty page."""
    return str(records[-1][key]) if records else None


def after(records: Sequence[dict], cursor: str | None, key: str = "id") -> list[dict]:
    """The records that come after `cursor` (all of them when cursor is None)."""
    if cursor is None:
        return list(records)
    keys = [str(r[key]) for r in records]
    return list(records[keys.index(cursor) + 1 :]) if cursor in keys else []
