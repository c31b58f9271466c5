"""Pinned vs in-flight weight updates (weight_sync.rollout_mode), measured on swarl itself.

The same real processes as benchmarks/async_vs_sync.py (its Bench: a private redis-server, envd
+ pool with real containers, scripted policy servers with a latency profile, `swarl actor`s and
`swarl learner` training the tiny model with rolling disk weight sync), run once per mode on
the same seeds (task order, latency draws) and the same latency profile, at each max_staleness
of --etas; then a long-episode profile (turn counts and durations like SWE episodes, scaled
down) at --long-eta, both modes.

Per setting: trained samples per minute (between the first and last learner step) and its
ratio to the ideal — what the actors' slots would give if every slot were always busy with an
episode that ends trained: slots x 60 / the mean seconds a slot holds an episode (its wall
time less grading, which runs past the slot) x samples per episode —; the wasted token
fraction at the window's end (every generated token is counted: broker.status.tokens); the
time from a version's publication to every server reporting it; the actors' and the learner's
idle fractions; how long the learner held steps for running episodes they would leave behind
(learner.hold), how many steps it held, and the episodes steps left behind.
Writes a PNG and the section async_vs_sync_modes of benchmarks/RESULTS.md; the last line is
one JSON object. `--report DIR` reports a finished run again from its results.json.

    .venv/bin/python benchmarks/async_vs_sync_modes.py                # ~6 settings x (budget + start-up)
    .venv/bin/python benchmarks/async_vs_sync_modes.py --minutes 2    # a short run
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO.parent))

from async_vs_sync import Bench, held_s  # noqa: E402
from async_vs_sync import options as bench_options  # noqa: E402

from _record import markdown_table, record  # noqa: E402
from inference.latency import LatencyProfile  # noqa: E402

MODES = ("pinned", "in-flight")
# SWE-like episodes scaled down: tens of turns (median 12, up to 24), each a few seconds
LONG = {"turns_median": 12.0, "turns_sigma": 0.45, "max_turns": 24, "token_s_median": 0.02,
        "token_s_sigma": 0.6, "seed": 0}


def options(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=float, default=6.0, help="wall-clock budget per setting")
    p.add_argument("--etas", default="1,2", help="max_staleness values of the base profile")
    p.add_argument("--long-eta", type=int, default=1, help="max_staleness of the long-episode profile")
    p.add_argument("--no-long", action="store_true", help="skip the long-episode profile")
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--group", type=int, default=2)
    p.add_argument("--actors", type=int, default=2)
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--servers", type=int, default=3)
    p.add_argument("--profile", default="{}", help="LatencyProfile JSON over async_vs_sync's defaults")
    p.add_argument("--long-profile", default="{}", help="LatencyProfile JSON over the long profile")
    p.add_argument("--out", default=None)
    p.add_argument("--png", default=str(REPO / "async_vs_sync_modes.png"))
    p.add_argument("--no-record", action="store_true")
    p.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--report", default=None, help="only report again from this run directory")
    o = p.parse_args(argv)
    base = bench_options(["--minutes", str(o.minutes), "--batch", str(o.batch), "--group", str(o.group),
                          "--actors", str(o.actors), "--concurrency", str(o.concurrency),
                          "--servers", str(o.servers), "--profile", o.profile, "--no-scale",
                          *(a for kv in o.sets for a in ("--set", kv))]
                         + (["--out", o.out] if o.out else []))
    for k, v in vars(o).items():
        if k not in ("out", "png"):
            setattr(base, k, v)
    base.eta_list = [int(x) for x in o.etas.split(",") if x]
    base.mode_list = [m for m in o.modes.split(",") if m]
    for m in base.mode_list:
        if m not in MODES:
            raise SystemExit(f"--modes: {m!r} not one of {MODES}")
    base.base_latency = base.latency
    base.long_latency = LatencyProfile.model_validate({**LONG, **json.loads(o.long_profile)})
    base.png = o.png
    return base


def plan(o: argparse.Namespace) -> list[tuple[str, int, str]]:
    """(profile, max_staleness, mode) per setting, modes side by side."""
    out = [("base", eta, m) for eta in o.eta_list for m in o.mode_list]
    if not o.no_long:
        out += [("long", o.long_eta, m) for m in o.mode_list]
    return out


def derive(r: dict[str, Any], o: argparse.Namespace) -> dict[str, Any]:
    """The figures of one setting: the ideal, the ratio to it, the wasted token fraction."""
    t = r.get("tokens") or {}
    times = r.get("episode_times") or {}
    slots = o.actors * o.concurrency
    per_ep = r["samples_per_min"] / r["episodes_per_min"] if r.get("episodes_per_min") else float("nan")
    held = (times.get("wall_mean_s") or float("nan")) - times.get("eval_s", 0.0)  # grading runs past the slot
    ideal = slots * 60 / held * per_ep if held == held and held > 0 else float("nan")
    return {"ideal_samples_per_min": ideal,
            "ratio_to_ideal": r["samples_per_min"] / ideal if ideal == ideal and ideal > 0 else float("nan"),
            "wasted_fraction": t.get("wasted_fraction", float("nan")),
            "tokens_generated": t.get("generated", 0), "tokens_trained": t.get("trained", 0),
            "tokens_wasted": t.get("wasted", {}), "tokens_in_flight": t.get("in_flight", 0)}


def plot(results: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = sorted({r["label"] for r in results}, key=lambda x: [r["label"] for r in results].index(x))
    fig, ax = plt.subplots(1, 3, figsize=(14, 4.2))
    width = 0.38
    for j, mode in enumerate(MODES):
        rs = {r["label"]: r for r in results if r["mode"] == mode}
        xs = [i + (j - 0.5) * width for i in range(len(labels))]
        for a, key, f in ((ax[0], "samples_per_min", 1.0), (ax[1], "wasted_fraction", 100.0),
                          (ax[2], "sync_s", 1.0)):
            a.bar(xs, [f * rs[lb][key] if lb in rs else 0 for lb in labels], width, label=mode)
    for a, title in zip(ax, ("trained samples / min", "wasted tokens, % of generated",
                             "s from publish to every server"), strict=True):
        a.set_xticks(range(len(labels)), labels)
        a.set_title(title)
        a.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def hold_settings(o: argparse.Namespace) -> str:
    """The learner's hold rule in these runs (learner.hold): its config keys, --set or default."""
    from learner.config import LearnerConfig

    cfg = LearnerConfig()
    values = {"learner.straggler_grace_s": cfg.straggler_grace_s, "learner.straggler_worth": cfg.straggler_worth}
    for kv in o.sets:
        key, _, value = kv.partition("=")
        if key in values:
            values[key] = value
    return ", ".join(f"{k} {v}" for k, v in values.items())


