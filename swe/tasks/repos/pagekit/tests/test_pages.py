import pytest

from pagekit.pages import iter_pages, page_count, paginate


def test_page_count_exact():
    assert page_count(40, 20) == 2


def test_page_count_nothing():
    assert page_count(0) == 0


def test_page_count_rejects_zero_per_page():
    with pytest.raises(ValueError):
        page_count(10, 0)


def test_paginate_past_the_end():
    assert paginate(list(range(10)), page=5, per_page=5) == []


def test_paginate_rejects_page_zero():
    with pytest.raises(ValueError):
        paginate([1, 2, 3], page=0)


def test_iter_pages_empty():
    assert list(iter_pages([], per_page=5)) == []
