"""A SIMULATION (not a measurement) of the learner's straggler hold under bounded staleness:
episodes with the async_vs_sync benchmark's latency profile, admission's bound by group, the
learner's assembly (last-chance salvage, stale drops), actors stopping stale episodes — and the
hold decided by none, a fixed grace, or learner.hold's rule (the code the learner runs). For
choosing the rule and seeing its direction cheaply; the real figures are the benchmarks'.

Per setting: episodes trained per minute, the speedup of max_staleness `--eta` over 0 against
the ideal for the drawn delays (E[max of a batch] / E[delay]), wasted tokens, actor idle
(generation slots not generating), learner hold per step.

    .venv/bin/python benchmarks/hold_sim.py                      # both pin lags, 3 seeds (~1 min)
    .venv/bin/python benchmarks/hold_sim.py --grading-s 7 --policies none,rule --no-record
"""

from __future__ import annotations

import argparse
import heapq
import json
import math
import random
import sys
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from learner.hold import Durations, HoldInputs, Straggler, decide  # noqa: E402

TICK_S = 1.0  # the learner's round (replay.block_ms)


@dataclass
class Ep:
    eid: int
    gid: int
    version: int
    start: float
    last_turn: float
    end: float
    tokens: int
    state: str = "gen"  # gen | grading | done | stopped


@dataclass
class Group:
    gid: int
    size: int
    eps: dict[int, Ep] = field(default_factory=dict)
    done: list[Ep] = field(default_factory=list)
    masked: int = 0
    closed: bool = False


@dataclass
class Opts:
    eta: int = 2
    slots: int = 16
    batch: int = 16
    group: int = 4
    minutes: float = 60.0
    grading_s: float = 1.0
    overhead_s: float = 0.5
    step_s: float = 3.0
    pin_lag_s: float = 0.0  # pinned: an episode pins a server up to this far behind the newest
    policy: str = "rule"  # none | grace:<s> | rule | rule:<straggler_worth>
    seed: int = 0
    turns_median: float = 3.0
    turns_sigma: float = 0.35
    max_turns: int = 8
    token_s_median: float = 0.06
    token_s_sigma: float = 0.65
    tokens_per_turn: int = 60
    siblings: bool = True  # a straggler's worth includes the finished siblings lost with it
    group_at_risk: bool = True  # members of groups the step closes count as stragglers too