def report(o: argparse.Namespace, results: list[dict[str, Any]]) -> dict[str, Any]:
    headers = ["profile", "max_staleness", "mode", "steps", "samples/min", "ideal", "ratio to ideal",
               "wasted tokens %", "wasted by cause", "actor idle", "held s/step", "steps held", "left behind",
               "every server s", "learner idle", "max age"]
    table, summary = [], {"minutes": o.minutes, "batch": o.batch, "slots": o.actors * o.concurrency}
    for r in results:
        table.append([r["profile"], r["eta"], r["mode"], r["steps"], round(r["samples_per_min"], 1),
                      round(r["ideal_samples_per_min"], 1), round(r["ratio_to_ideal"], 3),
                      round(100 * r["wasted_fraction"], 2),
                      " ".join(f"{k}:{v}" for k, v in sorted(r["tokens_wasted"].items())) or "-",
                      round(r["actor_idle"], 3), round(held_s(r), 2), r.get("steps_held", "-"),
                      r.get("left_behind", "-"), round(r["sync_s"], 2), round(r["learner_idle"], 3),
                      r["max_staleness_seen"]])
        tag = f"{r['profile']}_eta{r['eta']}_{r['mode'].replace('-', '_')}"
        summary[f"samples_per_min_{tag}"] = round(r["samples_per_min"], 1)
        summary[f"ratio_to_ideal_{tag}"] = round(r["ratio_to_ideal"], 3)
        summary[f"wasted_fraction_{tag}"] = round(r["wasted_fraction"], 4)
        summary[f"every_server_s_{tag}"] = round(r["sync_s"], 2)
        summary[f"learner_idle_{tag}"] = round(r["learner_idle"], 3)
        summary[f"held_s_per_step_{tag}"] = round(held_s(r), 2)
        summary[f"actor_idle_{tag}"] = round(r["actor_idle"], 3)
        summary[f"left_behind_{tag}"] = r.get("left_behind")
        summary[f"staleness_bound_kept_{tag}"] = r["max_staleness_seen"] <= r["eta"]
    notes = (
        f"Each setting: {o.actors} actors x {o.concurrency} episodes, {o.servers} scripted servers, batch "
        f"{o.batch} ({o.batch // o.group} tasks x {o.group}), {o.minutes:g} min from the first learner step, "
        "the same seeds (task order, latency draws) in both modes; the bundled train tasks in real "
        "containers, the tiny model trained by `swarl learner`, rolling disk weight sync every step, "
        f"the learner's hold rule (learner.hold; {hold_settings(o)}); grading with envd's referee (its default). "
        f"Base profile {o.base_latency.model_dump_json()}; long profile {o.long_latency.model_dump_json()}. "
        "ideal = slots x 60 / (mean episode wall s - grading s) x samples per episode (every slot always "
        "busy with an episode that ends trained); wasted = generated tokens never trained (stale-stopped, "
        "group closed, masked, infra, dropped by the learner), of all generated, at the end of the "
        "window (before the actors are stopped; what runs then is in flight).")
    steps = [r["steps"] for r in results]
    if o.minutes < 6:
        notes += (f" A short run ({o.minutes:g} min per setting, {min(steps)}-{max(steps)} learner steps "
                  "each, one seed): the figures show the benchmark works and the direction, not the full "
                  "measurement (make the budget 6 min or more, and repeat the seeds).")
    notes += (" 'every server s' is measured by polling the registry every 0.25 s: 0 means within one poll."
              " 'actor idle': generation slots not busy with an episode, of slots x window. 'held s/step': "
              "seconds a step waited for running episodes it would leave behind; 'steps held': steps that "
              "waited; 'left behind': running episodes steps went without (stopped or dropped by the bound).")
    tables = markdown_table(headers, table)
    if not o.no_record:
        record("async_vs_sync_modes", tables, summary, notes)
    print(tables)
    print(notes)
    return summary


