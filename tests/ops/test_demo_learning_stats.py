"""The demo's evidence (swarl.demo.stats, swarl.demo.report): intervals that cover what
they should and exclude what they should, a cluster bootstrap that widens when outcomes move
together by family, t intervals over seeds, the outcome breakdown, the per-family and per-shape
rows, the summary across seeds with both controls, its PNG and the generated docs section."""

from __future__ import annotations

import random

import numpy as np

from swarl.demo.report import DOC_BEGIN, DOC_END, aggregate, markdown, plot, write_doc
from swarl.demo.run import flat_result, learning_report
from swarl.demo.stats import (
    OUTCOMES,
    across_families,
    breakdown,
    change,
    cluster_boot,
    outcome,
    rate,
    summary_across,
)


def _episodes(rates: dict[str, float], n: int, rng: random.Random) -> list[dict]:
    return [{"instance_id": t, "sample": k, "resolved": rng.random() < p, "ending": "submitted", "patch_chars": 10}
            for t, p in rates.items() for k in range(n)]


def test_no_change_interval_covers_zero_and_a_rise_excludes_it() -> None:
    rng = random.Random(0)
    tasks = {f"t{i}": rng.random() * 0.6 for i in range(40)}
    same = change(_episodes(tasks, 4, rng), _episodes(tasks, 4, rng))
    assert same["ci"][0] <= 0.0 <= same["ci"][1], same
    risen = {t: min(1.0, p + 0.3) for t, p in tasks.items()}
    up = change(_episodes(tasks, 4, rng), _episodes(risen, 4, rng))
    assert up["ci"][0] > 0.1 and up["change"] > 0.2, up


def test_interval_is_over_tasks_not_episodes() -> None:
    # 4 tasks with many episodes each: the task-level interval stays wide (few tasks), where
    # an episode-level one would be narrow
    rng = random.Random(1)
    res = _episodes({"a": 0.0, "b": 1.0, "c": 0.0, "d": 1.0}, 200, rng)
    r = rate(res)
    assert r["tasks"] == 4 and r["episodes"] == 800
    assert r["ci"][1] - r["ci"][0] >= 0.5, r


def test_cluster_bootstrap_widens_when_outcomes_cluster_by_family() -> None:
    """The same 32 task values (half 1, half 0): scattered across 4 families, the interval over
    families and tasks is about as wide as over tasks; all 1s in two families and all 0s in the
    other two (what learning one family's edit does), it is much wider — 4 independent units,
    not 32. Without clusters both are the task-level interval."""
    values = {f"t{i}": float(i % 2) for i in range(32)}
    scattered = {f"t{i}": f"f{i // 8}" for i in range(32)}   # each family half 1s
    clustered = {f"t{i}": f"f{i % 2}{i // 16}" for i in range(32)}  # families all 1s or all 0s

    def width(clusters: dict[str, str] | None) -> float:
        lo, hi = np.quantile(cluster_boot(values, clusters, seed=3), [0.025, 0.975])
        return float(hi - lo)

    tasks, by_scattered, by_clustered = width(None), width(scattered), width(clustered)
    assert abs(by_scattered - tasks) < 0.1, (tasks, by_scattered)
    assert by_clustered > 2 * tasks, (tasks, by_clustered)
    # the change and the rate take the same clusters
    rng = random.Random(2)
    tasks_p = {t: 0.2 + 0.6 * v for t, v in values.items()}
    b, a = _episodes(dict.fromkeys(values, 0.2), 4, rng), _episodes(tasks_p, 4, rng)
    c_tasks, c_fams = change(b, a), change(b, a, clusters=clustered)
    assert c_tasks["change"] == c_fams["change"]
    assert c_fams["ci"][1] - c_fams["ci"][0] > 1.5 * (c_tasks["ci"][1] - c_tasks["ci"][0]), (c_tasks, c_fams)


