"""`swarl eval`'s pass@k (numbers worked out by hand) and its SWE-bench predictions files, read
back with the pinned swebench's own reader (swebench.harness.utils.get_predictions_from_file)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from actors.evaluate import pass_at_k, predictions, preds_name, summarize, write_predictions


def row(iid: str, k: int, resolved: bool, patch: str | None = "", error: str | None = None) -> dict:
    r = {"key": f"{iid}#{k}", "instance_id": iid, "sample": k, "resolved": resolved}
    if error:
        r.update(error=error, model_patch="")
    elif patch is not None:
        r["model_patch"] = patch
    return r


def test_pass_at_k_by_hand():
    # n=3, c=1: pass@1 = 1/3; pass@2 = 1 - C(2,2)/C(3,2) = 1 - 1/3; pass@3 = 1 - C(2,3)/1 = 1
    assert [pass_at_k(3, 1, k) for k in (1, 2, 3)] == pytest.approx([1 / 3, 2 / 3, 1.0])
    # n=4, c=2: pass@1 = 2/4; pass@2 = 1 - C(2,2)/C(4,2) = 1 - 1/6; pass@3 = 1 - 0/4
    assert [pass_at_k(4, 2, k) for k in (1, 2, 3)] == pytest.approx([0.5, 5 / 6, 1.0])
    # n=5, c=1: pass@2 = 1 - C(4,2)/C(5,2) = 1 - 6/10
    assert pass_at_k(5, 1, 2) == pytest.approx(0.4)
    assert pass_at_k(3, 0, 3) == 0.0 and pass_at_k(3, 3, 1) == 1.0
    for n, c, k in [(3, 4, 1), (3, 1, 0), (3, 1, 4), (2, -1, 1)]:
        with pytest.raises(ValueError, match="pass@k needs"):
            pass_at_k(n, c, k)


def test_summary_averages_pass_at_k_over_tasks():
    rows = [row("a", 0, False), row("a", 1, True), row("a", 2, False),   # n=3 c=1
            row("b", 0, False), row("b", 1, False, error="allocate_failed"), row("b", 2, False),  # c=0
            row("c", 0, True), row("c", 1, True), row("c", 2, False)]    # n=3 c=2
    s = summarize(rows)
    # pass@1 = (1/3 + 0 + 2/3) / 3 = 1/3; pass@2 = (2/3 + 0 + 1) / 3 = 5/9; pass@3 = (1 + 0 + 1) / 3
    assert s["pass_at_k"] == {"1": 0.3333, "2": 0.5556, "3": 0.6667}
    assert s["resolve_rate"] == round(3 / 9, 4) and s["errors"] == {"allocate_failed": 1}
    # one sample per task: pass@1 is the resolve rate
    assert summarize([row("a", 0, True), row("b", 0, False)])["pass_at_k"] == {"1": 0.5}
    # tasks with different sample counts: k up to the fewest
    assert summarize([row("a", 0, True), row("a", 1, False), row("b", 0, False)])["pass_at_k"] == {"1": 0.25}
    assert summarize([])["pass_at_k"] == {}


PATCH = "diff --git a/x.py b/x.py\n--- a/x.py\n+++ b/x.py\n@@ -1 +1 @@\n-a\n+b\n"


def test_one_predictions_file_per_sample_that_swebench_reads(tmp_path: Path):
    from swebench.harness.utils import get_predictions_from_file

    rows = [row("t__a-1", 0, True, PATCH), row("t__a-1", 1, False, ""),
            row("t__b-2", 0, False, error="inference_unreachable"), row("t__b-2", 1, False, PATCH),
            row("t__c-3", 0, False, PATCH)]  # t__c-3's sample 1 never ran: no prediction
    preds = predictions(rows, ["t__a-1", "t__b-2", "t__c-3"], 2, "org/model-7b")
    names = write_predictions(tmp_path, preds)
    assert names == ["preds.json", "preds-1.json"] == [preds_name(0), preds_name(1)]
    assert not list(tmp_path.glob("*.tmp"))
    got = [get_predictions_from_file(str(tmp_path / n), "unused", "test") for n in names]
    assert got[0] == [
        {"instance_id": "t__a-1", "model_name_or_path": "org/model-7b", "model_patch": PATCH},
        {"instance_id": "t__b-2", "model_name_or_path": "org/model-7b", "model_patch": ""},  # errored
        {"instance_id": "t__c-3", "model_name_or_path": "org/model-7b", "model_patch": PATCH},
    ]
    assert [(p["instance_id"], p["model_patch"]) for p in got[1]] == [("t__a-1", ""), ("t__b-2", PATCH)]
    assert json.loads((tmp_path / "preds.json").read_text()) == got[0]  # a plain JSON list


def test_rows_without_model_patch_fall_back_to_the_trajectory(tmp_path: Path):
    # results.jsonl written before rows carried the patch: the episode's patch.diff
    d = tmp_path / "traj"
    d.mkdir()
    (d / "patch.diff").write_text(PATCH)
    blank = tmp_path / "blank"
    blank.mkdir()
    (blank / "patch.diff").write_text("\n")
    rows = [{**row("a", 0, True, None), "traj_dir": str(d)},
            {**row("b", 0, False, None), "traj_dir": str(blank)},
            {**row("c", 0, False, None), "traj_dir": str(tmp_path / "gone")}]
    [preds] = predictions(rows, ["a", "b", "c"], 1, "m")
    assert [p["model_patch"] for p in preds] == [PATCH, "", ""]
