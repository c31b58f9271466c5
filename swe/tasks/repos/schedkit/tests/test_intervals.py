from schedkit.intervals import busy_until, duration, merge, overlaps


def test_duration_same_day():
    assert duration(540, 600) == 60


def test_overlapping_meetings():
    assert overlaps((540, 600), (570, 660))


def test_contained_meeting_overlaps():
    assert overlaps((540, 720), (600, 630))


def test_merge_overlapping():
    assert merge([(600, 660), (540, 620)]) == [(540, 660)]


def test_merge_disjoint():
    assert merge([(700, 720), (540, 600)]) == [(540, 600), (700, 720)]


def test_busy_until():
    assert busy_until([(540, 600), (700, 720), (600, 650)]) == 720
