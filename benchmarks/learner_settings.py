"""Which learner settings make learning show per CPU-minute, measured on the reading task
(swarl/learning_check.py: the real processes, the tiny model, chance 1/2).

Each setting is the learning check's defaults with a few keys changed; each runs `--steps`
learner steps per seed. The figures per setting: the resolve rate of the last 5 steps (mean
over seeds), the learner step and the CPU seconds (every process of the run: learner, actor,
server) at which the rolling mean of 3 steps first reached 0.8 (median over the seeds that did;
how many did), and the mean CPU seconds per learner step. CPU seconds, not wall time: they do not
depend on what else the machine runs. Writes benchmarks/learner_settings.{json,png} and a section
of RESULTS.md; docs/learner.md's table quotes it.

    .venv/bin/python benchmarks/learner_settings.py [--seeds 0,1] [--steps 40] [--only NAME,...]

`make learning-seeds` runs the default and the shuffled-reward control over five seeds.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent)]  # the packages before benchmarks/ (benchmarks/weight_sync.py shadows them)

from benchmarks._record import markdown_table, record  # noqa: E402
from swarl.learning_check import SETTINGS, CheckOptions, run_check  # noqa: E402

# the check's defaults the record names (read from SETTINGS, so the record cannot drift from it)
SHOWN = ("learner.minibatches", "learner.epochs", "learner.lr", "learner.kl_coef", "learner.aggregation",
         "learner.n_samples_per_prompt", "admission.batch_size", "learner.max_update_kl")

# name -> overrides of the learning check's defaults (SETTINGS)
VARIANTS: dict[str, dict[str, Any]] = {
    "the check's default: 4 minibatches, lr 3e-4": {},
    "4 minibatches, lr 1e-4": {"learner.lr": 1e-4},
    "1 update per batch, lr 1e-4": {"learner.minibatches": 1, "learner.lr": 1e-4},
    "1 update per batch, lr 4e-4": {"learner.minibatches": 1, "learner.lr": 4e-4},
    "4 minibatches x 2 epochs, lr 1e-4": {"learner.epochs": 2, "learner.lr": 1e-4},
    "4 minibatches, lr 3e-5": {"learner.lr": 3e-5},
    "kl_coef 0.01 (reference model), lr 1e-4": {"learner.kl_coef": 0.01, "learner.lr": 1e-4},
    "sequence aggregation, lr 1e-4": {"learner.aggregation": "sequence", "learner.lr": 1e-4},
    "group 4 (16 prompts a step), lr 1e-4": {"learner.n_samples_per_prompt": 4, "learner.lr": 1e-4},
    "group 16 (4 prompts a step), lr 1e-4": {"learner.n_samples_per_prompt": 16, "learner.lr": 1e-4},
    # the control: each batch's rewards permuted across it (must not rise)
    "shuffled-reward control, lr 1e-4": {"learner.reward_shuffle": True, "learner.lr": 1e-4},
    "shuffled-reward control at the check's default": {"learner.reward_shuffle": True},
}


def options(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--seeds", default="0,1", help="comma-separated seeds per setting")
    ap.add_argument("--steps", type=int, default=40, help="learner steps per run")
    ap.add_argument("--only", default="", help="comma-separated setting names (default: all)")
    ap.add_argument("--run-dir", default=str(HERE.parent / "runs" / "learner-settings"))
    ap.add_argument("--no-record", action="store_true", help="do not rewrite RESULTS.md, the JSON and PNG")
    return ap.parse_args(argv)


def sets_of(overrides: dict[str, Any]) -> list[str]:
    return [f"{k}={json.dumps(v) if isinstance(v, str) else v}" for k, v in overrides.items()]


def summary(name: str, runs: list[dict[str, Any]]) -> dict[str, Any]:
    reached = [r for r in runs if r["step_at_bar"] is not None]
    per_step = [r["cpu_s"] / r["steps"] for r in runs if r.get("cpu_s") and r["steps"]]
    return {"setting": name, "seeds": [r["seed"] for r in runs],
            "last5": statistics.mean(r["last"] for r in runs), "first5": statistics.mean(r["first"] for r in runs),
            "reached": f"{len(reached)}/{len(runs)}",
            "step_at_bar": statistics.median(r["step_at_bar"] for r in reached) if reached else None,
            "cpu_s_at_bar": statistics.median(r["cpu_s_at_bar"] for r in reached) if reached else None,
            "cpu_s_per_step": statistics.mean(per_step) if per_step else None,
            "mismatch_kl_max": max(r["mismatch_kl_max"] for r in runs)}


def plot(results: dict[str, list[dict[str, Any]]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 5))
    for i, (name, runs) in enumerate(results.items()):
        for k, r in enumerate(runs):
            xs = [c["cpu_s"] for c in r["curve"] if c["cpu_s"] is not None]
            ys = [c["resolve_rate"] for c in r["curve"] if c["cpu_s"] is not None]
            ax.plot(xs, ys, color=f"C{i % 10}", alpha=0.8, label=name if k == 0 else None,
                    linestyle="-" if i < 10 else "--")
    ax.axhline(0.5, color="grey", linestyle=":", label="chance")
    ax.axhline(0.8, color="black", linestyle=":", linewidth=0.8)
    ax.set_xlabel("CPU seconds (learner + actor + server)")
    ax.set_ylabel("resolve rate of the step's episodes")
    ax.set_title("reading task: learning per CPU-second, by learner setting")
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    o = options(argv)
    seeds = [int(s) for s in o.seeds.split(",") if s.strip()]
    names = [n for n in VARIANTS if not o.only or any(part.strip() in n for part in o.only.split(","))]
    results: dict[str, list[dict[str, Any]]] = {}
    t0 = time.monotonic()
    for name in names:
        for seed in seeds:
            tag = "".join(c if c.isalnum() else "-" for c in name)[:40] + f"-s{seed}"
            overrides = dict(VARIANTS[name])
            arm = "shuffled" if overrides.pop("learner.reward_shuffle", False) else "rl"
            res = run_check(CheckOptions(run_dir=Path(o.run_dir) / tag, steps=o.steps, seconds=1800, seed=seed,
                                         arm=arm, sets=sets_of(overrides),
                                         say=lambda m, t=tag: print(f"[{t}] {m}", flush=True)))
            results.setdefault(name, []).append(res)
            print(f"{name}, seed {seed}: {res['first']:.2f} -> {res['last']:.2f}, bar at step "
                  f"{res['step_at_bar']} ({res['cpu_s_at_bar']} CPU s), {res['cpu_s']:.0f} CPU s in all; "
                  f"{(time.monotonic() - t0) / 60:.1f} min so far", flush=True)
    rows = [summary(n, rs) for n, rs in results.items()]
    table = markdown_table(
        ["setting", "last 5 steps", "reached 0.8", "step at 0.8", "CPU s at 0.8", "CPU s / step", "mismatch KL max"],
        [[r["setting"], r["last5"], r["reached"], r["step_at_bar"] if r["step_at_bar"] is not None else "-",
          r["cpu_s_at_bar"] if r["cpu_s_at_bar"] is not None else "-", r["cpu_s_per_step"] or "-",
          r["mismatch_kl_max"]] for r in rows])
    print(table)
    if o.no_record:
        return
    (HERE / "learner_settings.json").write_text(json.dumps(
        {"defaults": SETTINGS, "variants": VARIANTS, "steps": o.steps, "seeds": seeds, "summary": rows,
         "runs": results}, indent=1))
    plot(results, HERE / "learner_settings.png")
    record("learner_settings", table, {"steps": o.steps, "seeds": seeds},
           notes=f"Reading task (swarl learning-check), {o.steps} learner steps per run, seeds {seeds}; every "
                 f"setting is the check's defaults ({', '.join(f'{k} {SETTINGS[k]}' for k in SHOWN)}) with the "
                 "named change. CPU seconds of all the run's processes. "
                 "Curves: benchmarks/learner_settings.png.")


if __name__ == "__main__":
    main()
