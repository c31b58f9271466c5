import pytest

from schedkit.clock import add_minutes, format_time, parse_time


def test_parse_time():
    assert parse_time("09:30") == 570


def test_parse_time_rejects_bad_hour():
    with pytest.raises(ValueError):
        parse_time("24:10")


def test_format_time_wraps():
    assert format_time(25 * 60 + 5) == "01:05"


def test_add_minutes():
    assert add_minutes("23:50", 20) == "00:10"
