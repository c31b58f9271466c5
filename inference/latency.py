"""A latency profile for a policy server: heavy-tailed episode durations without a GPU.

Agent rollouts have heavy-tailed durations (some episodes take many turns, some generate
slowly); a synchronous trainer waits for the slowest episode of every batch. The profile draws,
per episode, a number of turns and a per-token time, both lognormal; a server that applies it
sleeps `tokens x token_s` before each answer, and adds exploration turns until the episode has
its drawn number of turns. Draws are a pure function of (seed, episode key), so a retried job
gets the same ones and a benchmark can reproduce them.

The episode key is the request's `rid` without its last `:<turn>` part: the actors send
`<job_id>:<turn>` (actors/episode.py), so every turn of one job shares one key.

A task row may fix its own episodes' draw instead (`swarl_latency: {"turns": 8, "token_s": 0.2}`,
ROW_FIELD): a test that needs one slow group beside fast ones builds that layout rather than
searching for a seed whose draws happen to give it.
"""

from __future__ import annotations

import hashlib
import math
import random
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field


class LatencyProfile(BaseModel):
    """Episode durations: turns ~ lognormal(turns_median, turns_sigma) rounded to >= 1 (capped by
    max_turns), per-token time ~ lognormal(token_s_median, token_s_sigma), one draw per episode."""

    model_config = ConfigDict(extra="forbid")

    turns_median: float = Field(3.0, gt=0, description="Median number of turns of an episode.")
    turns_sigma: float = Field(0.35, ge=0, description="Lognormal sigma of the number of turns.")
    max_turns: int = Field(8, ge=1, description="Cap on the drawn number of turns.")
    token_s_median: float = Field(0.05, ge=0, description="Median seconds per generated token.")
    token_s_sigma: float = Field(0.65, ge=0, description="Lognormal sigma of the per-token time.")
    seed: int = Field(0, description="Seed of the draws (with the episode key).")


ROW_FIELD = "swarl_latency"


@dataclass(frozen=True)
class EpisodeDraw:
    turns: int
    token_s: float


class RowDraw(BaseModel):
    """A row's own draw (ROW_FIELD), for every episode of it."""

    model_config = ConfigDict(extra="forbid")

    turns: int = Field(ge=1)
    token_s: float = Field(ge=0)


def row_draw(row: dict | None) -> EpisodeDraw | None:
    """The draw a task row fixes for its episodes (ROW_FIELD), or None; a bad one names the
    field (pydantic's message, prefixed with ROW_FIELD)."""
    spec = (row or {}).get(ROW_FIELD)
    if spec is None:
        return None
    try:
        d = RowDraw.model_validate(spec)
    except ValueError as e:
        raise ValueError(f"{ROW_FIELD}: {e}") from None
    return EpisodeDraw(d.turns, d.token_s)


def episode_key(rid: str | None) -> str:
    """`<job_id>:<turn>` -> `<job_id>`; a rid without a turn is its own key."""
    if not rid:
        return ""
    head, sep, tail = rid.rpartition(":")
    return head if sep and tail.isdigit() else rid


def draw(profile: LatencyProfile, key: str) -> EpisodeDraw:
    digest = hashlib.sha256(f"{profile.seed}:{key}".encode()).digest()
    rng = random.Random(int.from_bytes(digest[:8], "little"))
    turns = rng.lognormvariate(math.log(profile.turns_median), profile.turns_sigma)
    token_s = rng.lognormvariate(math.log(profile.token_s_median), profile.token_s_sigma) \
        if profile.token_s_median > 0 else 0.0
    return EpisodeDraw(max(1, min(profile.max_turns, round(turns))), token_s)


class LatencyLog:
    """What a server applied, per episode key: seconds slept and answers given (for the
    benchmark's ideal speedup, computed from the durations actually drawn)."""

    def __init__(self, profile: LatencyProfile) -> None:
        self.profile = profile
        self.episodes: dict[str, dict[str, float]] = {}

    def draw(self, rid: str | None, row: dict | None = None) -> EpisodeDraw:
        """The draw of request `rid`'s episode: its task row's own (ROW_FIELD), else the profile's."""
        return row_draw(row) or draw(self.profile, episode_key(rid))

    def delay_s(self, rid: str | None, n_tokens: int, row: dict | None = None) -> float:
        """Seconds to wait before answering `n_tokens` for request `rid` of task `row` (recorded)."""
        key = episode_key(rid)
        d = self.draw(rid, row).token_s * n_tokens
        ep = self.episodes.setdefault(key, {"delay_s": 0.0, "answers": 0})
        ep["delay_s"] += d
        ep["answers"] += 1
        return d
