"""What people read to judge whether RL is working, per step: one list of the step metrics that
say it, their short labels (the learner state hash for `swarl status`, the demo's live view,
`swarl plot`), and the watch on the trainer/inference mismatch.

- zero_spread_groups_frac: groups whose episodes all scored the same carry no advantage, so no
  signal; near 1, the task is too hard or too easy for the policy (DAPO drops such groups).
- entropy: mean entropy of the policy on the sampled tokens; collapsing to 0 ends exploration.
- grad_norm: before clipping, mean over the step's updates (grad_norm_max the largest). A
  grad_norm_max far above the steps around it, then update_kl near 0 for many steps, is one
  spike filling Adam's second moment: later updates shrink by the spike's size
  (learner/spike_clip.py). spike_clipped: the step's updates learner.spike_clip cut.
- clip_frac: share of loss tokens whose ratio the clip held, mean over updates; 0 with one
  update per batch by construction. dual_clip_frac: share whose negative-advantage loss the dual
  clip bounded (learner.clip_ratio_c): their ratio passed it after earlier updates of the step.
- mismatch_kl: k3 estimate of KL(actors' policy || learner's) before the step's first update,
  on the tokens the learner's current policy made (fresh: their version is the learner's, so
  the two policies are the same weights; fresh_frac is their share of the loss; absent when a
  step has none). Near 0 whatever the learning; above ~0.02 for several steps it is a
  weight-sync, temperature or tokenisation bug (prime-rl's CI bound). behav_kl is the same on
  every token: with staleness it adds how far the policy moved since the stale tokens were made.
- update_kl: how far the step's updates moved the policy on its batch. Far above the run's
  median at an ordinary grad_norm: Adam's per-parameter scaling made a large move of a normal
  gradient; update_backtracked: the step's updates learner.max_update_kl scaled back
  (learner/trust_region.py), update_alpha_min the smallest scale kept.
- adv_abs_mean: mean |advantage| of the batch's episodes.
"""

from __future__ import annotations

from dataclasses import dataclass

# (metrics key, label, format)
DIAGNOSTICS: tuple[tuple[str, str, str], ...] = (
    ("reward_mean", "reward", "{:+.3f}"),
    ("zero_spread_groups_frac", "zero-spread groups", "{:.0%}"),
    ("entropy", "entropy", "{:.3f}"),
    ("grad_norm", "grad norm", "{:.3g}"),
    ("spike_clipped", "spike-clipped updates", "{:.0f}"),
    ("clip_frac", "clip frac", "{:.1%}"),
    ("mismatch_kl", "mismatch KL", "{:.2g}"),
    ("behav_kl", "behaviour KL", "{:.2g}"),
    ("update_kl", "update KL", "{:.2g}"),
    ("update_backtracked", "backtracked updates", "{:.0f}"),
    ("adv_abs_mean", "|adv|", "{:.3f}"),
    ("updates", "updates", "{:.0f}"),
)
STATE_PREFIX = "diag/"  # their fields in the learner state hash (broker.keys learner_state)


def diagnostics(metrics: dict[str, object]) -> dict[str, float]:
    """The step's diagnostics that it has, by metrics key."""
    return {k: float(v) for k, _, _ in DIAGNOSTICS
            if isinstance(v := metrics.get(k), int | float)}


def describe(metrics: dict[str, object]) -> str:
    """One line: `reward +0.250, zero-spread groups 25%, entropy 1.204, ...`."""
    return ", ".join(f"{label} {fmt.format(float(v))}" for k, label, fmt in DIAGNOSTICS
                     if isinstance(v := metrics.get(k), int | float))


@dataclass
class MismatchWatch:
    """Counts consecutive steps whose mismatch KL is above `bound`; `over(kl)` is True at the
    `steps`-th such step and every one after (0 bound: never)."""

    bound: float
    steps: int
    run: int = 0

    def over(self, kl: float | None) -> bool:
        if not self.bound or kl is None:
            return False
        self.run = self.run + 1 if kl > self.bound else 0
        return self.run >= self.steps
