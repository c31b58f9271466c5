from invoicekit.items import LineItem, average_unit_price, line_total, subtotal


def test_line_total():
    assert line_total(LineItem("pen", 2.5, 4)) == 10.0


def test_subtotal():
    items = [LineItem("pen", 2.5, 4), LineItem("pad", 3.2)]
    assert subtotal(items) == 13.2


def test_subtotal_empty():
    assert subtotal([]) == 0


def test_average_unit_price():
    items = [LineItem("pen", 2.0, 3), LineItem("pad", 6.0)]
    assert average_unit_price(items) == 3.0
