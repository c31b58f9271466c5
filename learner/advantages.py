"""GRPO advantages: reward minus the group mean (optionally divided by the group std).

Only usable episodes (fresh, complete, unmasked) enter the statistics; every sample (step) of
an episode shares the episode's advantage.
"""

from __future__ import annotations

import numpy as np


def grpo(rewards: list[float], std_norm: bool = False, eps: float = 1e-6) -> list[float]:
    r = np.asarray(rewards, dtype=np.float64)
    if r.size == 0:
        return []
    adv = r - r.mean()
    if std_norm:
        # population std (unbiased=False); a group with equal rewards has all-zero advantages
        adv = adv / (r.std() + eps)
    return [float(a) for a in adv]