async def main_async(o: argparse.Namespace) -> dict[str, Any]:
    bench = Bench(o)
    results = []
    try:
        await asyncio.to_thread(bench.setup)
        for profile, eta, mode in plan(o):
            o.latency = o.long_latency if profile == "long" else o.base_latency
            bench.extra_sets = [f"weight_sync.rollout_mode={mode}"]
            r = await bench.setting(eta, tag=f"-{profile}-{mode}")
            r.update(profile=profile, mode=mode, label=f"{profile} eta {eta}", **derive(r, o))
            results.append(r)
            print(f"{profile} eta {eta} {mode}: "
                  f"{json.dumps({k: v for k, v in r.items() if k not in ('durations', 'reward')})}",
                  file=sys.stderr, flush=True)
    finally:
        bench.close()
    (bench.dir / "results.json").write_text(json.dumps(results))
    plot(results, Path(o.png))
    summary = report(o, results)
    shutil.rmtree(bench.dir / "redis", ignore_errors=True)
    return summary


def main(argv: list[str] | None = None) -> None:
    from common.procs import sigterm_interrupts

    o = options(argv)
    if o.report:  # figures again from a finished run
        results = json.loads((Path(o.report) / "results.json").read_text())
        for r in results:
            r.update(derive(r, o))
        plot(results, Path(o.png))
        print(json.dumps(report(o, results), sort_keys=True))
        return
    sigterm_interrupts()  # a stopped benchmark stops its processes and their containers
    print(json.dumps(asyncio.run(main_async(o)), sort_keys=True))


if __name__ == "__main__":
    main()
