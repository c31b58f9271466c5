"""URL slugs."""

from __future__ import annotations

import re

_NON_WORD = re.compile(r"[^a-z0-9]+")


def slugify(text: str, sep: str = "-", max_length: int = 60) -> str:
    """Lower-case `text`, join its words with `sep` and cut it to `max_length` characters."""
    slug = _NON_WORD.sub(sep, text.lower()).strip(sep)
    return slug[:max_length].rstrip(sep)
