"""Discount rules applied to an invoice subtotal."""

from __future__ import annotations


def percent_off(amount: float, percent: float) -> float:
    """`amount` reduced by `percent` per cent (0-100)."""
    if not 0 <= percent <= 100:
        raise ValueError(f"percent must be within 0..100, got {percent}")
    return round(amount * (1 - percent / 100), 2)


def bulk_discount(quantity: int, threshold: int = 10, percent: float = 5.0) -> float:
    """The discount percentage earned by ordering `quantity` units (`threshold` or more)."""
    return percent if quantity >= threshold else 0.0


def apply_coupon(amount: float, coupon: dict | None) -> float:
    """Apply a coupon {"kind": "percent" | "fixed", "value": x}; None means no coupon."""
    if coupon is None:
        return amount
    if coupon["kind"] == "percent":
        return percent_off(amount, coupon["value"])
    return round(max(amount - coupon["value"], 0.0), 2)
