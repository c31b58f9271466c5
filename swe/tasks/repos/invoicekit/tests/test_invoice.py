from invoicekit.invoice import invoice_total
from invoicekit.items import LineItem


def test_invoice_total_with_tax():
    assert invoice_total([LineItem("pen", 2.5, 4)]) == 12.0


def test_invoice_total_custom_rate():
    assert invoice_total([LineItem("pen", 10.0, 2)], tax_rate=0.1) == 22.0


def test_invoice_total_with_coupon():
    items = [LineItem("chair", 100.0)]
    assert invoice_total(items, tax_rate=0.0, coupon={"kind": "percent", "value": 50}) == 50.0
