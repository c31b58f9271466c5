"""Clipping gradient spikes relative to the run's own gradient norms (`learner.spike_clip`).

Why: Adam divides each update by the root of a running mean of squared gradients (beta2 0.999
remembers ~1,000 updates). In RL on a near-deterministic policy the gradient norm is heavy-tailed:
most updates carry only the few tokens where the policy still chooses (norm ~0.01 in the demo),
and an occasional batch with a garbled reply, whose every token is unlikely, is 100x that. One
such spike fills the second moment, and every later update is divided by it: the demo's policy
moved 10-100x less per unit of squared gradient after a spike than before it (update KL over
grad norm squared; docs/demo.md "Gradient spikes freeze the policy"), i.e. it froze between
spikes and moved only on them, in the spike's direction. A fixed `learner.grad_clip` cannot tell
a spike from a normal update without knowing the run's scale; this clips each update at
`spike_clip` times the running mean (EMA) of the earlier updates' clipped norms, so a spike adds at most spike_clip^2
times a normal update to the second moment. It is ZClip's idea (a gradient norm judged against
its own running statistics) with a mean instead of a z-score: one knob.

The state is the mean and a count; it lives with the rank's worker and starts again after a
restart (WARMUP updates unclipped but by grad_clip). Every rank sees the same global norm, so
every rank computes the same threshold.
"""

from __future__ import annotations

import math

DECAY = 0.9  # the running mean's weight on the past: follows a real change of scale in ~10 updates
WARMUP = 5  # updates before the first spike clip: the mean needs a few norms to stand on


class SpikeClip:
    def __init__(self, factor: float | None) -> None:
        self.factor = factor
        self.mean = 0.0
        self.seen = 0

    def threshold(self) -> float | None:
        """The norm this update is clipped at (None: no spike clip yet, or off)."""
        if self.factor is None or self.seen < WARMUP:
            return None
        return self.factor * self.mean

    def observe(self, norm: float) -> bool:
        """Record an update's norm (before clipping); True when the spike clip cut it."""
        at = self.threshold()
        clipped = at is not None and norm > at
        kept = min(norm, at) if at is not None else norm
        if math.isfinite(norm):  # a nan/inf norm (a skipped step) teaches nothing
            self.mean = kept if self.seen == 0 else DECAY * self.mean + (1 - DECAY) * kept
            self.seen += 1
        return clipped
