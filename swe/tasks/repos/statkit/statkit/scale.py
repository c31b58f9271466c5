"""Rescaling values."""

from __future__ import annotations

from collections.abc import Sequence


def clamp(value: float, low: float, high: float) -> float:
    if low > high:
        raise ValueError("low must not exceed high")
    return max(low, min(value, high))


def normalize(values: Sequence[float]) -> list[float]:
    """Scale values to 0..1; all zeros when every value is the same; [] for no values."""
    lo, hi = min(values, default=0), max(values, default=0)
    span = hi - lo
    return [(v - lo) / span if span else 0.0 for v in values]
