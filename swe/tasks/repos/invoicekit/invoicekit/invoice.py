"""Invoice totals: subtotal, coupon, then tax."""

from __future__ import annotations

from invoicekit.discounts import apply_coupon
from invoicekit.items import LineItem, subtotal


def invoice_total(items: list[LineItem], tax_rate: float | None = 0.2, coupon: dict | None = None) -> float:
    """Subtotal after the coupon, plus tax; tax_rate None means the customer is tax-exempt."""
    net = apply_coupon(subtotal(items), coupon)
    rate = tax_rate if tax_rate is not None else 0.0
    return round(net * (1 + rate), 2)
