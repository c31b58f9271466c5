"""Does the demo learn to read? Per seed `swarl demo` twice — the RL run (with its SFT control:
the warm start's training continued for as many steps as the learner took) and the
shuffled-reward run (learner.reward_shuffle), same seed, warm start, minutes and evaluation
draws — then the summary across seeds: benchmarks/demo_learning.json (every run's
learning.json and the aggregate), benchmarks/demo_learning.png, a section in
benchmarks/RESULTS.md, and the generated "Measured" section of docs/demo.md. The goals it is
judged by are fixed in docs/demo.md ("Goals") and swarl/demo/report.py (GOALS).

    .venv/bin/python benchmarks/demo_learning.py                 # seeds 0-4, the proof's design (DESIGN)
    .venv/bin/python benchmarks/demo_learning.py --seeds 0,1 --steps 30 -- --set learner.lr=4e-4
    .venv/bin/python benchmarks/demo_learning.py --report-only   # re-render from demo_learning.json
    .venv/bin/python benchmarks/demo_learning.py --from-run runs/X --steps 18 --minutes 30
        # record a finished `swarl demo --seeds ... --run-dir runs/X` run with DESIGN (arguments
        # after -- that it ran with besides, for the record; every arm's config must agree with
        # the --set values, else it refuses)

Every `swarl demo` call gets DESIGN first, then the arguments after `--` as they are (a later
`--set` of the same key, or `--handwritten`, wins). The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # the packages before this folder (benchmarks/weight_sync.py), which Python put first

from _record import markdown_table, record  # noqa: E402
from common.provenance import describe  # noqa: E402
from swarl.demo.choice import evaluations as choice_evaluations  # noqa: E402
from swarl.demo.choice import summary as choice_summary  # noqa: E402
from swarl.demo.report import ARMS, SPLIT_NAMES, aggregate, curves, markdown, plot, write_doc  # noqa: E402

# The proof's design: one warm start for every seed, with reading shown on families RL never meets
# (docs/demo.md "Reading shown elsewhere": the 3,200 reading demonstrations, picked by a pilot on
# seed 10, which the proof does not use); 2 passes over each batch of 32 episodes, 2 updates of 16 a
# pass, the gradient-spike clip and the trust region over the whole batch ("The trust region on seed
# 0", "Two epochs, half the steps"); 18 steps an arm (--steps' default). The hand-written suite has
# no goal: not evaluated. `swarl demo`'s defaults (configs/demo.yaml and its options) are this design
# (tests/ops/test_demo_learning_record.py checks it).
DESIGN = ("--warm-seed", "0", "--reading-demos", "3200", "--no-handwritten", "--set", "admission.batch_size=32",
          "--set", "learner.minibatches=2", "--set", "learner.epochs=2", "--set", "learner.spike_clip=3",
          "--set", "learner.max_update_kl=0.01", "--set", "learner.max_update_kl_scope=batch")
OUT_JSON = ROOT / "benchmarks" / "demo_learning.json"
OUT_PNG = ROOT / "benchmarks" / "demo_learning.png"
DOC = ROOT / "docs" / "demo.md"


def sampling_temperature(seed_dir: Path) -> float | None:
    """The actors' sampling temperature in a demo run's effective config (evaluations use it too)."""
    import yaml

    try:
        return float(yaml.safe_load((seed_dir / "config.yaml").read_text())["actor"]["sampling"]["temperature"])
    except (OSError, KeyError, TypeError, ValueError):
        return None


def _wall_minutes(run_dir: Path) -> float | None:
    """A finished run's wall time: per seed and arm, its config's write to its result's, summed
    (the arms may have run in several calls, hours apart)."""
    arms = [d for d in run_dir.glob("seed-*/*") if (d / "result.json").is_file() and (d / "config.yaml").is_file()]
    if not arms:
        return None
    return round(sum((d / "result.json").stat().st_mtime - (d / "config.yaml").stat().st_mtime
                     for d in arms) / 60, 1)


WARM_OPTIONS = {"warm_seed": "--warm-seed", "practice_names": "--practice-names", "reading_demos": "--reading-demos"}


def settings_disagree(run_dir: Path, args: list[str]) -> list[str]:
    """Each finished arm's effective config against the `--set` values the record will claim (an
    arm still running, or stopped, is not recorded: not read): the arm's config.yaml loaded as it
    is and with those overrides, through the config's own schema, must agree on each key."""
    from functools import reduce

    from swarl.config import load_config

    sets = [args[i + 1] for i, x in enumerate(args[:-1]) if x == "--set" and "=" in args[i + 1]]
    # the warm start's options, which result.json records (older results: their defaults)
    opts = {k: args[i + 1] for i, x in enumerate(args[:-1]) for k, flag in WARM_OPTIONS.items() if x == flag}
    why = []
    for cfg in sorted(c for c in run_dir.glob("seed-*/*/config.yaml") if (c.parent / "result.json").is_file()):
        result = json.loads((cfg.parent / "result.json").read_text())
        default = {"practice_names": "train", "reading_demos": 0, "warm_seed": result.get("seed")}
        for key, flag in WARM_OPTIONS.items():  # an option not claimed is claimed at its default
            had, want = result.get(key, default[key]), opts.get(key, str(default[key]))
            if str(had) != want:
                why.append(f"{cfg.parent.relative_to(run_dir)}: {flag} was {had}, not {want}")
        ran, claimed = load_config(cfg, environ={}), load_config(cfg, sets, environ={})
        for key, want in (x.split("=", 1) for x in sets):
            value = reduce(getattr, key.split("."), ran)
            if value != reduce(getattr, key.split("."), claimed):
                why.append(f"{cfg.parent.relative_to(run_dir)}: {key} is {value!r}, not {want}")
    return why


