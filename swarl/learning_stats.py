"""The demo's evidence of learning: resolve rates per split with 95% intervals, the change from
before to after training with a paired bootstrap over tasks, and what each episode ended as.

Tasks are the unit of resampling (the episodes of one task are not independent draws of the
policy's skill on the suite), and the change is paired: the same tasks are resampled for before
and after. A percentile bootstrap in numpy (scipy.stats.bootstrap would do the same; scipy is
not otherwise a dependency)."""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np

OUTCOMES = ("resolved", "wrong_fix", "no_change", "malformed", "step_limit", "error")
N_BOOT = 4000


def outcome(res: dict[str, Any]) -> str:
    """What one evaluated episode ended as:
    resolved; wrong_fix (submitted a patch the tests reject); no_change (submitted an empty
    patch); malformed (never submitted and wrote at least one reply without exactly one
    action); step_limit (never submitted: the step, context or time limit); error (an
    infrastructure failure: nothing was graded)."""
    if res.get("error"):
        return "error"
    if res.get("resolved"):
        return "resolved"
    if res.get("ending") == "submitted":
        return "wrong_fix" if res.get("patch_chars", 1) else "no_change"
    return "malformed" if res.get("format_errors", 0) else "step_limit"


def per_task(results: list[dict[str, Any]]) -> dict[str, float]:
    """Each task's resolve rate over its episodes (errors count as unresolved)."""
    by: dict[str, list[float]] = {}
    for r in results:
        by.setdefault(r["instance_id"], []).append(1.0 if r.get("resolved") else 0.0)
    return {k: float(np.mean(v)) for k, v in by.items()}


def _interval(boot: np.ndarray, level: float) -> tuple[float, float]:
    lo, hi = np.quantile(boot, [(1 - level) / 2, 1 - (1 - level) / 2])
    return round(float(lo), 4), round(float(hi), 4)


def rate(results: list[dict[str, Any]], seed: int = 0, level: float = 0.95) -> dict[str, Any]:
    """The split's resolve rate (mean over tasks) and its bootstrap interval over tasks."""
    t = np.array(list(per_task(results).values()))
    if t.size == 0:
        return {"rate": 0.0, "ci": [0.0, 0.0], "tasks": 0, "episodes": 0}
    rng = np.random.default_rng(seed)
    boot = t[rng.integers(0, t.size, size=(N_BOOT, t.size))].mean(axis=1)
    return {"rate": round(float(t.mean()), 4), "ci": list(_interval(boot, level)),
            "tasks": int(t.size), "episodes": len(results)}


def change(before: list[dict[str, Any]], after: list[dict[str, Any]], seed: int = 0,
           level: float = 0.95) -> dict[str, Any]:
    """after - before over the tasks both evaluated, with a paired bootstrap interval."""
    b, a = per_task(before), per_task(after)
    common = sorted(set(b) & set(a))
    if not common:
        return {"change": 0.0, "ci": [0.0, 0.0], "tasks": 0}
    d = np.array([a[k] - b[k] for k in common])
    rng = np.random.default_rng(seed)
    boot = d[rng.integers(0, d.size, size=(N_BOOT, d.size))].mean(axis=1)
    return {"change": round(float(d.mean()), 4), "ci": list(_interval(boot, level)), "tasks": len(common)}


def breakdown(results: list[dict[str, Any]]) -> dict[str, float]:
    """Fraction of episodes per outcome (every outcome present, in OUTCOMES order)."""
    c = Counter(outcome(r) for r in results)
    n = max(1, len(results))
    return {k: round(c.get(k, 0) / n, 4) for k in OUTCOMES}


def summary_across(values: list[float], seed: int = 0, level: float = 0.95) -> dict[str, Any]:
    """Mean over seeds with a bootstrap interval over seeds (few seeds: a rough interval)."""
    v = np.array(values, dtype=float)
    if v.size == 0:
        return {"mean": 0.0, "ci": [0.0, 0.0], "n": 0}
    rng = np.random.default_rng(seed)
    boot = v[rng.integers(0, v.size, size=(N_BOOT, v.size))].mean(axis=1)
    return {"mean": round(float(v.mean()), 4), "ci": list(_interval(boot, level)), "n": int(v.size),
            "min": round(float(v.min()), 4)}