class Sim:
    def __init__(self, o: Opts) -> None:
        self.o, self.rng = o, random.Random(o.seed)
        self.t, self.v = 0.0, 0
        self.published = [0.0]
        self.events: list[tuple[float, int, str, int]] = []
        self.seq = 0
        self.free_slots = o.slots
        self.started = 0
        self.left: dict[int, int] = {}
        self.groups: dict[int, Group] = {}
        self.eps: dict[int, Ep] = {}
        self.next_gid = 0
        self.pending: deque[int] = deque()  # members of the group being started
        self.ready: list[Group] = []
        self.busy_until = 0.0
        self.hold_since: float | None = None
        self.records: deque[tuple[float, float | None, bool]] = deque(maxlen=500)
        self.gen_tokens = self.trained_tokens = 0
        self.wasted: dict[str, int] = {}
        self.slot_busy = 0.0
        self.trained_eps = self.steps = 0
        self.held_s = 0.0
        self.delays: list[float] = []
        self.step_times: list[float] = []

    # -- events -----------------------------------------------------------------------------
    def at(self, t: float, kind: str, eid: int = -1) -> None:
        self.seq += 1
        heapq.heappush(self.events, (t, self.seq, kind, eid))

    def run(self) -> dict[str, Any]:
        end = self.o.minutes * 60
        self.at(0.0, "tick")
        self.fill()
        while self.events and self.events[0][0] <= end:
            t, _, kind, eid = heapq.heappop(self.events)
            self.t = t
            if kind == "last_turn":
                self.last_turn(self.eps[eid])
            elif kind == "end":
                self.ended(self.eps[eid])
            elif kind == "trained":
                self.publish()
            elif kind == "tick":
                self.at(t + TICK_S, "tick")
            self.learner()
        return self.figures(end)

    # -- actors -----------------------------------------------------------------------------
    def cap(self) -> int:
        return (self.o.eta + self.v + 1) * self.o.batch

    def fill(self) -> None:
        while self.free_slots > 0:
            if not self.pending:
                if self.started + min(self.o.group, self.o.batch) > self.cap():
                    return
                gid = self.next_gid
                self.next_gid += 1
                self.groups[gid] = Group(gid, self.o.group)
                self.started += self.o.group
                self.left[gid] = self.o.group
                self.pending.extend([gid] * self.o.group)
            gid = self.pending.popleft()
            g = self.groups[gid]
            if g.closed:
                continue  # its reservation went back with the forfeit
            self.left[gid] -= 1
            self.start(g)

    def pin_version(self) -> int:
        if self.o.pin_lag_s <= 0:
            return self.v
        back = self.t - self.rng.uniform(0, self.o.pin_lag_s)
        v = self.v
        while v > 0 and self.published[v] > back:
            v -= 1
        return max(v, self.v - self.o.eta)

    def start(self, g: Group) -> None:
        o = self.o
        turns = max(1, min(o.max_turns, round(self.rng.lognormvariate(math.log(o.turns_median), o.turns_sigma))))
        token_s = self.rng.lognormvariate(math.log(o.token_s_median), o.token_s_sigma)
        tokens = turns * o.tokens_per_turn
        delay = tokens * token_s
        self.delays.append(delay)
        gen = delay + o.overhead_s
        grading = o.grading_s * self.rng.uniform(0.7, 1.3)
        ep = Ep(len(self.eps), g.gid, self.pin_version(), self.t, self.t + gen, self.t + gen + grading, tokens)
        self.eps[ep.eid] = ep
        g.eps[ep.eid] = ep
        self.free_slots -= 1
        self.at(ep.last_turn, "last_turn", ep.eid)

    def tokens_so_far(self, ep: Ep) -> int:
        if ep.state != "gen":
            return ep.tokens
        return int(ep.tokens * min(1.0, (self.t - ep.start) / max(1e-9, ep.last_turn - ep.start)))

    def last_turn(self, ep: Ep) -> None:
        if ep.state != "gen":
            return
        ep.state = "grading"
        self.free_slots += 1
        self.slot_busy += ep.last_turn - ep.start
        self.gen_tokens += ep.tokens
        self.at(ep.end, "end", ep.eid)
        self.fill()

    def ended(self, ep: Ep) -> None:
        if ep.state != "grading":
            return
        ep.state = "done"
        self.records.append((ep.end - ep.start, ep.end - ep.last_turn, True))
        g = self.groups[ep.gid]
        if g.closed:  # its group trained without it: dropped late
            self.waste("dropped_late", ep.tokens)
            self.started -= 1
            self.fill()
            return
        g.done.append(ep)
        if len(g.done) + g.masked == g.size:
            self.ready.append(g)

    def stop(self, ep: Ep, why: str) -> None:
        """An actor stops the episode (stale, or its group closed): its tokens are wasted."""
        if ep.state == "gen":
            self.free_slots += 1
            self.slot_busy += self.t - ep.start
            tokens = self.tokens_so_far(ep)
            self.gen_tokens += tokens
            self.records.append((self.t - ep.start, None, False))
        elif ep.state == "grading":
            tokens = ep.tokens
            self.records.append((self.t - ep.start, self.t - ep.last_turn, False))
        else:
            return
        ep.state = "stopped"
        self.waste(why, tokens)
        self.started -= 1
        g = self.groups[ep.gid]
        if not g.closed:
            g.masked += 1
            if len(g.done) + g.masked == g.size:
                self.ready.append(g)

    def waste(self, why: str, tokens: int) -> None:
        self.wasted[why] = self.wasted.get(why, 0) + tokens

    # -- learner ----------------------------------------------------------------------------
    def usable(self, g: Group) -> list[Ep]:
        return [e for e in g.done if e.version >= self.v - self.o.eta]

    def drop_stale(self) -> None:
        for g in self.ready:
            keep = self.usable(g)
            for e in g.done:
                if e not in keep:
                    self.waste("dropped_stale", e.tokens)
                    self.started -= 1
            g.done = keep
        self.ready = [g for g in self.ready if g.done]

    def learner(self) -> None:
        if self.t < self.busy_until:
            return
        self.drop_stale()
        n_ready = sum(len(g.done) for g in self.ready)
        if n_ready < self.o.batch:
            return
        if self.hold():
            return
        if self.hold_since is not None:
            self.held_s += self.t - self.hold_since
            self.hold_since = None
        self.take()

    def closing(self) -> set[int]:
        """Open groups the next step salvages (last chance, two or more finished): their running
        members are stopped then (group_closed)."""
        if self.o.eta == 0:
            return set()
        last = self.v - self.o.eta
        return {g.gid for g in self.groups.values() if not g.closed and g not in self.ready
                and len(self.usable(g)) >= 2 and min(e.version for e in self.usable(g)) <= last}

    def stragglers(self) -> list[Ep]:
        closing = self.closing() if self.o.group_at_risk else set()
        return [e for e in self.eps.values() if e.state in ("gen", "grading")
                and (e.version <= self.v - self.o.eta or e.gid in closing)]

    def hold(self) -> bool:
        at_risk = self.stragglers()
        if not at_risk or self.o.policy == "none":
            return False
        held = self.t - self.hold_since if self.hold_since is not None else 0.0
        if self.o.policy.startswith("grace:"):
            go = held < float(self.o.policy.split(":")[1])
        else:
            generating = sum(1 for e in self.eps.values() if e.state == "gen")
            n_ready = sum(len(g.done) for g in self.ready)
            inp = HoldInputs(
                stragglers=[Straggler(self.tokens_so_far(e), self.t - e.start,
                                      self.t - e.last_turn if e.state == "grading" else None,
                                      self.siblings_lost(e, at_risk)) for e in at_risk],
                durations=Durations.of(self.records),
                tokens_per_slot_s=self.gen_tokens / self.slot_busy if self.slot_busy else 0.0,
                slots=self.o.slots, generating=generating, admission_free=max(0, self.cap() - self.started),
                queued=10**6, backlog=n_ready >= 2 * self.o.batch, held_s=held)
            worth = float(self.o.policy.partition(":")[2] or 1.0)  # rule:<learner.straggler_worth>
            go = decide(inp, worth=worth).hold
        if go and self.hold_since is None:
            self.hold_since = self.t
        return go

    def siblings_lost(self, e: Ep, at_risk: list[Ep]) -> int:
        """Tokens of e's group's finished episodes that go stale with it: the group is not
        salvaged at this step (fewer than two usable), and they are as old as the step's last
        chance (shared among the group's stragglers)."""
        if not self.o.siblings:
            return 0
        g = self.groups[e.gid]
        usable = self.usable(g)
        if self.o.eta > 0 and len(usable) >= 2:
            return 0
        lost = sum(x.tokens for x in usable if x.version <= self.v - self.o.eta)
        return lost // max(1, sum(1 for x in at_risk if x.gid == e.gid))

    def take(self) -> None:
        o, last = self.o, self.v - self.o.eta
        if o.eta > 0:  # salvage: open groups at their last chance with two or more finished
            for g in list(self.groups.values()):
                if g.closed or g in self.ready or len(self.usable(g)) < 2:
                    continue
                if min(e.version for e in self.usable(g)) > last:
                    continue
                if len(g.done) + g.masked < g.size:
                    for e in g.done:
                        if e not in self.usable(g):
                            self.waste("dropped_stale", e.tokens)
                            self.started -= 1
                    g.done = self.usable(g)
                    self.ready.append(g)
        self.ready.sort(key=lambda g: min(e.version for e in g.done))
        n, taken = 0, []
        while self.ready and (n < o.batch or min(e.version for e in self.ready[0].done) <= last):
            g = self.ready.pop(0)
            taken.append(g)
            n += len(g.done)
        for g in taken:
            self.close(g)
            self.trained_eps += len(g.done)
            self.trained_tokens += sum(e.tokens for e in g.done)
        self.started -= n - o.batch  # beyond batch_size: given back
        self.steps += 1
        self.step_times.append(self.t)
        self.busy_until = self.t + o.step_s
        self.at(self.busy_until, "trained")

    def close(self, g: Group) -> None:
        g.closed = True
        for e in list(g.eps.values()):
            if e.state in ("gen", "grading"):
                self.stop(e, "group_closed")
        self.started -= self.left.get(g.gid, 0)  # the reservation of members never started
        self.left[g.gid] = 0

    def publish(self) -> None:
        self.v += 1
        self.published.append(self.t)
        for e in list(self.eps.values()):
            if e.state in ("gen", "grading") and self.v > e.version + self.o.eta:
                self.stop(e, "stale_stopped")
        self.fill()

    def figures(self, end: float) -> dict[str, Any]:
        for e in self.eps.values():  # generating at the end: busy so far
            if e.state == "gen":
                self.slot_busy += end - e.start
        ts = self.step_times
        window = (ts[-1] - ts[0]) if len(ts) > 1 else float("nan")
        wasted = sum(self.wasted.values())
        return {"eps_per_min": 60 * self.trained_eps / end, "steps": self.steps,
                "step_period_s": window / max(1, len(ts) - 1),
                "wasted_fraction": wasted / max(1, self.gen_tokens),
                "wasted": dict(self.wasted), "actor_idle": 1 - self.slot_busy / (self.o.slots * end),
                "hold_s_per_step": self.held_s / max(1, self.steps), "delays": self.delays}


