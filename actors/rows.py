"""Rows that reach the actors straight from a file (slime's sample metadata, `swarl eval
--data`) are checked here, once, before any episode: a SWE row with its `image_name` set."""

from __future__ import annotations

from typing import Any


def file_row(row: Any, data_source: str | None = None) -> dict[str, Any]:
    """The row, validated, with `image_name`; a ValueError naming the first bad field."""
    # envd's row check and image naming: the one call to switch to envd/rows.py's validator
    from envd.images import image_for
    from envd.swe_eval import normalize_instance

    out = normalize_instance(row)
    if not out.get("image_name"):
        out["image_name"] = image_for(out, data_source)
    return out
