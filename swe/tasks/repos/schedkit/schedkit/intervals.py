"""Meetings as half-open (start, end) minute intervals."""

from __future__ import annotations

Interval = tuple[int, int]


def duration(start: int, end: int) -> int:
    """Length in minutes; an end before the start wraps past midnight."""
    return end - start if end >= start else end + 24 * 60 - start


def overlaps(a: Interval, b: Interval) -> bool:
    """True when [a0, a1) and [b0, b1) share some time."""
    return a[0] < b[1] and b[0] < a[1]


def merge(intervals: list[Interval]) -> list[Interval]:
    """Merge overlapping or touching intervals; the result is sorted by start."""
    merged: list[Interval] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def busy_until(intervals: list[Interval], default: int = 0) -> int:
    """When the last interval ends; `default` for an empty schedule."""
    return max((end for _, end in intervals), default=default)
