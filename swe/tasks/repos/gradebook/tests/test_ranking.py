from gradebook.ranking import rank, top_n


def test_rank_two_students():
    assert rank({"ann": 90, "bob": 80}) == [("ann", 90), ("bob", 80)]


def test_top_n_empty_class():
    assert top_n({}) == []
