"""An in-memory stock ledger."""

from __future__ import annotations


class OutOfStock(Exception):
    """More units were requested than are on hand."""


class Inventory:
    def __init__(self, reorder_level: int = 5) -> None:
        self.reorder_level = reorder_level
        self._stock: dict[str, int] = {}

    def add(self, sku: str, quantity: int = 1) -> int:
        if quantity <= 0:
            raise ValueError("quantity must be positive")
        self._stock[sku] = self._stock.get(sku, 0) + quantity
        return self._stock[sku]

    def remove(self, sku: str, quantity: int = 1) -> int:
        available = self._stock.get(sku, 0)
        if quantity > available:
            raise OutOfStock(f"{sku}: {quantity} requested, {available} available")
        self._stock[sku] = available - quantity
        return self._stock[sku]

    def count(self, sku: str) -> int:
        return self._stock.get(sku, 0)

    def needs_reorder(self, sku: str) -> bool:
        """True when the count has fallen to the reorder level or below."""
        return self.count(sku) <= self.reorder_level

    def low_stock(self) -> list[str]:
        """The SKUs that need reordering, sorted."""
        return sorted(sku for sku in self._stock if self.needs_reorder(sku))
