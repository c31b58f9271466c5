import pytest

from gradebook.grades import letter, weighted_average


def test_letter_clear_cases():
    assert letter(95) == "A"
    assert letter(72.5) == "C"
    assert letter(42) == "F"


def test_letter_out_of_range():
    with pytest.raises(ValueError):
        letter(101)


def test_weighted_average_single_assessment():
    assert weighted_average({"exam": 81.0}, {"exam": 1.0}) == 81.0