def ideal(delays: list[float], batch: int, draws: int = 20000, seed: int = 0) -> float:
    rng = random.Random(seed)
    return sum(max(rng.choices(delays, k=batch)) for _ in range(draws)) / draws / (sum(delays) / len(delays))


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--eta", type=int, default=2)
    p.add_argument("--policies", default="none,grace:60,rule,rule:2,rule:4",
                   help="none, grace:<s> (a fixed grace), rule[:<learner.straggler_worth>]")
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--minutes", type=float, default=60.0, help="simulated minutes per run")
    p.add_argument("--grading-s", type=float, default=1.0)
    p.add_argument("--pin-lags", default="20,0", help="pinned: ~20 s behind the newest; in-flight: 0")
    p.add_argument("--set", dest="sets", action="append", default=[], metavar="FIELD=VALUE",
                   help="an Opts field for every run (e.g. slots=8)")
    p.add_argument("--no-record", action="store_true", help="do not write benchmarks/RESULTS.md")
    a = p.parse_args(argv)
    base: dict[str, Any] = {"minutes": a.minutes, "grading_s": a.grading_s}
    for kv in a.sets:
        k, _, v = kv.partition("=")
        base[k] = type(getattr(Opts(), k))(v)
    batch = int(base.get("batch", Opts.batch))
    rows, table = [], []
    for lag in [float(x) for x in a.pin_lags.split(",")]:
        for pol in a.policies.split(","):
            rs = []
            for seed in range(a.seeds):
                sync = Sim(Opts(**{**base, "eta": 0, "policy": pol, "seed": seed, "pin_lag_s": lag})).run()
                asyn = Sim(Opts(**{**base, "eta": a.eta, "policy": pol, "seed": seed, "pin_lag_s": lag})).run()
                ide = ideal(sync["delays"] + asyn["delays"], batch)
                rs.append({"of_ideal": asyn["eps_per_min"] / sync["eps_per_min"] / ide,
                           "wasted": asyn["wasted_fraction"], "actor_idle": asyn["actor_idle"],
                           "held_s_per_step": asyn["hold_s_per_step"]})
            mean = {k: round(sum(r[k] for r in rs) / len(rs), 4) for k in rs[0]}
            lo, hi = min(r["of_ideal"] for r in rs), max(r["of_ideal"] for r in rs)
            rows.append({"pin_lag_s": lag, "policy": pol, **mean})
            table.append([f"{lag:g}", pol, f"{mean['of_ideal']:.3f} ({lo:.3f}-{hi:.3f})",
                          round(100 * mean["wasted"], 2), round(mean["actor_idle"], 3),
                          round(mean["held_s_per_step"], 2)])
    headers = ["pin lag s", "hold", f"eta {a.eta} speedup / ideal (seeds)", "wasted tokens %", "actor idle",
               "held s/step"]
    notes = (f"A SIMULATION, not a measurement: benchmarks/hold_sim.py, {a.seeds} seeds x {a.minutes:g} "
             f"simulated minutes per setting, grading {a.grading_s:g} s, overrides {base}; the async_vs_sync "
             "latency profile; pin lag 20 s stands for pinned mode (a pin can take a server behind the newest), "
             "0 for in-flight. The hold: none, a fixed grace (the old learner.straggler_grace_s 60), or "
             "learner.hold's rule (the code the learner runs; rule:k with learner.straggler_worth k). The "
             "measured figures are async_vs_sync's and async_vs_sync_modes'.")
    from _record import markdown_table, record

    md = markdown_table(headers, table)
    if not a.no_record:
        record("hold_sim", md, {"rows": rows}, notes)
    print(md)
    print(notes)
    print(json.dumps({"rows": rows}))


if __name__ == "__main__":
    main()
