"""Rewards: the outcome (+1 resolved / -1 not, configurable, minus an optional format-error
penalty) and, with a process reward model, its step scores (the seed's
outcome + prm_step_coef x mean step score)."""

from __future__ import annotations

from actors.config import ActorConfig, PrmConfig


def outcome_reward(cfg: ActorConfig, resolved: bool, format_errors: int = 0) -> float:
    base = cfg.reward_resolved if resolved else cfg.reward_unresolved
    return base - cfg.format_error_penalty * format_errors


def prm_episode_reward(prm: PrmConfig, outcome: float, step_scores: list[float | None]) -> float:
    """outcome + step_coef x mean of the scored steps (unscored steps are left out; none: outcome)."""
    scored = [s for s in step_scores if s is not None]
    return outcome + prm.step_coef * (sum(scored) / len(scored)) if scored else outcome


def prm_step_rewards(prm: PrmConfig, outcome: float, step_scores: list[float | None]) -> list[float]:
    """Per step: outcome + step_coef x the step's score (an unscored step: the outcome alone)."""
    return [outcome + prm.step_coef * s if s is not None else outcome for s in step_scores]
