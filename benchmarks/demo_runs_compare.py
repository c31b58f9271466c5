"""Per-step curves of several `swarl demo` runs side by side: the train resolve rate (running
mean of 5 steps, chance 0.5), the policy's entropy, the KL each step's updates moved the policy
and the gradient norm (the largest of the step's updates), from each run's metrics.jsonl; the
share of train episodes whose edit searched for what their inspection showed (the choice that
decides the generated suite's outcome: swe.tasks.generated.edit_reads_line), per 10 policy
versions with its 95% interval, from the run's trajectories (swarl.demo.choice); and each run's before/after
held-out rate from its result.json.

    .venv/bin/python benchmarks/demo_runs_compare.py --out benchmarks/demo_runs.png \\
        "default, 5 min=runs/demo-A" "lr 3e-4, no KL, 12 min=runs/demo-B" ...

Prints one row per run (a Markdown table) and writes the PNG.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from learner.metrics_log import EVAL_VERSION, read_metrics
from swarl.demo.choice import BIN, choices, share, summary
from swarl.demo.report import running_mean


def load(run_dir: Path) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    rows = [r for r in read_metrics(run_dir / "metrics.jsonl") if EVAL_VERSION not in r and "step" in r]
    res = run_dir / "result.json"
    return sorted(rows, key=lambda r: r["step"]), (json.loads(res.read_text()) if res.exists() else {})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", help="LABEL=RUN_DIR")
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 5, figsize=(21, 3.8))
    print("| run | learner steps | held-out before → after (change, 95% interval) | edit reads the line: "
          f"first {BIN} versions → last full {BIN} | largest update KL | largest grad norm |")
    print("|---|---|---|---|---|---|")
    for spec in a.runs:
        label, _, d = spec.partition("=")
        rows, res = load(Path(d))
        xs = [r["step"] for r in rows]
        for ax, key, fn in ((axes[0], "resolve_rate", running_mean), (axes[1], "entropy", None),
                            (axes[2], "update_kl", None), (axes[3], "grad_norm_max", None)):
            ys = [float(r.get(key, float("nan"))) for r in rows]
            ax.plot(xs, fn(ys) if fn else ys, label=label, lw=1.2)
        ch = choices(Path(d) / "trajectories")
        if ch:
            pts = [(v + BIN / 2, *share(xs)) for v, xs in ch.items()]
            axes[4].errorbar([p[0] for p in pts], [p[1] for p in pts], yerr=[p[2] for p in pts],
                             label=label, lw=1.2, capsize=2)
        sm = summary(Path(d) / "trajectories")  # its last bin: the last full one
        first, last = (((sm["first"]["share"], sm["first"]["half_width"]), (sm["last"]["share"], sm["last"]["half_width"]))
                       if sm else ((float("nan"),) * 2,) * 2)
        ci = res.get("heldout_change_ci", [float("nan")] * 2)
        print(f"| {label} | {len(rows)} | {res.get('heldout_before', float('nan')):.3f} → "
              f"{res.get('heldout_after', float('nan')):.3f} ({res.get('heldout_change', float('nan')):+.3f}, "
              f"[{ci[0]:+.3f}, {ci[1]:+.3f}]) | {first[0]:.2f} ± {first[1]:.2f} → {last[0]:.2f} ± {last[1]:.2f} | {max((r.get('update_kl', 0.0) for r in rows), default=0):.3g} | "
              f"{max((r.get('grad_norm_max', 0.0) for r in rows), default=0):.3g} |")
    axes[0].axhline(0.5, color="#d1495b", ls="--", lw=1, label="chance")
    axes[0].set(title="train resolve rate (running mean of 5)", ylim=(-0.02, 1.02))
    axes[1].set(title="entropy (per loss token)")
    axes[2].set(title="update KL (log)", yscale="log")
    axes[3].set(title="grad norm, largest update (log)", yscale="log")
    axes[4].axhline(0.5, color="#d1495b", ls="--", lw=1)
    axes[4].set(title=f"edit reads the line (train episodes, per {BIN} versions)", ylim=(-0.02, 1.02))
    for ax in axes[:4]:
        ax.set_xlabel("learner step")
    axes[4].set_xlabel("policy version")
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    a.out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(a.out, dpi=90)
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