def short_arms(runs: dict[str, list[dict]]) -> str:
    """The arms that stopped short of their learner-step budget (the --minutes bound came first on
    a busy machine), named with their steps: the arms are compared at equal compute only where
    every arm reached its budget, so a record says so when one did not."""
    short = [(arm, f"seed {r['seed']}'s {arm} arm {r.get('learner_steps', 0)} of {r['steps_budget']}")
             for arm, rs in runs.items() for r in (x["result"] for x in rs)
             if r.get("steps_budget") and r.get("learner_steps", 0) < r["steps_budget"]]
    if not short:
        return ""
    sft = " (an RL arm's SFT control takes as many steps as it did)" if any(a == "rl" for a, _ in short) else ""
    return f" Stopped by the minutes bound before their steps: {'; '.join(s for _, s in short)}{sft}."


def code_clause(runs: dict[str, list[dict]]) -> str:
    """The code every recorded arm ran (its result's `code`, common.provenance): one commit, or
    which arms ran which, so that a record of arms run over several commits says so."""
    by: dict[str, list[str]] = {}
    for arm, rs in runs.items():
        for r in (x["result"] for x in rs):
            by.setdefault(describe(r.get("code")), []).append(f"seed {r['seed']}'s {arm} arm")
    if list(by) == [describe(None)]:
        return " The arms did not record their code (runs from before common.provenance)."
    if len(by) == 1:
        return f" Every arm ran at {next(iter(by))}."
    return " The arms ran at " + "; ".join(f"{c} ({', '.join(arms)})" for c, arms in sorted(by.items())) + "."


def collect(run_dir: Path, expected: list[int] | None = None) -> dict:
    """A `swarl demo --seeds` run's summary, built from the seeds whose every arm finished
    (each run's learning.json and result.json; not from its learning-seeds.json, which
    describes only the last `swarl demo` call into the directory) — reported as the seeds it
    has, never padded; `partial` when they are not the `expected` ones."""
    runs: dict[str, list[dict]] = {arm: [] for arm in ARMS}
    metrics: dict[str, list[list[dict]]] = {arm: [] for arm in ARMS}
    for seed_dir in sorted(run_dir.glob("seed-*"), key=lambda p: int(p.name.split("-")[1])):
        arms = [seed_dir / arm for arm in ARMS]
        if all((d / "learning.json").is_file() and (d / "result.json").is_file() for d in arms):
            for arm, d in zip(ARMS, arms, strict=True):
                learning = json.loads((d / "learning.json").read_text())
                if "choice" not in learning:  # a run from before swarl.demo.choice: read from its episodes
                    learning["choice"] = choice_summary(d / "trajectories")
                if "eval_choice" not in learning:
                    learning["eval_choice"] = choice_evaluations(d / "eval")
                runs[arm].append({**learning,
                                  "result": json.loads((d / "result.json").read_text())})
                metrics[arm].append(_metrics(d))
    if not runs[ARMS[0]]:
        raise SystemExit(f"{run_dir}: no seed with every arm finished")
    agg = aggregate(runs[ARMS[0]], runs[ARMS[1]])
    steps = curves(metrics)
    plot(agg, run_dir / "learning-seeds.png", steps)
    found = [r["seed"] for r in runs[ARMS[0]]]
    return {"aggregate": agg, "runs": runs, "curves": steps,
            "partial": expected is not None and found != expected}


