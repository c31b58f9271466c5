import pytest

from stockroom.inventory import Inventory, OutOfStock


def test_add_and_count():
    inv = Inventory(reorder_level=2)
    inv.add("bolt", 10)
    assert inv.add("bolt", 5) == 15
    assert inv.count("bolt") == 15


def test_add_rejects_non_positive():
    with pytest.raises(ValueError):
        Inventory(reorder_level=2).add("bolt", 0)


def test_remove_some():
    inv = Inventory(reorder_level=2)
    inv.add("nut", 8)
    assert inv.remove("nut", 3) == 5


def test_remove_too_many():
    inv = Inventory(reorder_level=2)
    inv.add("nut", 3)
    with pytest.raises(OutOfStock):
        inv.remove("nut", 4)


def test_needs_reorder_explicit_level():
    inv = Inventory(reorder_level=10)
    inv.add("washer", 4)
    assert inv.needs_reorder("washer")
    inv.add("washer", 20)
    assert not inv.needs_reorder("washer")
