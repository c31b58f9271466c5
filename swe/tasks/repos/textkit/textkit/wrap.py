"""Truncating and wrapping text."""

from __future__ import annotations


def truncate(text: str, width: int, placeholder: str = "...") -> str:
    """Cut `text` to at most `width` characters, ending with `placeholder` when it was cut."""
    if len(text) <= width:
        return text
    return text[: width - len(placeholder)] + placeholder


def wrap(text: str, width: int = 72) -> list[str]:
    """Greedy word wrap into lines of at most `width` characters (longer words stand alone)."""
    lines: list[str] = []
    current = ""
    for word in text.split():
        if current and len(current) + 1 + len(word) > width:
            lines.append(current)
            current = word
        else:
            current = f"{current} {word}" if current else word
    if current:
        lines.append(current)
    return lines


def word_count(text: str) -> int:
    return len(text.split())
