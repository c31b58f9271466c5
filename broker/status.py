"""`swarl status`: one screen of the run's state, gathered from Redis only."""

from __future__ import annotations

import json
import time
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import ResponseError

from broker.admission import Admission
from broker.config import AdmissionConfig, ReplayConfig
from broker.connection import reply
from broker.evals import EvalBoard
from broker.keys import ARQ_IN_PROGRESS_PREFIX, Keys
from broker.registry import ActorRegistry, PolicyRegistry, ServerRegistry
from broker.replay import RATE_BUCKET_S
from broker.running import RunningEpisodes


def _s(x: Any) -> str:
    return x.decode() if isinstance(x, bytes) else str(x)


async def gather(redis: aioredis.Redis, keys: Keys, replay: ReplayConfig,
                 admission: AdmissionConfig) -> dict[str, Any]:
    in_progress = 0
    async for _ in redis.scan_iter(match=f"{ARQ_IN_PROGRESS_PREFIX}{keys.run}:*", count=500):
        in_progress += 1
    stream_len = await redis.xlen(keys.replay)
    group: dict[str, Any] = {}
    try:
        for g in await redis.xinfo_groups(keys.replay):
            if _s(g["name"]) == replay.group:
                group = {"pending": int(g["pending"]), "lag": g.get("lag"),
                         "last_delivered": _s(g["last-delivered-id"]),
                         "consumers": int(g["consumers"])}
    except ResponseError:
        pass  # no stream yet
    now_bucket = int(time.time()) // RATE_BUCKET_S
    buckets = await reply(redis.hmget(keys.samples_rate, [str(now_bucket - i) for i in range(1, 6)]))
    per_min = sum(int(b or 0) for b in buckets) / 5 / (RATE_BUCKET_S / 60)
    stats = {_s(k): _number(v) for k, v in (await reply(redis.hgetall(keys.stats))).items()}
    learner = {_s(k): _s(v) for k, v in (await reply(redis.hgetall(keys.learner_state))).items()}
    board = EvalBoard(redis, keys)
    return {
        "run": keys.run,
        "queue": {"depth": await redis.zcard(keys.queue), "running": in_progress,
                  "failed": await reply(redis.hlen(keys.jobs_failed)), "done": await reply(redis.scard(keys.jobs_done))},
        "stream": {"length": stream_len, "dead_letter": await redis.xlen(keys.replay_dead),
                   "group": group},
        "policy": {"current": await PolicyRegistry(redis, keys).current(),
                   "versions": sorted((await PolicyRegistry(redis, keys).manifests()).keys())},
        "admission": await Admission(redis, keys, admission).capacity(),
        # running episodes by the oldest version they may hold (what the learner's straggler
        # grace waits for)
        "running_by_version": await RunningEpisodes(redis, keys).by_version(),
        "servers": [{"id": s.id, "url": s.url, "version": s.version, "state": s.state,
                     "pins": s.pins, "alive": s.alive, "error": s.error, "role": s.role}
                    for s in await ServerRegistry(redis, keys).list()],
        "actors": await ActorRegistry(redis, keys).list(),
        "learner": learner,
        "samples_per_min": round(per_min, 1),
        "tokens": tokens(stats),
        "stats": stats,
        "evals": {"pending": await board.pending(), "running": await board.running(),
                  "results": await board.results()},
    }


def tokens(stats: dict[str, Any]) -> dict[str, Any]:
    """Every generated token accounted for, from the stats hash (actors.rollout counts generated,
    written and wasted on their side; learner.loop trained and wasted on its): generated =
    trained + the wasted, by cause + in flight (in running episodes, or written and not yet
    decided by the learner)."""
    generated = int(stats.get("tokens_generated", 0))
    trained = int(stats.get("tokens_trained", 0))
    wasted = {k.removeprefix("tokens_wasted/"): int(v) for k, v in sorted(stats.items())
              if k.startswith("tokens_wasted/")}
    total_wasted = sum(wasted.values())
    return {"generated": generated, "written": int(stats.get("tokens_written", 0)), "trained": trained,
            "wasted": wasted, "wasted_total": total_wasted,
            "in_flight": generated - trained - total_wasted,
            "wasted_fraction": round(total_wasted / generated, 4) if generated else 0.0}


