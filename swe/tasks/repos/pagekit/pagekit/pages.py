"""Offset pagination of sequences."""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from typing import TypeVar

T = TypeVar("T")


def page_count(total: int, per_page: int = 20) -> int:
    """How many pages `total` items fill."""
    if per_page <= 0:
        raise ValueError("per_page must be positive")
    return math.ceil(total / per_page)


def paginate(items: Sequence[T], page: int = 1, per_page: int = 20) -> list[T]:
    """The items of 1-based `page`; an empty list past the last page."""
    if page < 1:
        raise ValueError("page must be >= 1")
    start = (page - 1) * per_page
    return list(items[start : start + per_page])


def iter_pages(items: Sequence[T], per_page: int = 20) -> Iterator[list[T]]:
    """Every page of `items`, in order."""
    for page in range(1, page_count(len(items), per_page) + 1):
        yield paginate(items, page, per_page)
