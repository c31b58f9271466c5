from textkit.slug import slugify


def test_slugify_single_word():
    assert slugify("Hello") == "hello"


def test_slugify_custom_separator():
    assert slugify("Hello, World!", sep="+") == "hello+world"


def test_slugify_max_length():
    assert slugify("x" * 100, max_length=10) == "x" * 10
