"""The demo's evidence of learning: resolve rates per split with 95% intervals, the change from
before to after training, the same per bug family and per code shape, and what each episode
ended as.

Tasks are not independent draws: the tasks of one bug family share their edits, so what a
policy learns moves a family's tasks together. The intervals are a *cluster* bootstrap: the
families are resampled, then the tasks within each drawn family (two-stage, percentile), and a
change is paired (the same tasks resampled for before and after). With few families these
intervals are wide, as they should be. Across seeds: a t interval over the seeds' values.
Numpy only (scipy is not otherwise a dependency)."""

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


def cluster_boot(values: dict[str, float], clusters: dict[str, str] | None, seed: int = 0,
                 n_boot: int = N_BOOT) -> np.ndarray:
    """Bootstrap means of `values` (task -> value): clusters (task -> cluster; None or a task
    missing: each task its own cluster) drawn with replacement, then tasks within each drawn
    cluster. One cluster: only the tasks are resampled."""
    keys = sorted(values)
    groups: dict[str, list[float]] = {}
    for k in keys:
        groups.setdefault((clusters or {}).get(k, k), []).append(values[k])
    arrays = [np.array(v) for v in groups.values()]
    rng = np.random.default_rng(seed)
    if len(arrays) == 1 or all(a.size == 1 for a in arrays):  # one level: tasks
        a = np.concatenate(arrays)
        return a[rng.integers(0, a.size, size=(n_boot, a.size))].mean(axis=1)
    n_clusters = len(arrays)
    picks = rng.integers(0, n_clusters, size=(n_boot, n_clusters))
    total, count = np.zeros(n_boot), np.zeros(n_boot)
    for j in range(n_clusters):  # slot j of every replicate: a drawn cluster, its tasks resampled
        for c, a in enumerate(arrays):
            rows = np.flatnonzero(picks[:, j] == c)
            if rows.size:
                total[rows] += a[rng.integers(0, a.size, size=(rows.size, a.size))].sum(axis=1)
                count[rows] += a.size
    return total / count


def rate(results: list[dict[str, Any]], seed: int = 0, level: float = 0.95,
         clusters: dict[str, str] | None = None) -> dict[str, Any]:
    """The split's resolve rate (mean over tasks) and its bootstrap interval (over the
    clusters and their tasks: `clusters` maps task -> family; None: over tasks)."""
    t = per_task(results)
    if not t:
        return {"rate": 0.0, "ci": [0.0, 0.0], "tasks": 0, "episodes": 0}
    boot = cluster_boot(t, clusters, seed)
    return {"rate": round(float(np.mean(list(t.values()))), 4), "ci": list(_interval(boot, level)),
            "tasks": len(t), "episodes": len(results)}


def change(before: list[dict[str, Any]], after: list[dict[str, Any]], seed: int = 0,
           level: float = 0.95, clusters: dict[str, str] | None = None) -> dict[str, Any]:
    """after - before over the tasks both evaluated, with a paired (cluster) bootstrap interval."""
    b, a = per_task(before), per_task(after)
    common = sorted(set(b) & set(a))
    if not common:
        return {"change": 0.0, "ci": [0.0, 0.0], "tasks": 0}
    d = {k: a[k] - b[k] for k in common}
    boot = cluster_boot(d, clusters, seed)
    return {"change": round(float(np.mean(list(d.values()))), 4), "ci": list(_interval(boot, level)),
            "tasks": len(common)}


def by_group(before: list[dict[str, Any]], after: list[dict[str, Any]] | None,
             group: dict[str, str]) -> dict[str, dict[str, Any]]:
    """Per group (task -> group, e.g. family or code shape): rate before, after and the change
    (means over the group's tasks), and its task count."""
    b = per_task(before)
    a = per_task(after) if after is not None else {}
    out: dict[str, dict[str, Any]] = {}
    for g in sorted({group.get(k, "?") for k in b}):
        ks = [k for k in b if group.get(k, "?") == g]
        row: dict[str, Any] = {"tasks": len(ks), "before": round(float(np.mean([b[k] for k in ks])), 4)}
        if after is not None:
            common = [k for k in ks if k in a]
            row["after"] = round(float(np.mean([a[k] for k in common])), 4) if common else 0.0
            row["change"] = round(float(np.mean([a[k] - b[k] for k in common])), 4) if common else 0.0
        out[g] = row
    return out


def breakdown(results: list[dict[str, Any]]) -> dict[str, float]:
    """Fraction of episodes per outcome (every outcome present, in OUTCOMES order)."""
    c = Counter(outcome(r) for r in results)
    n = max(1, len(results))
    return {k: round(c.get(k, 0) / n, 4) for k in OUTCOMES}


# two-sided 95% t quantiles by degrees of freedom (1..30); beyond: the normal's
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160,
         2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056,
         2.052, 2.048, 2.045, 2.042)


def summary_across(values: list[float], seed: int = 0, level: float = 0.95) -> dict[str, Any]:
    """Mean over seeds with a 95% t interval over the seeds (one seed: no interval, the value
    itself); `level` other than 0.95: a percentile bootstrap over the seeds instead."""
    v = np.array(values, dtype=float)
    if v.size == 0:
        return {"mean": 0.0, "ci": [0.0, 0.0], "n": 0}
    m = float(v.mean())
    if v.size == 1:
        ci = (m, m)
    elif level == 0.95:
        half = (_T975[v.size - 2] if v.size - 1 <= len(_T975) else 1.96) * float(v.std(ddof=1)) / np.sqrt(v.size)
        ci = (m - half, m + half)
    else:
        rng = np.random.default_rng(seed)
        ci = _interval(v[rng.integers(0, v.size, size=(N_BOOT, v.size))].mean(axis=1), level)
    return {"mean": round(m, 4), "ci": [round(float(ci[0]), 4), round(float(ci[1]), 4)], "n": int(v.size),
            "min": round(float(v.min()), 4)}


def across_families(per_seed: list[dict[str, dict[str, Any]]], seed: int = 0,
                    level: float = 0.95) -> dict[str, Any]:
    """The change pooled over seeds with a cluster bootstrap over families: `per_seed` is each
    seed's by_group(...) by family; a family's value is its task-weighted change averaged over
    the seeds, and families (the independent units) are resampled, weighted by their tasks."""
    fams = sorted({f for d in per_seed for f in d})
    if not fams:
        return {"mean": 0.0, "ci": [0.0, 0.0], "families": 0}
    val = np.array([np.mean([d[f]["change"] for d in per_seed if f in d]) for f in fams])
    w = np.array([np.mean([d[f]["tasks"] for d in per_seed if f in d]) for f in fams], dtype=float)
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(fams), size=(N_BOOT, len(fams)))
    boot = (val[idx] * w[idx]).sum(axis=1) / w[idx].sum(axis=1)
    return {"mean": round(float((val * w).sum() / w.sum()), 4), "ci": list(_interval(boot, level)),
            "families": len(fams)}
