"""Clock times as minutes after midnight."""

from __future__ import annotations


def parse_time(text: str) -> int:
    """Parse "HH:MM" (24-hour clock) into minutes after midnight."""
    hours, minutes = text.strip().split(":")
    h, m = int(hours), int(minutes)
    if not (0 <= h < 24 and 0 <= m < 60):
        raise ValueError(f"not a clock time: {text!r}")
    return h * 60 + m


def format_time(minutes: int) -> str:
    minutes %= 24 * 60
    return f"{minutes // 60:02d}:{minutes % 60:02d}"


def add_minutes(text: str, delta: int) -> str:
    return format_time(parse_time(text) + delta)