def test_t_interval_over_seeds() -> None:
    s = summary_across([0.1, 0.2, 0.3, 0.2, 0.2])
    # mean 0.2, sd 0.0707, t(4) 2.776: half width 0.0878
    assert s["mean"] == 0.2 and abs(s["ci"][0] - 0.1122) < 1e-3 and abs(s["ci"][1] - 0.2878) < 1e-3, s
    assert summary_across([0.3])["ci"] == [0.3, 0.3]
    fams = across_families([{"a": {"change": 0.4, "tasks": 8}, "b": {"change": 0.0, "tasks": 8}}] * 3)
    assert fams["mean"] == 0.2 and fams["ci"][0] <= 0.0 and fams["ci"][1] >= 0.4 and fams["families"] == 2


def test_outcomes() -> None:
    assert outcome({"error": "infra"}) == "error"
    assert outcome({"resolved": True, "ending": "submitted"}) == "resolved"
    assert outcome({"ending": "submitted", "patch_chars": 12}) == "wrong_fix"
    assert outcome({"ending": "submitted", "patch_chars": 0}) == "no_change"
    assert outcome({"ending": "step", "format_errors": 2}) == "malformed"
    assert outcome({"ending": "step", "format_errors": 0}) == "step_limit"
    b = breakdown([{"ending": "step"}, {"resolved": True}])
    assert list(b) == list(OUTCOMES) and b["step_limit"] == 0.5 and b["resolved"] == 0.5


SPLITS = ("train", "heldout", "heldout_family", "handwritten")


def _run(seed: int, rise: float, sft_rise: float = 0.0) -> dict:
    rng = random.Random(seed)
    before, after, sft, groups = {}, {}, {}, {"family": {}, "shape": {}}
    for split in SPLITS:
        tasks = {f"{split}{i}": rng.random() * 0.5 for i in range(16)}
        for i, t in enumerate(tasks):
            groups["family"][t] = f"fam{i % 4}"
            groups["shape"][t] = f"fam{i % 4}:form{i % 2}/return"
        before[split] = _episodes(tasks, 3, rng)
        after[split] = _episodes({t: min(1.0, p + rise) for t, p in tasks.items()}, 3, rng)
        sft[split] = _episodes({t: min(1.0, p + sft_rise) for t, p in tasks.items()}, 3, rng)
    report = learning_report(before, after, {"sft": sft}, seed=seed, groups=groups)
    return {**report, "result": flat_result(report)}


def test_report_and_summary_across_seeds(tmp_path) -> None:
    runs = [_run(s, 0.45) for s in range(5)]
    shuffled = [_run(s, 0.0) for s in range(5)]
    flat = runs[0]["result"]
    for k in ("train_before", "train_after", "heldout_before", "heldout_after", "train_change_ci",
              "heldout_sft_change", "heldout_sft_change_ci", "handwritten_change"):
        assert k in flat, k
    d = runs[0]["splits"]["heldout"]
    assert set(d["per_family"]) == {"fam0", "fam1", "fam2", "fam3"} and d["per_family"]["fam0"]["tasks"] == 4
    assert len(d["per_shape"]) == 4 and "controls" in d and "sft" in d["controls"]
    agg = aggregate(runs, shuffled)
    assert agg["goals"]["heldout"]["met"] and agg["goals"]["train"]["met"], agg["goals"]
    s = agg["splits"]["heldout"]
    assert s["shuffled_change"]["ci"][0] <= 0.0 <= s["shuffled_change"]["ci"][1] + 0.05, s["shuffled_change"]
    assert set(s["per_family"]["fam0"]) >= {"before", "after", "change", "shuffled_change", "sft_change"}
    # no rise, or a control that rises as much: the goal is not met
    assert not aggregate(shuffled, shuffled)["goals"]["heldout"]["met"]
    assert not aggregate(runs, [_run(s, 0.45) for s in range(5)])["goals"]["heldout"]["met"]
    assert not aggregate([_run(s, 0.45, sft_rise=0.45) for s in range(5)], shuffled)["goals"]["heldout"]["met"]
    assert not aggregate(runs)["goals"]["heldout"]["met"]  # without the shuffled control: not shown
    # fewer seeds than the goal names: the test's outcome is shown, the goal is not met
    three = aggregate(runs[:3], shuffled[:3])["goals"]["heldout"]
    assert three["passes"] and not three["met"] and three["seeds"] == 3
    assert "passes on 3 seeds" in markdown(aggregate(runs[:3], shuffled[:3]), {"how": "synthetic"})
    png = plot(agg, tmp_path / "learning.png")
    assert png.stat().st_size > 10_000
    doc = tmp_path / "demo.md"
    doc.write_text(f"# demo\n\nbefore\n\n{DOC_BEGIN}\nold\n{DOC_END}\n\nafter\n")
    write_doc(doc, markdown(agg, {"how": "synthetic"}))
    text = doc.read_text()
    assert "old" not in text and text.startswith("# demo") and text.rstrip().endswith("after")
    assert "held-out combinations" in text and "shuffled rewards" in text and "Per code shape" in text
    assert "hand-written suite" in text


