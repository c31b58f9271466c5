"""Whether a step waits for the running episodes it would make stale: only while the wait saves
more than it costs (DESIGN.md, "Versions in rollout"). A pure decision from measured inputs;
learner.loop gathers them (broker.running, broker.admission, the actor registry, the stats hash)
and asks again every round of a hold.

What a hold of h more seconds saves: each at-risk episode's generated tokens (lost if the step
goes now: the actors stop it, or the learner drops its samples) times the probability that it
ends within h, given how long it has run. That probability comes from the run's own recent
episode durations (broker.running records each listing's time to its last turn and to its end),
by Kaplan-Meier: episodes stopped before their end (stale, group closed, errors) are censored,
not short. An episode already past its last turn (grading) is weighed by the grading times.

What it costs, in the same tokens (the run's generated tokens per busy generation-slot second):
the actor slots admission blocks meanwhile — idle slots beyond admission's free ones, plus the
slots that free up as episodes reach their last turn once those free ones are taken — and, when
the learner has more than this step's batch ready, the learner's time: it is then the
bottleneck, and every second it holds costs every slot a second.

Hold now if some horizon h has saved(h) > cost(h); each round decides afresh, so a hold ends
when its stragglers end, when the blocked slots outweigh them, or at the optional cap."""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from dataclasses import dataclass

# fewer ended episodes than this: their durations say too little to hold for anyone
MIN_DURATIONS = 8
STEP_S = 0.5  # the horizons weighed: every STEP_S seconds up to the longest duration seen (or the cap)
MAX_HORIZON_S = 3600.0


class Survival:
    """Kaplan-Meier survival of a duration from (seconds, ended) observations; ended False:
    censored (it lasted at least that long)."""

    def __init__(self, observations: Iterable[tuple[float, bool]]) -> None:
        obs = sorted(observations)
        self.n = len(obs)
        self.events = sum(1 for _, ended in obs if ended)
        self.times: list[float] = []  # event times, ascending
        self.surv: list[float] = []  # S just after each of them
        s, at_risk, i = 1.0, len(obs), 0
        while i < len(obs):
            t, died, gone = obs[i][0], 0, 0
            while i < len(obs) and obs[i][0] == t:
                died += obs[i][1]
                gone += 1
                i += 1
            if died:
                s *= 1 - died / at_risk
                self.times.append(t)
                self.surv.append(s)
            at_risk -= gone
        self.longest = obs[-1][0] if obs else 0.0

    def __call__(self, t: float) -> float:
        """P(duration > t)."""
        k = bisect.bisect_right(self.times, t)
        return 1.0 if k == 0 else self.surv[k - 1]

    def ends_within(self, elapsed: float, h: float) -> float:
        """P(duration <= elapsed + h | duration > elapsed); 0 past everything observed."""
        alive = self(elapsed)
        if alive <= 0 or elapsed >= self.longest:
            return 0.0
        return max(0.0, 1.0 - self(elapsed + h) / alive)

    def mean(self) -> float:
        """The restricted mean (area under S up to the last event)."""
        area, prev_t, prev_s = 0.0, 0.0, 1.0
        for t, s in zip(self.times, self.surv, strict=True):
            area += (t - prev_t) * prev_s
            prev_t, prev_s = t, s
        return area


@dataclass(frozen=True)
class Durations:
    """The run's recent episodes: seconds from listing to end (`total`) and from the last turn
    to the end (`grading`), each with whether the episode ended (False: stopped, censored)."""

    total: Survival
    grading: Survival
    to_last_turn_s: float  # mean seconds an episode generates (listing to last turn)

    @classmethod
    def of(cls, records: Iterable[tuple[float, float | None, bool]]) -> Durations:
        """From (total s, grading s or None when it never got past generating, ended)."""
        rs = list(records)
        gen = [t - g for t, g, ended in rs if ended and g is not None]
        return cls(total=Survival((t, ended) for t, _, ended in rs),
                   grading=Survival((g, ended) for _, g, ended in rs if g is not None),
                   to_last_turn_s=sum(gen) / len(gen) if gen else float("nan"))


@dataclass(frozen=True)
class Straggler:
    """A running episode the next step would make stale."""

    tokens: int  # generated so far (0: not reported)
    elapsed_s: float  # since it was listed (pinned)
    graded_for_s: float | None = None  # since its last turn; None: still generating
    siblings_tokens: int = 0  # tokens of finished episodes of its group lost with it


