"""The diagnostics' one-line form and the mismatch watch (learner.diagnostics)."""

from __future__ import annotations

from learner.diagnostics import MismatchWatch, describe, diagnostics


def test_the_mismatch_watch_needs_consecutive_steps_over_the_bound() -> None:
    w = MismatchWatch(bound=0.02, steps=3)
    assert [w.over(kl) for kl in (0.05, 0.05, 0.01, 0.05, 0.05, 0.05, 0.05)] == [
        False, False, False, False, False, True, True]
    assert not MismatchWatch(bound=0.0, steps=1).over(5.0)  # 0: never
    assert not MismatchWatch(bound=0.02, steps=1).over(None)  # no measurement: no warning


def test_describe_reads_what_the_step_has() -> None:
    m = {"reward_mean": 0.25, "zero_spread_groups_frac": 0.25, "entropy": 1.2, "mismatch_kl": 0.001,
         "loss": 3.0, "note": "x"}
    assert diagnostics(m) == {"reward_mean": 0.25, "zero_spread_groups_frac": 0.25, "entropy": 1.2,
                              "mismatch_kl": 0.001}
    assert describe(m) == "reward +0.250, zero-spread groups 25%, entropy 1.200, mismatch KL 0.001"