def test_a_marked_section_is_replaced_or_created() -> None:
    """common.marked (docs/demo.md's sections, benchmarks/RESULTS.md): the block between the
    markers is replaced and nothing around it moves; a second section with the same end marker
    further down is untouched; without the markers the block is appended after its heading."""
    from common.marked import replace_marked

    b, e = "<!-- x:start -->", "<!-- x:end -->"
    text = f"# doc\n\nkept\n{b}\nold\n{e}\ntail\n{b.replace('x', 'y')}\nother\n{e}\n"
    new = replace_marked(text, b, e, f"{b}\nnew\n{e}")
    assert new == f"# doc\n\nkept\n{b}\nnew\n{e}\ntail\n{b.replace('x', 'y')}\nother\n{e}\n"
    assert replace_marked(new, b, e, f"{b}\nnew\n{e}") == new  # idempotent
    assert replace_marked("# doc\n\n", b, e, f"{b}\nz\n{e}", absent="## X\n\n") == f"# doc\n\n## X\n\n{b}\nz\n{e}\n"
    assert replace_marked(f"# doc\n{e}\n", b, e, f"{b}\nz\n{e}").endswith(f"{e}\n\n{b}\nz\n{e}\n")  # an end alone


def test_curves_per_arm_over_the_steps_every_seed_reached(tmp_path) -> None:
    from swarl.demo.report import curves

    def rows(n: int, rate: float, ent: float) -> list[dict]:
        return [{"step": s, "resolve_rate": rate, "entropy": ent + s, "update_kl": 0.001} for s in range(1, n + 1)]

    c = curves({"rl": [rows(4, 1.0, 0.0), rows(3, 0.0, 1.0)], "shuffled": [rows(3, 0.5, 0.0)]})
    e = c["rl"]["entropy"]
    assert c["rl"]["seeds"] == 2 and e["step"] == [1, 2, 3]  # seed 0's step 4: not every seed's
    assert e["mean"] == [1.5, 2.5, 3.5] and e["lo"] == [1.0, 2.0, 3.0] and e["hi"] == [2.0, 3.0, 4.0]
    assert c["rl"]["resolve_rate"]["mean"] == [0.5, 0.5, 0.5]
    assert c["rl"]["zero_spread_groups_frac"]["step"] == []  # a key no row has: no curve
    smooth = curves({"rl": [[{"step": s, "resolve_rate": float(s % 2)} for s in range(1, 5)]]})
    assert smooth["rl"]["resolve_rate"]["mean"] == [1.0, 0.5, 2 / 3, 0.5]  # running mean of 5
    agg = aggregate([_run(s, 0.45) for s in range(3)], [_run(s, 0.0) for s in range(3)])
    with_steps, without = plot(agg, tmp_path / "a.png", c), plot(agg, tmp_path / "b.png")
    assert with_steps.stat().st_size > without.stat().st_size > 10_000
