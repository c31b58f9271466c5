import pytest

from statkit.summary import mean, mean_ignoring_missing, median, stdev, variance


def test_mean():
    assert mean([1, 2, 3, 4]) == 2.5


def test_mean_empty():
    with pytest.raises(ValueError):
        mean([])


def test_median_odd():
    assert median([5, 1, 3]) == 3


def test_variance_population():
    assert variance([2, 4, 4, 4, 5, 5, 7, 9], sample=False) == 4.0


def test_stdev_population():
    assert stdev([2, 4, 4, 4, 5, 5, 7, 9], sample=False) == 2.0


def test_mean_ignoring_missing():
    assert mean_ignoring_missing([1, None, 3]) == 2.0


def test_mean_ignoring_missing_all_missing():
    assert mean_ignoring_missing([None, None]) is None
