"""Per-step curves of several `swarl demo` runs side by side: the train resolve rate (running
mean of 5 steps, chance 0.5), the policy's entropy, the KL each step's updates moved the policy
and the gradient norm (the largest of the step's updates), from each run's metrics.jsonl; the
share of train episodes whose edit searched for what their inspection showed (the choice that
decides the generated suite's outcome: swe.tasks.generated.edit_reads_line), per 10 policy
versions with its 95% interval, from the run's trajectories (swarl.demo.choice); and the share of those whose
command then failed (garbled after the choice); the choice in the held-out evaluation before and
after (learning.json's eval_choice), and each run's before/after held-out rate from its
result.json.

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
from swarl.demo.choice import BIN, summary
from swarl.demo.report import running_mean


def load(run_dir: Path) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    rows = [r for r in read_metrics(run_dir / "metrics.jsonl") if EVAL_VERSION not in r and "step" in r]
    res = run_dir / "result.json"
    return sorted(rows, key=lambda r: r["step"]), (json.loads(res.read_text()) if res.exists() else {})


def _f(x: float | None, fmt: str = ".2f") -> str:
    return "-" if x is None else format(x, fmt)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", help="LABEL=RUN_DIR")
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 3, figsize=(16, 7.6))
    ax = axes.flatten()
    print("| run | learner steps | resolve rate per step, steps 1-10 → last 10 | held-out before → after "
          "(change, 95% interval) | held-out, edit reads the line (evaluation) before → after | train "
          f"episodes, edit reads the line: first {BIN} versions → last full {BIN} | read the line, command "
          "failed (last full bin) | update KL p50 / max | largest grad norm | updates cut (spike clip / "
          "trust region) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for spec in a.runs:
        label, _, d = spec.partition("=")
        run = Path(d)
        rows, res = load(run)
        xs = [r["step"] for r in rows]
        for i, key, fn in ((0, "resolve_rate", running_mean), (1, "entropy", None),
                           (2, "update_kl", None), (3, "grad_norm_max", None)):
            ys = [float(r.get(key, float("nan"))) for r in rows]
            ax[i].plot(xs, fn(ys) if fn else ys, label=label, lw=1.2)
        sm = summary(run / "trajectories")  # its last bin: the last full one
        if sm:  # up to the last full bin: a run's final versions hold a few episodes (one read at 1.00)
            bins = sm["bins"][: sm["bins"].index(sm["last"]) + 1]
            xs_v = [b["versions"][0] + BIN / 2 for b in bins]
            line = ax[4].errorbar(xs_v, [b["share"] for b in bins], yerr=[b["half_width"] for b in bins],
                                  label=label, lw=1.2, capsize=2)
            ax[5].plot(xs_v, [b["read_but_failed"] for b in bins],
                       label=label, lw=1.2, color=line.lines[0].get_color())
        ev = json.loads((run / "learning.json").read_text()).get("eval_choice", {}) if (run / "learning.json").exists() else {}
        if not ev:
            from swarl.demo.choice import evaluations

            ev = evaluations(run / "eval")
        rr = [float(r.get("resolve_rate", float("nan"))) for r in rows]
        ukl = sorted(float(r.get("update_kl", 0.0)) for r in rows)
        ci = res.get("heldout_change_ci", [float("nan")] * 2)
        ev_b, ev_a = ev.get("before-heldout", {}).get("share"), ev.get("after-heldout", {}).get("share")
        print(f"| {label} | {len(rows)} | {sum(rr[:10]) / max(1, len(rr[:10])):.2f} → {sum(rr[-10:]) / max(1, len(rr[-10:])):.2f} | "
              f"{res.get('heldout_before', float('nan')):.3f} → {res.get('heldout_after', float('nan')):.3f} "
              f"({res.get('heldout_change', float('nan')):+.3f}, [{ci[0]:+.3f}, {ci[1]:+.3f}]) | {_f(ev_b)} → {_f(ev_a)} | "
              + (f"{sm['first']['share']:.2f} ± {sm['first']['half_width']:.2f} → {sm['last']['share']:.2f} ± "
                 f"{sm['last']['half_width']:.2f} | {sm['last']['read_but_failed']:.2f} | " if sm else "- | - | ")
              + f"{ukl[len(ukl) // 2] if ukl else 0:.2g} / {ukl[-1] if ukl else 0:.2g} | "
              f"{max((r.get('grad_norm_max', 0.0) for r in rows), default=0):.3g} | "
              f"{sum(r.get('spike_clipped', 0.0) for r in rows):.0f} / {sum(r.get('update_backtracked', 0.0) for r in rows):.0f} |")
    ax[0].axhline(0.5, color="#d1495b", ls="--", lw=1, label="chance")
    ax[0].set(title="train resolve rate (running mean of 5)", ylim=(-0.02, 1.02))
    ax[1].set(title="entropy (per loss token)")
    ax[2].set(title="update KL (log)", yscale="log")
    ax[3].set(title="grad norm, largest update (log)", yscale="log")
    ax[4].axhline(0.5, color="#d1495b", ls="--", lw=1)
    ax[4].set(title=f"edit reads the line (train episodes, per {BIN} versions)", ylim=(-0.02, 1.02))
    ax[5].set(title="read the line, but the command failed", ylim=(-0.01, 0.5))
    for x in ax[:4]:
        x.set_xlabel("learner step")
    for x in ax[4:]:
        x.set_xlabel("policy version")
    ax[0].legend(fontsize=7)
    fig.tight_layout()
    a.out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(a.out, dpi=90)
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
