from pagekit.cursor import after, next_cursor


def test_next_cursor_is_last_key():
    assert next_cursor([{"id": 1}, {"id": 7}]) == "7"


def test_after_cursor():
    records = [{"id": 1}, {"id": 2}, {"id": 3}]
    assert after(records, "1") == [{"id": 2}, {"id": 3}]


def test_after_without_cursor():
    assert after([{"id": 1}], None) == [{"id": 1}]


def test_after_unknown_cursor():
    assert after([{"id": 1}], "9") == []
