"""`swarl plot RUN_DIR`: PNG curves from <run_dir>/metrics.jsonl (the learner's rows and the
eval worker's: eval/resolve_rate at the step that published each evaluated version), one file
per panel that has data."""

from __future__ import annotations

from pathlib import Path

from learner.metrics_log import EVAL_VERSION, read_metrics

PANELS: list[tuple[str, list[str]]] = [
    ("reward", ["reward_mean"]),
    ("resolve_rate", ["resolve_rate"]),
    ("eval", ["eval/resolve_rate"]),
    ("staleness", ["staleness/mean", "staleness/max", "dropped/stale"]),
    ("throughput", ["tokens_per_s"]),
    ("loss", ["loss", "pg_loss"]),
    # what says whether RL is working (learner.diagnostics), one scale per panel
    ("signal", ["zero_spread_groups_frac", "adv_abs_mean"]),
    ("entropy", ["entropy"]),
    ("grad_norm", ["grad_norm", "grad_norm_max"]),
    ("clip", ["clip_frac", "dual_clip_frac", "imp_weight_zeroed_frac"]),
    ("kl", ["mismatch_kl", "behav_kl", "update_kl"]),
]


def plot_run(run_dir: str | Path, out: str | Path | None = None) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    src = Path(run_dir) / "metrics.jsonl"
    if not src.exists():
        raise FileNotFoundError(f"{src} does not exist (has the learner run in {run_dir}?)")
    rows = read_metrics(src)
    out_dir = Path(out) if out else Path(run_dir) / "plots"
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for name, keys in PANELS:
        if not any(isinstance(r.get(k), int | float) for r in rows for k in keys):
            continue  # no panel without data (no evaluation ran, an older run's metrics)
        fig, ax = plt.subplots(figsize=(6, 3.5))
        drew = False
        for k in keys:
            # by step: eval rows are appended when an evaluation ends, after later learner steps
            pts = sorted((r["step"], r[k]) for r in rows if isinstance(r.get(k), int | float))
            if pts:
                xs, ys = zip(*pts, strict=True)
                ax.plot(xs, ys, label=k, marker="." if len(pts) < 50 else None)
                drew = True
                for r in rows:  # each eval point names the version it measured
                    if EVAL_VERSION in r and isinstance(r.get(k), int | float):
                        ax.annotate(f"v{r[EVAL_VERSION]}", (r["step"], r[k]), fontsize=7,
                                    textcoords="offset points", xytext=(2, 4))
        ax.set_xlabel("step")
        ax.set_title(name)
        if drew:
            ax.legend(fontsize=8)
        fig.tight_layout()
        p = out_dir / f"{name}.png"
        fig.savefig(p, dpi=80)
        plt.close(fig)
        written.append(p)
    return written
