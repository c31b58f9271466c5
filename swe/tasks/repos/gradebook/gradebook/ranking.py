"""Class rankings."""

from __future__ import annotations


def rank(students: dict[str, float]) -> list[tuple[str, float]]:
    """(name, score) pairs, best score first; equal scores in name order."""
    return sorted(students.items(), key=lambda kv: (-kv[1], kv[0]))


def top_n(students: dict[str, float], n: int = 3) -> list[str]:
    """Names of the `n` best students."""
    return [name for name, _ in rank(students)[:n]]
