from textkit.wrap import truncate, word_count, wrap


def test_truncate_short_text_unchanged():
    assert truncate("short", 10) == "short"


def test_wrap_long_text():
    assert wrap("the quick brown fox", 10) == ["the quick", "brown fox"]


def test_wrap_long_word_alone():
    assert wrap("a extraordinarily b", 5) == ["a", "extraordinarily", "b"]


def test_word_count():
    assert word_count("  one two\tthree\n") == 3
