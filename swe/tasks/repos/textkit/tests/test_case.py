from textkit.case import title_case


def test_title_case_plain():
    assert title_case("hello world") == "Hello World"


def test_title_case_small_word_inside():
    assert title_case("war and peace") == "War and Peace"
