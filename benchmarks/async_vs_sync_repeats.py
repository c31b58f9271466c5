"""async_vs_sync, max_staleness 0 against 2, several times: the spread between runs, and the
mean speedup over its ideal with an interval.

One run of benchmarks/async_vs_sync.py cannot settle a few percent: its synchronous setting
makes about ten learner steps in its budget, so the batches' slowest episodes (what a
synchronous step waits for) are a small sample of a heavy tail, and its ideal is estimated from
the 400-600 durations the run drew. This runs the two-setting benchmark `--runs` times (each its
own services, containers and draws: the latency profile's seed is moved per run), or reports
again from finished run directories (`--from`), and records per run: samples per minute at 0
and 2, speedup_eta2, ideal_speedup, their ratio, the ratio against the episodes' wall-time
ideal, the staleness seen and the episodes the bound cost; then the mean ratio with a bootstrap
interval over runs. Writes benchmarks/async_vs_sync_repeats.png (`--mode in-flight`:
benchmarks/async_vs_sync_repeats_in_flight.png), a section of benchmarks/RESULTS.md, and as
its last line one JSON object.

    .venv/bin/python benchmarks/async_vs_sync_repeats.py --runs 3          # ~15 min a run
    .venv/bin/python benchmarks/async_vs_sync_repeats.py --from runs/av-a1 runs/av-a2
    ... -- --minutes 4 --set weight_sync.max_updating=3                     # to every run
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from _record import markdown_table, record  # noqa: E402
from swarl.demo.stats import summary_across  # noqa: E402

BENCH = REPO / "benchmarks" / "async_vs_sync.py"
GOAL = 0.9  # issue #13: speedup_eta2 at least 0.9 of the profile's ideal


def options(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=3, help="two-setting runs to make")
    p.add_argument("--first-seed", type=int, default=0,
                   help="the latency seed of the first run (run i: first_seed + i)")
    p.add_argument("--from", dest="dirs", nargs="+", default=[], metavar="RUN_DIR",
                   help="report from these finished async_vs_sync run directories instead")
    p.add_argument("--out", default=None, help="parent of the run directories (default runs/)")
    p.add_argument("--png", default=None, help="default: benchmarks/async_vs_sync_repeats.png "
                   "(pinned) or benchmarks/async_vs_sync_repeats_in_flight.png")
    p.add_argument("--no-record", action="store_true", help="do not write benchmarks/RESULTS.md")
    p.add_argument("--mode", default="pinned", choices=["pinned", "in-flight"],
                   help="weight_sync.rollout_mode of every run")
    p.add_argument("bench_args", nargs=argparse.REMAINDER,
                   help="after --: arguments for every run of async_vs_sync.py")
    o = p.parse_args(argv)
    o.bench_args = [a for a in o.bench_args if a != "--"]
    if o.runs < 1:
        p.error("--runs must be at least 1")
    return o


def last_json(text: str, what: str) -> dict[str, Any]:
    for line in reversed(text.strip().splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    raise RuntimeError(f"{what}: no JSON line in its output:\n{text[-2000:]}")


def run_once(o: argparse.Namespace, run_dir: Path, seed: int) -> dict[str, Any]:
    """One two-setting run, its own draws (the profile's seed), its summary JSON."""
    profile = {"seed": seed}
    extra = list(o.bench_args)
    if "--profile" in extra:  # the caller's profile, with this run's seed
        i = extra.index("--profile")
        profile = {**json.loads(extra[i + 1]), "seed": seed}
        del extra[i:i + 2]
    cmd = [sys.executable, str(BENCH), "--etas", "0,2", "--no-scale", "--no-record", "--out", str(run_dir),
           "--png", str(run_dir / "async_vs_sync.png"), "--profile", json.dumps(profile), "--mode", o.mode,
           *extra]
    log = run_dir.with_suffix(".log")
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w") as f:  # the run's own progress, kept beside it
        p = subprocess.run(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=f, text=True, check=False)
    if p.returncode != 0:
        raise RuntimeError(f"{run_dir.name} failed ({p.returncode}); its log: {log}\n{p.stdout[-2000:]}")
    return last_json(p.stdout, run_dir.name)


def report_again(run_dir: Path) -> dict[str, Any]:
    """A finished run's summary, from its results.json and options.json."""
    if not (run_dir / "results.json").exists():
        raise FileNotFoundError(f"{run_dir}: no results.json (not a finished async_vs_sync run)")
    p = subprocess.run([sys.executable, str(BENCH), "--report", str(run_dir), "--no-record",
                        "--png", str(run_dir / "async_vs_sync.png")],
                       cwd=REPO, capture_output=True, text=True, check=False)
    if p.returncode != 0:
        raise RuntimeError(f"{run_dir}: --report failed:\n{p.stderr[-2000:]}")
    return last_json(p.stdout, str(run_dir))


def run_name(run_dir: Path) -> str:
    """A run's label in the table: its latency seed (what sets its draws) and when its batch of
    runs started (a seed may be run again), else its directory."""
    try:
        seed = json.loads(json.loads((run_dir / "options.json").read_text())["profile"]).get("seed")
    except (OSError, KeyError, TypeError, ValueError):
        seed = None
    stamp = run_dir.resolve().parent.name.removeprefix("async-vs-sync-repeats-")
    if seed is None:
        return run_dir.name
    return f"seed {seed} ({stamp})" if stamp[:8].isdigit() else f"seed {seed}"


def row(name: str, s: dict[str, Any]) -> list[object]:
    lost = "/".join(str(s.get(f"episodes_abandoned_{k}_eta2", "-")) for k in ("stale", "group_closed"))
    return [name, s["samples_per_min_eta0"], s["samples_per_min_eta2"], s["speedup_eta2"],
            s["ideal_speedup"], s["speedup_eta2_vs_ideal"], s.get("speedup_eta2_vs_episode_wall_ideal", ""),
            f"{s.get('grading_s_eta0', '-')} / {s.get('grading_s_eta2', '-')}",
            s.get("episodes_drawn", ""), s["max_staleness_seen_eta2"],
            f"{s.get('stale_dropped_eta2', '-')}/{s.get('late_dropped_eta2', '-')}", lost,
            pct(s.get("wasted_fraction_eta2")), s.get("actor_idle_eta2", "-"), s.get("held_s_per_step_eta2", "-")]


def pct(x: Any) -> object:
    return round(100 * float(x), 2) if isinstance(x, int | float) else "-"


def mean_of(runs: list[tuple[str, dict[str, Any]]], key: str) -> float | None:
    xs = [float(s[key]) for _, s in runs if isinstance(s.get(key), int | float)]
    return round(sum(xs) / len(xs), 4) if xs else None


def plot(names: list[str], ratios: list[float], across: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.2))
    ax.plot(range(len(ratios)), ratios, "o", label="one run")
    lo, hi = across["ci"]
    ax.axhspan(lo, hi, color="tab:blue", alpha=0.15, label=f"mean {across['mean']:.3f}, 95% interval")
    ax.axhline(across["mean"], color="tab:blue")
    ax.axhline(GOAL, color="tab:red", ls="--", label=f"goal {GOAL}")
    ax.set_xticks(range(len(names)), names, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("speedup_eta2 / ideal")
    ax.set_title("async (max_staleness 2) vs sync (0), run to run")
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=80)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    o = options(argv)
    runs: list[tuple[str, dict[str, Any]]] = []
    if o.dirs:
        for d in o.dirs:
            runs.append((run_name(Path(d)), report_again(Path(d))))
    else:
        stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
        parent = Path(o.out or REPO / "runs").resolve() / f"async-vs-sync-repeats-{stamp}"
        for i in range(o.runs):
            t0 = time.monotonic()
            s = run_once(o, parent / f"run-{i}", seed=o.first_seed + i)
            runs.append((run_name(parent / f"run-{i}"), s))
            print(f"run {i + 1}/{o.runs}: speedup_eta2 {s['speedup_eta2']} of ideal {s['ideal_speedup']} "
                  f"= {s['speedup_eta2_vs_ideal']} ({(time.monotonic() - t0) / 60:.1f} min)",
                  file=sys.stderr, flush=True)
    ratios = [float(s["speedup_eta2_vs_ideal"]) for _, s in runs]
    across = summary_across(ratios)
    headers = ["run (latency seed)", "samples/min eta0", "samples/min eta2", "speedup_eta2", "ideal", "of ideal",
               "of wall ideal", "grading s/episode eta0 / eta2", "episodes drawn", "max age eta2", "samples dropped stale / late",
               "episodes stopped stale / group closed", "wasted tokens % eta2", "actor idle eta2",
               "held s/step eta2"]
    table = markdown_table(headers, [row(n, s) for n, s in runs])
    summary = {"runs": len(runs), "speedup_eta2_vs_ideal_mean": across["mean"],
               "speedup_eta2_vs_ideal_ci95": across["ci"], "speedup_eta2_vs_ideal_min": across["min"],
               "speedup_eta2_vs_ideal_max": round(max(ratios), 4),
               "speedup_eta2_mean": round(sum(s["speedup_eta2"] for _, s in runs) / len(runs), 3),
               "ideal_speedup_mean": round(sum(s["ideal_speedup"] for _, s in runs) / len(runs), 3),
               "staleness_bound_kept": all(s["max_staleness_seen_eta2"] <= 2 for _, s in runs),
               "goal": GOAL, "mode": o.mode,
               # issue 42: waste and idle actors at max_staleness 2, beside the ratio
               "wasted_fraction_eta2_mean": mean_of(runs, "wasted_fraction_eta2"),
               "wasted_fraction_eta2_max": max((float(s["wasted_fraction_eta2"]) for _, s in runs
                                                if "wasted_fraction_eta2" in s), default=None),
               "actor_idle_eta2_mean": mean_of(runs, "actor_idle_eta2"),
               "actor_idle_eta2_max": max((float(s["actor_idle_eta2"]) for _, s in runs), default=None),
               "held_s_per_step_eta2_mean": mean_of(runs, "held_s_per_step_eta2")}
    args = " ".join(["--etas 0,2 --no-scale", "--mode", o.mode, *o.bench_args])
    notes = (f"Each run: `benchmarks/async_vs_sync.py {args}` (its own services, containers and draws). Mean of speedup_eta2 / "
             f"ideal over {len(runs)} runs {across['mean']:.3f}, 95% bootstrap interval over runs "
             f"[{across['ci'][0]:.3f}, {across['ci'][1]:.3f}] (few runs: a rough interval), "
             f"lowest {across['min']:.3f}; the goal is {GOAL}.")
    if not o.no_record:
        record("async_vs_sync_repeats" + ("" if o.mode == "pinned" else "_in_flight"), table, summary, notes)
    png = o.png or REPO / "benchmarks" / ("async_vs_sync_repeats" + ("" if o.mode == "pinned" else "_in_flight") + ".png")
    plot([n for n, _ in runs], ratios, across, Path(png))
    print(table)
    print(notes)
    print(json.dumps(summary, sort_keys=True))


if __name__ == "__main__":
    main()
