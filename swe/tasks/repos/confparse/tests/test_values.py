import pytest

from confparse.values import get, get_bool, get_int


def test_get_missing_default():
    assert get({"default": {}}, "name", default="anon") == "anon"


def test_get_int_present():
    assert get_int({"default": {"port": "8080"}}, "port") == 8080


def test_get_bool():
    config = {"default": {"debug": "Yes", "cache": "off"}}
    assert get_bool(config, "debug") is True
    assert get_bool(config, "cache") is False


def test_get_bool_invalid():
    with pytest.raises(ValueError):
        get_bool({"default": {"debug": "maybe"}}, "debug")
