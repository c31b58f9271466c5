"""GRPO advantages: reward minus the group mean (optionally divided by the group std).

Only usable episodes (fresh, complete, unmasked) enter the statistics. An episode's samples
(its steps, under dynamic history) share the episode's reward, and so its advantage, unless the
actors gave each step its own reward (actor.prm.reward_mode step): then a step's advantage is
its own reward minus the group's baseline, the mean of the episodes' rewards (each episode's
reward being the mean of its steps'), so step-level credit rides on the usual GRPO baseline.

`shuffle_episode_rewards` is a control (learner.reward_shuffle): the episodes' rewards permuted
across the batch before the advantages, so the policy is pushed by rewards unrelated to what it
did, with the same reward distribution, batch and compute as the real run.
"""

from __future__ import annotations

import hashlib

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


def grpo_steps(step_rewards: list[list[float]], std_norm: bool = False, eps: float = 1e-6) -> list[list[float]]:
    """Per episode, per step: step reward - mean over the group's episodes of their mean step
    reward (divided by the std of those episode means with std_norm). Steps sharing their
    episode's reward get exactly grpo()'s advantages."""
    if not step_rewards:
        return []
    ep = np.asarray([float(np.mean(r)) if len(r) else 0.0 for r in step_rewards], dtype=np.float64)
    scale = (ep.std() + eps) if std_norm else 1.0
    base = ep.mean()
    return [[float((x - base) / scale) for x in r] for r in step_rewards]


def shuffle_episode_rewards(step_rewards: list[list[list[float]]], key: str) -> list[list[list[float]]]:
    """Per group, per episode, per step rewards with the episodes' rewards permuted across the
    whole batch (every group): episode i gets the mean reward of episode perm(i) on each of its
    steps. The permutation is a pure function of `key` (e.g. the batch's sample ids), so a
    resumed learner makes the same one."""
    means = [float(np.mean(r)) if len(r) else 0.0 for g in step_rewards for r in g]
    seed = int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "little")
    perm = np.random.default_rng(seed).permutation(len(means))
    it = iter(perm)
    return [[[means[int(next(it))]] * len(r) for r in g] for g in step_rewards]
