"""Line items and their totals."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LineItem:
    sku: str
    unit_price: float
    quantity: int = 1


def line_total(item: LineItem) -> float:
    return round(item.unit_price * item.quantity, 2)


def subtotal(items: list[LineItem]) -> float:
    return round(sum(line_total(item) for item in items), 2)


def average_unit_price(items: list[LineItem]) -> float:
    """Mean price per unit across the invoice; 0.0 for an invoice without units."""
    units = sum(item.quantity for item in items)
    return round(subtotal(items) / units, 2) if units else 0.0
