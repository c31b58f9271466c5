"""learner.hold, the rule alone: a step waits for the episodes it would leave behind only while
that saves more than it costs, from the run's own figures."""

from __future__ import annotations

import dataclasses

import pytest

from learner.hold import Durations, HoldInputs, Straggler, Survival, decide

# the run's recent episodes: 20 that took 10-29 s to their end, graded in the last 2 s
DURATIONS = Durations.of([(10.0 + i, 2.0, True) for i in range(20)])


def inputs(**kw) -> HoldInputs:
    base = dict(stragglers=[Straggler(tokens=300, elapsed_s=27.0)], durations=DURATIONS,
                tokens_per_slot_s=10.0, slots=16, generating=16, admission_free=8, queued=100,
                backlog=False)
    return HoldInputs(**{**base, **kw})


def test_kaplan_meier_keeps_stopped_episodes_as_censored() -> None:
    # 4 durations: 10 and 30 ended; 20 and 40 stopped (lasted at least that long)
    s = Survival([(10.0, True), (20.0, False), (30.0, True), (40.0, False)])
    assert s(5) == 1.0 and s(10) == pytest.approx(0.75)
    # at 30, two are still at risk (30 and 40), one ends: 0.75 x 1/2; a naive estimate that
    # counted the stopped ones as ended would say 0.25
    assert s(30) == pytest.approx(0.375)
    assert s.ends_within(15.0, 20.0) == pytest.approx(0.5)  # P(D <= 35 | D > 15)
    assert s.ends_within(45.0, 100.0) == 0.0  # past everything seen: no evidence it ends


def test_holds_when_a_near_done_episode_would_be_lost_and_nothing_waits_on_the_learner() -> None:
    """Admission has room for every idle slot, no second batch is ready: the wait costs nothing,
    and the straggler (27 s into episodes that take at most 29 s) is likely to end soon."""
    d = decide(inputs())
    assert d.hold and d.why == "worth"
    assert d.blocked_slots == 0 and d.cost_tokens == 0 and d.saved_tokens > 100 and d.for_s <= 2.5
    # a straggler already grading (its last turn generated 1 s ago) is as good as done
    d = decide(inputs(stragglers=[Straggler(tokens=300, elapsed_s=15.0, graded_for_s=1.0)]))
    assert d.hold and d.ends_p == pytest.approx(1.0)


def test_does_not_hold_when_actors_are_blocked_behind_it() -> None:
    """Admission is full and 8 actor slots idle with jobs queued: every second of the hold costs
    8 slot-seconds (80 tokens) and more as slots free up, more than a straggler halfway through
    its episode is worth."""
    mid = [Straggler(tokens=300, elapsed_s=15.0)]  # 15 s in: it ends within h s with P ~ h / 14
    assert decide(inputs(stragglers=mid)).hold  # while nothing is blocked, waiting is free
    d = decide(inputs(stragglers=mid, generating=8, admission_free=0))
    assert not d.hold and d.why == "not_worth"
    assert d.blocked_slots == 8 and d.cost_tokens > d.saved_tokens > 0
    # one sure to end within 2 s is still worth 8 blocked slots for those 2 s
    assert decide(inputs(generating=8, admission_free=0)).hold


def test_the_slots_about_to_be_blocked_count_too() -> None:
    """No slot is idle yet, but admission has no room left: each generating episode that reaches
    its last turn during the hold finds its slot blocked."""
    far = [Straggler(tokens=30, elapsed_s=12.0)]
    assert decide(inputs(stragglers=far, admission_free=50)).hold  # nothing will block
    d = decide(inputs(stragglers=far, admission_free=0))
    assert not d.hold and d.blocked_slots == 0 and d.cost_tokens > d.saved_tokens


def test_does_not_hold_when_the_learner_has_more_work_ready() -> None:
    assert decide(inputs()).hold
    assert not decide(inputs(backlog=True)).hold  # more than this batch ready: the learner is the bottleneck


def test_a_groups_finished_episodes_lost_with_its_straggler_count() -> None:
    one = inputs(stragglers=[Straggler(tokens=300, elapsed_s=15.0)], generating=14, admission_free=0)
    assert not decide(one).hold
    siblings = dataclasses.replace(one, stragglers=[Straggler(tokens=300, elapsed_s=15.0, siblings_tokens=3000)])
    assert decide(siblings).hold


def test_too_few_durations_or_the_cap_step_at_once() -> None:
    few = inputs(durations=Durations.of([(10.0, 2.0, True)] * 3))
    assert decide(few).why == "no_data" and not decide(few).hold
    assert decide(inputs(held_s=5.0), cap_s=5.0).why == "capped"
    assert not decide(inputs(), cap_s=0.0).hold
    # the weight of a saved token (learner.straggler_worth) moves the balance
    blocked = inputs(stragglers=[Straggler(tokens=300, elapsed_s=15.0)], generating=8, admission_free=0)
    assert not decide(blocked).hold and decide(blocked, worth=10.0).hold