@dataclass(frozen=True)
class HoldInputs:
    stragglers: list[Straggler]
    durations: Durations
    tokens_per_slot_s: float  # the run's generated tokens per busy generation-slot second
    slots: int  # the actors' generation slots
    generating: int  # of them busy with an episode now
    admission_free: int  # rollouts admission would start now
    queued: int  # jobs waiting to start
    backlog: bool  # the learner has more than this step's batch ready
    held_s: float = 0.0  # how long this step has been held so far


@dataclass(frozen=True)
class HoldDecision:
    hold: bool
    why: str  # worth | not_worth | no_data | capped | none
    saved_tokens: float = 0.0  # at the best horizon: expected tokens the hold saves
    cost_tokens: float = 0.0  # and what it costs
    for_s: float = 0.0  # the horizon weighed (the best one)
    blocked_slots: float = 0.0  # slots admission blocks now
    ends_p: float = 0.0  # the expected number of the stragglers ending within for_s

    def metrics(self) -> dict[str, float | str]:
        return {"decision": "hold" if self.hold else "step", "why": self.why,
                "saved_tokens": round(self.saved_tokens, 1), "cost_tokens": round(self.cost_tokens, 1),
                "for_s": round(self.for_s, 2), "blocked_slots": round(self.blocked_slots, 2),
                "ends_p": round(self.ends_p, 3)}


def blocked_now(inp: HoldInputs) -> float:
    """Idle slots admission keeps from starting a queued job."""
    idle = max(0, inp.slots - inp.generating)
    return float(min(inp.queued, max(0, idle - inp.admission_free)))


def decide(inp: HoldInputs, cap_s: float | None = None, worth: float = 1.0) -> HoldDecision:
    """Hold now, or step (`worth`: learner.straggler_worth; `cap_s`: learner.straggler_grace_s)."""
    if not inp.stragglers:
        return HoldDecision(False, "none")
    blocked = blocked_now(inp)
    if cap_s is not None and inp.held_s >= cap_s:
        return HoldDecision(False, "capped", blocked_slots=blocked)
    d, rate = inp.durations, inp.tokens_per_slot_s
    if d.total.events < MIN_DURATIONS or not rate > 0:
        return HoldDecision(False, "no_data", blocked_slots=blocked)
    # what each straggler is worth: its tokens, or its generating time at the run's rate
    values = [worth * (s.siblings_tokens + (s.tokens if s.tokens > 0 else
                                            rate * (s.elapsed_s - (s.graded_for_s or 0.0))))
              for s in inp.stragglers]
    # slots that free up (and, once admission's free ones are taken, are blocked): generating
    # episodes reach their last turn at about generating / mean generation time per second
    gen_s = d.to_last_turn_s if d.to_last_turn_s == d.to_last_turn_s and d.to_last_turn_s > 0 \
        else max(d.total.mean(), STEP_S)
    freeing = inp.generating / gen_s
    spare = max(0.0, inp.admission_free - max(0, inp.slots - inp.generating))
    limit = float(min(inp.generating, max(0, inp.queued - int(blocked))))  # slots that can still block
    horizon = min(MAX_HORIZON_S, max(d.total.longest, d.grading.longest))
    if cap_s is not None:
        horizon = min(horizon, cap_s - inp.held_s)
    # hold if some horizon saves more than it costs (the one that saves the most over its cost);
    # else the figures are those of the horizon with the best ratio: what the hold could do
    best: HoldDecision | None = None
    closest: HoldDecision | None = None
    cost_slot_s, h = 0.0, 0.0
    while h < horizon - 1e-9:
        # cost of the next dt: blocked slots at its middle (grown by those freeing past the
        # spare admission slots), or every slot while the learner has a backlog
        dt = min(STEP_S, horizon - h)
        grown = min(limit, max(0.0, freeing * (h + dt / 2) - spare))
        cost_slot_s += dt * (inp.slots if inp.backlog else blocked + grown)
        h += dt
        ps = [d.grading.ends_within(s.graded_for_s, h) if s.graded_for_s is not None
              else d.total.ends_within(s.elapsed_s, h) for s in inp.stragglers]
        saved = sum(w * p for w, p in zip(values, ps, strict=True))
        cost = cost_slot_s * rate
        if saved > cost and (best is None or saved - cost > best.saved_tokens - best.cost_tokens):
            best = HoldDecision(True, "worth", saved, cost, h, blocked, sum(ps))
        elif best is None and (closest is None or saved * closest.cost_tokens > closest.saved_tokens * cost):
            closest = HoldDecision(False, "not_worth", saved, cost, h, blocked, sum(ps))
    return best or closest or HoldDecision(False, "not_worth", blocked_slots=blocked)