def _metrics(arm_dir: Path) -> list[dict]:
    """An arm's learner rows (metrics.jsonl: one per step); none when the run kept no file."""
    f = arm_dir / "metrics.jsonl"
    return [json.loads(x) for x in f.read_text().splitlines() if x.strip()] if f.is_file() else []


def run(seeds: str, minutes: float | None, steps: int, train_pool: int | None, extra: list[str]) -> Path:
    run_dir = ROOT / "runs" / f"demo-learning-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}"
    cmd = [str(ROOT / ".venv" / "bin" / "swarl"), "demo", "--seeds", seeds, "--run-dir", str(run_dir)]
    if minutes is not None:
        cmd += ["--minutes", str(minutes)]
    cmd += ["--steps", str(steps)]  # 0 as well: swarl demo's own default is 18
    if train_pool is not None:
        cmd += ["--train-pool", str(train_pool)]
    cmd += [*DESIGN, *extra]
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True, cwd=ROOT)  # its progress goes to this terminal / log
    return run_dir


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", default="0,1,2,3,4")
    ap.add_argument("--steps", type=int, default=18, help="learner steps per run (equal compute in every arm; "
                    "an RL arm's 18 take 12-15 min on 2 idle cores; 0: --minutes alone)")
    ap.add_argument("--minutes", type=float, default=30.0, help="training minutes per run, at most (a bound: "
                    "--steps is the compute)")
    ap.add_argument("--train-pool", type=int, default=None, help="RL's train pool: fresh instances "
                    "(default: the demo's, swarl.demo.run.TRAIN_POOL); 0: the fixed train split (96)")
    ap.add_argument("--report-only", action="store_true", help="re-render from benchmarks/demo_learning.json")
    ap.add_argument("--from-run", type=Path, default=None,
                    help="record this finished `swarl demo --seeds` run directory instead of running")
    ap.add_argument("demo_args", nargs="*", help="after --: passed to `swarl demo`")
    a = ap.parse_args()
    if a.report_only:
        data = json.loads(OUT_JSON.read_text())
    else:
        t0 = time.monotonic()
        if a.from_run and (why := settings_disagree(a.from_run, [*DESIGN, *a.demo_args])):
            raise SystemExit(f"{a.from_run} did not run with these settings:\n  " + "\n  ".join(why))
        run_dir = a.from_run.resolve() if a.from_run else run(a.seeds, a.minutes, a.steps, a.train_pool, a.demo_args)
        data = collect(run_dir, [int(x) for x in a.seeds.split(",") if x])
        if a.from_run:
            a.seeds = ",".join(str(r["seed"]) for r in data["runs"]["rl"])
        data["meta"] = {"command": f"benchmarks/demo_learning.py --seeds {a.seeds}"
                        + (f" --steps {a.steps}" if a.steps else "")
                        + (f" --minutes {a.minutes:g}" if a.minutes is not None else "")
                        + (f" --train-pool {a.train_pool}" if a.train_pool is not None else "")
                        + (" -- " + " ".join(a.demo_args) if a.demo_args else ""),
                        "demo_args": [*DESIGN, *a.demo_args],
                        "wall_minutes": (_wall_minutes(run_dir) if a.from_run
                                         else round((time.monotonic() - t0) / 60, 1)),
                        "run_dir": str(run_dir),
                        "demo": [r["result"] for arm in data["runs"].values() for r in arm],
                        "temperature": sampling_temperature(Path(data["runs"]["rl"][0]["result"]["run_dir"]))}
        OUT_JSON.write_text(json.dumps(data, indent=1) + "\n")
        shutil.copy(run_dir / "learning-seeds.png", OUT_PNG)
    agg = aggregate(data["runs"]["rl"], data["runs"].get("shuffled", []))
    meta = data.get("meta", {})
    results = [r["result"] for r in data["runs"]["rl"]]
    samples = sorted(r["samples_trained"] for r in results)
    steps = sorted(r.get("learner_steps", 0) for r in results)
    temp = f", sampling temperature {meta['temperature']:g}" if meta.get("temperature") is not None else ""
    wall = f"; {meta['wall_minutes']:g} min in all" if meta.get("wall_minutes") is not None else ""
    budget = (f"{results[0]['steps_budget']} learner steps per run (at most {results[0]['minutes']:g} min)"
              if results[0].get("steps_budget") else f"{results[0]['minutes']:g} min of training per run")
    pools = sorted({r.get("train_pool", 0) for r in results})
    seen = sorted(r.get("train_tasks_seen", 0) for r in results)
    trained_on = (f" RL trained on a pool of {pools[0]} fresh generated instances (train families and "
                  f"combinations; {seen[0]}–{seen[-1]} of them met per run)." if pools == [pools[0]] and pools[0]
                  else " RL trained on the fixed train split (96 instances)." if pools == [0] else "")
    partial = (f" A partial run: the seeds whose every arm finished ({', '.join(map(str, agg['seeds']))})."
               if data.get("partial") else "")
    design = (f"; every `swarl demo` call with `{' '.join(meta['demo_args'])}`" if meta.get("demo_args") else "")
    attached = [r for r in results if r.get("sft_control_from")]
    attached_s = "".join(f" Seed {r['seed']}'s SFT control is that of the {Path(r['sft_control_from']).name} arm of run "
                         f"runs/{Path(r['sft_control_from']).parent.parent.name}, the same procedure "
                         f"(benchmarks/demo_attach_sft.py: same seed, steps, warm weights, settings and draws)."
                         for r in attached)
    how = (f"`{meta.get('command', 'benchmarks/demo_learning.py')}`{design}{wall}: {budget} "
           f"({steps[0]}–{steps[-1]} learner steps, {samples[0]}–{samples[-1]} samples trained{temp}).{short_arms(data['runs'])}"
           f"{code_clause(data['runs'])}"
           f"{trained_on}{partial}{attached_s} "
           f"Controls at the same seed: the same run with rewards permuted across each batch "
           f"(learner.reward_shuffle), and the warm start's SFT continued on its own data for as many steps "
           f"as the learner took. Every evaluation shares its sampling draws per (task, sample) "
           f"(common random numbers).")
    if not OUT_PNG.exists() or a.report_only:
        plot(agg, OUT_PNG, data.get("curves"))
    write_doc(DOC, markdown(agg, {"how": how}))
    rows = [[SPLIT_NAMES[k], s["before"]["mean"], s["after"]["mean"], s["change"]["mean"],
             f"[{s['change']['ci'][0]:+.3f}, {s['change']['ci'][1]:+.3f}]",
             s["shuffled_change"]["mean"] if s["shuffled_change"] else "-",
             s["sft_change"]["mean"] if s["sft_change"] else "-"] for k, s in agg["splits"].items()]
    summary = {f"{k}_change": s["change"]["mean"] for k, s in agg["splits"].items()}
    summary |= {f"{k}_goal_met": g["met"] for k, g in agg["goals"].items()}
    summary |= {f"{k}_goal_test_passes": g.get("passes") for k, g in agg["goals"].items()}
    summary["seeds"] = agg["seeds"]
    record("demo_learning", markdown_table(
        ["split", "before", "after", "RL change (mean)", "95% CI (seeds)", "shuffled-reward change", "SFT change"],
        rows), summary, notes=f"{how} Per seed, family and shape: docs/demo.md; plot: benchmarks/demo_learning.png.")
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
