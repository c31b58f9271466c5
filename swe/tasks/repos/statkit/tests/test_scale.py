import pytest

from statkit.scale import clamp, normalize


def test_clamp():
    assert clamp(15, 0, 10) == 10
    assert clamp(-3, 0, 10) == 0


def test_clamp_bad_bounds():
    with pytest.raises(ValueError):
        clamp(1, 5, 0)


def test_normalize_two_values():
    assert normalize([0, 1]) == [0.0, 1.0]


def test_normalize_constant():
    assert normalize([3, 3, 3]) == [0.0, 0.0, 0.0]
