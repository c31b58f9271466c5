"""Letter grades and weighted averages."""

from __future__ import annotations

BANDS = [(90, "A"), (80, "B"), (70, "C"), (60, "D")]


def letter(score: float) -> str:
    """Letter grade for a 0-100 score: 90 and above is an A, 80 and above a B, ... below 60 an F."""
    if not 0 <= score <= 100:
        raise ValueError(f"score out of range: {score}")
    for cutoff, grade in BANDS:
        if score >= cutoff:
            return grade
    return "F"


def weighted_average(scores: dict[str, float], weights: dict[str, float]) -> float:
    """Average of `scores` (per assessment) weighted by `weights` (same keys)."""
    total_weight = sum(weights[name] for name in scores)
    return sum(scores[name] * weights[name] for name in scores) / total_weight
