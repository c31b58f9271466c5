"""The demo's evidence (swarl.learning_stats, swarl.demo_report): intervals that cover what
they should and exclude what they should, the outcome breakdown, the summary across seeds, its
PNG and the generated docs table."""

from __future__ import annotations

import random

from swarl.demo import flat_result, learning_report
from swarl.demo_report import DOC_BEGIN, DOC_END, aggregate, markdown, plot, write_doc
from swarl.learning_stats import OUTCOMES, breakdown, change, outcome, rate


def _episodes(rates: dict[str, float], n: int, rng: random.Random) -> list[dict]:
    return [{"instance_id": t, "resolved": rng.random() < p, "ending": "submitted", "patch_chars": 10}
            for t, p in rates.items() for _ in range(n)]


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


def test_outcomes() -> None:
    assert outcome({"error": "infra"}) == "error"
    assert outcome({"resolved": True, "ending": "submitted"}) == "resolved"
    assert outcome({"ending": "submitted", "patch_chars": 12}) == "wrong_fix"
    assert outcome({"ending": "submitted", "patch_chars": 0}) == "no_change"
    assert outcome({"ending": "step", "format_errors": 2}) == "malformed"
    assert outcome({"ending": "step", "format_errors": 0}) == "step_limit"
    b = breakdown([{"ending": "step"}, {"resolved": True}])
    assert list(b) == list(OUTCOMES) and b["step_limit"] == 0.5 and b["resolved"] == 0.5


def _run(seed: int, rise: float) -> dict:
    rng = random.Random(seed)
    splits = {}
    for split in ("train", "heldout", "heldout_family"):
        tasks = {f"{split}{i}": rng.random() * 0.5 for i in range(20)}
        after = {t: min(1.0, p + rise) for t, p in tasks.items()}
        splits[split] = (_episodes(tasks, 3, rng), _episodes(after, 3, rng), _episodes(tasks, 3, rng))
    report = learning_report({k: v[0] for k, v in splits.items()}, {k: v[1] for k, v in splits.items()},
                             {k: v[2] for k, v in splits.items()}, seed=seed)
    return {**report, "result": flat_result(report)}


def test_report_and_summary_across_seeds(tmp_path) -> None:
    runs = [_run(s, 0.35) for s in range(3)]
    flat = runs[0]["result"]
    for k in ("train_before", "train_after", "heldout_before", "heldout_after", "train_change_ci",
              "train_control_change", "heldout_beats_control"):
        assert k in flat, k
    assert flat["train_beats_control"] is True
    agg = aggregate(runs)
    assert agg["goals"]["train"]["met"] and agg["goals"]["heldout"]["met"], agg["goals"]
    flat_runs = [_run(s, 0.0) for s in range(3)]
    assert not aggregate(flat_runs)["goals"]["train"]["met"]
    png = plot(agg, tmp_path / "learning.png")
    assert png.stat().st_size > 10_000
    doc = tmp_path / "demo.md"
    doc.write_text(f"# demo\n\nbefore\n\n{DOC_BEGIN}\nold\n{DOC_END}\n\nafter\n")
    write_doc(doc, markdown(agg, {"how": "synthetic"}))
    text = doc.read_text()
    assert "old" not in text and text.startswith("# demo") and text.rstrip().endswith("after")
    assert "held-out repositories" in text and "beats control" in text
