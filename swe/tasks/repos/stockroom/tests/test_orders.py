from stockroom.inventory import Inventory
from stockroom.orders import purchase_order, reorder_quantity


def test_reorder_quantity():
    inv = Inventory(reorder_level=3)
    inv.add("gear", 4)
    assert reorder_quantity(inv, "gear", target=10) == 6
    assert reorder_quantity(inv, "gear", target=2) == 0


def test_purchase_order_named_supplier():
    assert purchase_order(Inventory(), supplier="acme") == {"supplier": "acme", "lines": {}}
