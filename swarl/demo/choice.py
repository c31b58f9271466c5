"""The choice that decides a generated task, read from a run's episodes: the share of train
episodes whose `sed` edit searched for what their inspection printed
(swe.tasks.generated.edit_reads_line), per bin of policy versions; the same share in each
evaluation (one policy); and how many of the right choices came in a command that then failed.

The before/after evaluations of a demo run (64 episodes a split, clustered by 4 families) give
95% intervals of about ±0.4 on a change; a run's training episodes (~30 a policy version) show
the choice moving long before such an evaluation can. It is reported beside the evaluations, never
instead of them: the goals (swarl.demo.report.GOALS) stay on the evaluated resolve rates.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from swe.tasks.generated import edit_reads_line, names_function

BIN = 10  # policy versions per bin


_RETURNCODE = re.compile(r"<returncode>(-?\d+)</returncode>")


def edit_failed(messages: list[dict[str, Any]]) -> bool | None:
    """Whether the episode's first `sed -i` command exited non-zero (the observation after it says
    so): a right choice whose command the policy garbled resolves nothing. None without one."""
    for i, m in enumerate(messages):
        if m.get("role") == "assistant" and "sed -i" in str(m.get("content", "")):
            nxt = messages[i + 1] if i + 1 < len(messages) else {}
            rc = _RETURNCODE.search(str(nxt.get("content", ""))) if nxt.get("role") == "user" else None
            return None if rc is None else int(rc.group(1)) != 0
    return None


def _read(traj_dir: Path) -> list[tuple[dict[str, Any], list[dict[str, Any]]]]:
    """(meta.json, messages) of every episode directory; ones still being written are left out."""
    out = []
    for d in sorted(traj_dir.glob("*/")):
        try:
            out.append((json.loads((d / "meta.json").read_text()),
                        json.loads((d / "traj.json").read_text()).get("messages", [])))
        except (OSError, ValueError):
            continue
    return out


def episodes(traj_dir: Path) -> list[tuple[int, bool, bool]]:
    """(policy version, edit read the line, edit command failed) of every episode that inspected
    and edited with sed; ones without a policy version (evaluations) are left out."""
    out = []
    for meta, messages in _read(traj_dir):
        try:
            version = int(meta["policy_version"])
        except (KeyError, TypeError, ValueError):
            continue
        reads = edit_reads_line(messages)
        if reads is not None:
            out.append((version, reads, bool(edit_failed(messages))))
    return out


def evaluated(eval_dir: Path) -> dict[str, Any] | None:
    """The choice in one evaluation (`<run>/eval/<name>-<split>`, one policy): the share of its
    episodes whose edit read the line, its 95% half-width, and read_but_failed; and `named`, the
    share of all its episodes whose first reply typed the function the issue names (the form a
    held-out instance asks first: copying a name never seen in training). None without an edit."""
    read = _read(eval_dir)
    eps = [(r, bool(edit_failed(m))) for _, m in read if (r := edit_reads_line(m)) is not None]
    if not eps:
        return None
    named = [n for _, m in read if (n := names_function(m)) is not None]
    return {**_stats(eps), "named": round(sum(named) / len(named), 4) if named else None}


def evaluations(eval_root: Path) -> dict[str, dict[str, Any]]:
    """`evaluated` of every evaluation of a run, by its directory name (before-heldout, ...)."""
    out = {}
    for d in sorted(p for p in eval_root.glob("*") if p.is_dir()) if eval_root.is_dir() else []:
        if (e := evaluated(d)) is not None:
            out[d.name] = e
    return out


def share(xs: list[bool]) -> tuple[float, float]:
    """The share and its 95% normal-approximation half-width (episodes taken as independent:
    the two of one instance are not quite, so it is a little narrow)."""
    p = sum(xs) / len(xs)
    return p, 1.96 * (p * (1 - p) / len(xs)) ** 0.5


def _stats(eps: list[tuple[bool, bool]]) -> dict[str, Any]:
    """Of (read the line, command failed) pairs: their number, the share that read the line with
    its 95% half-width, and the share that read it but failed."""
    p, hw = share([r for r, _ in eps])
    return {"episodes": len(eps), "share": round(p, 4), "half_width": round(hw, 4),
            "read_but_failed": round(sum(r and f for r, f in eps) / len(eps), 4)}


def summary(traj_dir: Path, bin_size: int = BIN) -> dict[str, Any] | None:
    """Every bin's share (and `read_but_failed`: the share of episodes whose edit read the line
    but whose command failed, garbled), the first and the last bin's (the last full one: a run's final
    versions have few episodes; the last bin is used when it holds at least half as many
    episodes as the mean bin) and the rise between them; None without any such episode."""
    by: dict[int, list[tuple[bool, bool]]] = {}
    for version, reads, failed in episodes(traj_dir):
        by.setdefault(version // bin_size * bin_size, []).append((reads, failed))
    if not by:
        return None
    bins = [{"versions": [v, v + bin_size - 1], **_stats(eps)} for v, eps in sorted(by.items())]
    mean_n = sum(b["episodes"] for b in bins) / len(bins)
    last = bins[-1] if bins[-1]["episodes"] >= mean_n / 2 or len(bins) == 1 else bins[-2]
    return {"bin": bin_size, "bins": bins, "first": bins[0], "last": last,
            "rise": round(last["share"] - bins[0]["share"], 4)}


def line(s: dict[str, Any] | None) -> str:
    """One line for a run's report."""
    if s is None:
        return "edit reads the line: no train episode with an inspection and an edit"
    f, la = s["first"], s["last"]
    return (f"edit reads the line (train episodes): versions {f['versions'][0]}-{f['versions'][1]} "
            f"{f['share']:.2f} ± {f['half_width']:.2f} ({f['episodes']}) -> {la['versions'][0]}-{la['versions'][1]} "
            f"{la['share']:.2f} ± {la['half_width']:.2f} ({la['episodes']}), rise {s['rise']:+.2f}; read the line "
            f"but the command failed {f['read_but_failed']:.2f} -> {la['read_but_failed']:.2f}")
