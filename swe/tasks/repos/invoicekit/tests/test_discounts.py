import pytest

from invoicekit.discounts import apply_coupon, bulk_discount, percent_off


def test_percent_off():
    assert percent_off(80.0, 25) == 60.0


def test_percent_off_rejects_out_of_range():
    with pytest.raises(ValueError):
        percent_off(10.0, 120)


def test_bulk_discount_explicit_threshold():
    assert bulk_discount(50, threshold=20) == 5.0
    assert bulk_discount(3, threshold=20) == 0.0


def test_no_coupon():
    assert apply_coupon(42.0, None) == 42.0


def test_percent_coupon():
    assert apply_coupon(200.0, {"kind": "percent", "value": 10}) == 180.0