def render(st: dict[str, Any]) -> Any:
    from rich.console import Group
    from rich.table import Table

    q, s, g = st["queue"], st["stream"], st["stream"]["group"]
    head = Table.grid(padding=(0, 2))
    head.add_row("run", st["run"], "policy version", str(st["policy"]["current"]))
    head.add_row("queue depth", str(q["depth"]), "running", str(q["running"]))
    head.add_row("jobs done", str(q["done"]), "failed for good", str(q["failed"]))
    head.add_row("stream length", str(s["length"]), "dead-lettered", str(s["dead_letter"]))
    head.add_row("pending (learner)", str(g.get("pending", "-")), "lag", str(g.get("lag", "-")))
    a = st["admission"]
    head.add_row("rollouts started", f"{a['started']}/{a['capacity']}", "samples/min", str(st["samples_per_min"]))
    by_version = st.get("running_by_version") or {}
    if by_version:
        head.add_row("episodes running", ", ".join(f"v{v}: {n}" for v, n in sorted(by_version.items(), key=lambda kv: int(kv[0]))),
                     "", "")
    if st["learner"]:
        head.add_row("learner step", st["learner"].get("step", "-"), "learner version",
                     st["learner"].get("version", "-"))
        diag = [(k.removeprefix("diag/"), v) for k, v in st["learner"].items() if k.startswith("diag/")]
        if diag:  # the last step's RL diagnostics (learner.diagnostics writes them)
            head.add_row("learner diagnostics", ", ".join(f"{k} {_short(v)}" for k, v in diag), "", "")
        if st["learner"].get("warning"):
            head.add_row("learner warning", f"[bold red]{st['learner']['warning']}[/]", "", "")
        if int(st["learner"].get("holding") or 0):
            head.add_row("step held for", f"{st['learner']['holding']} running episodes "
                         f"({st['learner'].get('hold_held_s', '?')} s so far)", "", "")
        if hold_line(st["learner"]):
            head.add_row("hold rule", hold_line(st["learner"]), "", "")
    t = st.get("tokens") or tokens(st.get("stats", {}))
    if t["generated"]:
        head.add_row("tokens generated", str(t["generated"]), "trained", str(t["trained"]))
        head.add_row("tokens wasted", f"{t['wasted_total']} ({100 * t['wasted_fraction']:.1f}%)",
                     "in flight", str(t["in_flight"]))
        if t["wasted"]:
            head.add_row("wasted by cause", ", ".join(f"{k} {v}" for k, v in t["wasted"].items()), "", "")
    pools = []  # one table per role: the policy's servers, and the PRM judges when there are any
    for role, title in (("policy", "inference servers (policy)"), ("prm", "PRM judge servers"),
                        ("eval", "eval servers")):
        rows = [sv for sv in st["servers"] if sv.get("role", "policy") == role]
        if role != "policy" and not rows:
            continue
        servers = Table(title=title, title_justify="left")
        for col in ("id", "url", "version", "state", "pins", "alive"):
            servers.add_column(col)
        for sv in rows:
            servers.add_row(sv["id"], sv["url"], str(sv["version"]),
                            sv["state"] + (f" ({sv['error']})" if sv["error"] else ""),
                            str(sv["pins"]), "yes" if sv["alive"] else "no")
        pools.append(servers)
    actors = Table(title="actors", title_justify="left")
    for col in ("id", "host", "pid", "running", "episodes"):
        actors.add_column(col)
    for ac in st["actors"]:
        actors.add_row(ac["id"], str(ac["host"]), str(ac["pid"]), f"{ac['running']}/{ac['concurrency']}",
                       str(ac["totals"].get("episodes", 0)))
    return Group(head, *pools, actors, *evals_table(st.get("evals") or {}))


def hold_line(learner: dict[str, Any]) -> str:
    """The learner's hold rule (learner.hold) on the step it has ready, from its state hash:
    empty when no running episode would be left behind."""
    at_risk = int(learner.get("hold_at_risk") or 0)
    if not at_risk:
        return ""
    why = learner.get("hold_why", "?")
    verdict = {"worth": "hold", "not_worth": "step", "no_data": "step (too few episode durations yet)",
               "capped": "step (learner.straggler_grace_s reached)"}.get(why, why)
    return (f"{verdict}: {at_risk} episodes would be left behind; waiting up to {learner.get('hold_for_s', 0)} s "
            f"saves ~{learner.get('hold_saved_tokens', 0)} tokens, costs ~{learner.get('hold_cost_tokens', 0)} "
            f"({learner.get('hold_blocked_slots', 0)} actor slots blocked now)")


def evals_table(ev: dict[str, Any]) -> list[Any]:
    """Evaluation during training: one row per version with a result, running or due (none
    when nothing was ever scheduled)."""
    from rich.table import Table

    results, running, pending = ev.get("results") or {}, ev.get("running") or {}, ev.get("pending") or []
    if not (results or pending):
        return []
    t = Table(title="evaluation during training (eval.every_versions)", title_justify="left")
    for col in ("version", "status", "resolve rate", "episodes", "errors", "server", "note"):
        t.add_column(col)
    for v, r in sorted(((int(v), r) for v, r in results.items())):
        sm = r.get("summary") or {}
        rate = f"{sm['resolve_rate']:.3f}" if isinstance(sm.get("resolve_rate"), int | float) else "-"
        t.add_row(str(v), r.get("status", "?"), rate, str(sm.get("episodes", "-")),
                  str(sum((sm.get("errors") or {}).values())) if sm else "-", str(r.get("server", "-")),
                  str(r.get("reason", ""))[:80])
    for v in pending:
        holder = running.get(v) or running.get(str(v))
        t.add_row(str(v), "running" if holder else "pending", "-", "-", "-", "-",
                  f"by {holder}" if holder else "")
    return [t]


def to_json(st: dict[str, Any]) -> str:
    return json.dumps(st, default=str)


def _short(v: str) -> str:
    """A number as 3 significant digits (the hash holds text)."""
    try:
        return f"{float(v):.3g}"
    except ValueError:
        return v


def _number(v: bytes | str) -> int | float:
    """A stats field: a counter (HINCRBY) or a float total (HINCRBYFLOAT, e.g. rollout_busy_s)."""
    f = float(v)
    return int(f) if f.is_integer() else f
