"""Purchase orders for low stock."""

from __future__ import annotations

from stockroom.inventory import Inventory


def reorder_quantity(inventory: Inventory, sku: str, target: int = 20) -> int:
    """Units to order to bring `sku` back up to `target` (never negative)."""
    return max(target - inventory.count(sku), 0)


def purchase_order(inventory: Inventory, supplier: str | None = None, target: int = 20) -> dict:
    """One order line per low-stock SKU; without a supplier the order goes to "default"."""
    lines = {sku: reorder_quantity(inventory, sku, target) for sku in inventory.low_stock()}
    return {"supplier": supplier or "default", "lines": lines}
