import pytest

from confparse.parser import ConfigSyntaxError, parse


def test_parse_default_section():
    assert parse("host = example.org\nport=8080") == {"default": {"host": "example.org", "port": "8080"}}


def test_value_may_contain_equals():
    assert parse("query = a=b")["default"]["query"] == "a=b"


def test_syntax_error():
    with pytest.raises(ConfigSyntaxError):
        parse("host = x\nnonsense")
