"""Summary statistics for sequences of numbers."""

from __future__ import annotations

import math
from collections.abc import Sequence


def mean(values: Sequence[float]) -> float:
    if not values:
        raise ValueError("mean of an empty sequence")
    return sum(values) / len(values)


def median(values: Sequence[float]) -> float:
    if not values:
        raise ValueError("median of an empty sequence")
    ordered = sorted(values)
    mid = len(ordered) // 2
    if len(ordered) % 2:
        return ordered[mid]
    return (ordered[mid - 1] + ordered[mid]) / 2


def variance(values: Sequence[float], sample: bool = True) -> float:
    """Sample variance (divides by n - 1) by default; population variance with sample=False."""
    m = mean(values)
    n = len(values) - 1 if sample else len(values)
    return sum((v - m) ** 2 for v in values) / n


def stdev(values: Sequence[float], sample: bool = True) -> float:
    return math.sqrt(variance(values, sample=sample))


def mean_ignoring_missing(values: Sequence[float | None]) -> float | None:
    """Mean of the values that are present (not None); None when no value is present."""
    present = [v for v in values if v is not None]
    return mean(present) if present else None
