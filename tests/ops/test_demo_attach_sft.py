"""benchmarks/demo_attach_sft.py: an RL arm takes another run's SFT control only when the
control is provably the same procedure (same seed, steps, warm bytes, control settings, draws),
each difference refused alone with its reason; attached, the arm's record is what `swarl demo`
would have written with that control."""

from __future__ import annotations

import importlib.util
import json
import random
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]


def _tool():
    spec = importlib.util.spec_from_file_location("demo_attach_sft", ROOT / "benchmarks" / "demo_attach_sft.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _tasks() -> list[str]:
    """The demo's own train-split tasks (their families group the bootstrap)."""
    from swarl.demo.run import Demo, DemoOptions

    return [r["instance_id"] for r in Demo(DemoOptions(handwritten=False, run_dir="/nonexistent")).eval_rows("train")]


TASKS = _tasks()


def _results(path: Path, p: float, seed: int) -> None:
    rng = random.Random(seed)
    path.mkdir(parents=True, exist_ok=True)
    path.joinpath("results.jsonl").write_text("".join(
        json.dumps({"instance_id": t, "sample": k, "resolved": rng.random() < p, "ending": "submitted",
                    "patch_chars": 10}) + "\n" for t in TASKS for k in range(2)))


def _arm(d: Path, *, seed: int = 1, steps: int = 90, lr: float = 1e-4, warm: bytes = b"w", draws: int = 7,
         sft: bool = False) -> Path:
    (d / "model" / "warm").mkdir(parents=True)
    (d / "model" / "warm" / "model.safetensors").write_bytes(warm)
    (d / "trajectories").mkdir()
    (d / "config.yaml").write_text(yaml.safe_dump({"admission": {"batch_size": 32},
                                                   "learner": {"lr": lr, "warmup_steps": 0}}))
    (d / "result.json").write_text(json.dumps({"arm": "rl", "seed": seed, "warm_seed": 0, "learner_steps": steps,
                                               "run_dir": str(d)}))
    (d / "learning.json").write_text(json.dumps({"arm": "rl", "before_from": None}))
    _results(d / "eval" / "before-train", 0.5, draws)
    _results(d / "eval" / "after-train", 0.8, draws + 1)
    if sft:
        _results(d / "eval" / "sft-train", 0.5, draws + 2)
        (d / "model" / "sft-control").mkdir()
        (d / "model" / "sft-control" / "model.safetensors").write_bytes(b"s")
    return d


@pytest.mark.parametrize(("change", "reason"), [
    ({"seed": 2}, "seed"), ({"steps": 60}, "learner_steps"), ({"lr": 3e-4}, "learner.lr"),
    ({"warm": b"x"}, "model/warm"), ({"draws": 8}, "before-train")])
def test_each_difference_is_refused_with_its_reason(tmp_path, change, reason) -> None:
    tool = _tool()
    rl = _arm(tmp_path / "rl")
    assert tool.check(rl, _arm(tmp_path / "same", sft=True)) == []
    why = tool.check(rl, _arm(tmp_path / "other", sft=True, **change))
    assert len(why) == 1 and why[0].startswith(reason), why


def test_a_source_without_a_control_or_a_target_with_one_is_refused(tmp_path) -> None:
    tool = _tool()
    assert any("sft evaluations" in w for w in tool.check(_arm(tmp_path / "a"), _arm(tmp_path / "b")))
    assert any("already" in w for w in tool.check(_arm(tmp_path / "c", sft=True), _arm(tmp_path / "d", sft=True)))


def test_attached_the_record_is_the_demos(tmp_path) -> None:
    from swarl.demo import run as demo_run

    tool = _tool()
    rl, src = _arm(tmp_path / "rl"), _arm(tmp_path / "src", sft=True)
    result = tool.attach(rl, src, tmp_path / "out")
    learning = json.loads((tmp_path / "out" / "learning.json").read_text())
    eps = {n: [json.loads(x) for x in (tmp_path / "out" / "eval" / f"{n}-train" / "results.jsonl").read_text().split("\n")
               if x] for n in ("before", "after", "sft")}
    groups = demo_run.task_groups(demo_run.Demo(demo_run.DemoOptions(handwritten=False, run_dir="/nonexistent"))
                                  .eval_rows("train"))
    assert len(set(groups["family"].values())) > 1
    want = demo_run.learning_report({"train": eps["before"]}, {"train": eps["after"]}, {"sft": {"train": eps["sft"]}},
                                    seed=1, groups=groups)
    assert learning["splits"] == want["splits"]
    assert result["train_sft_change"] == want["splits"]["train"]["controls"]["sft"]["change"]["change"]
    assert result["sft_control_from"] == str(src.resolve()) and result["ran_in"] == str(rl)
    assert (tmp_path / "out" / "result.json").stat().st_mtime == (rl / "result.json").stat().st_mtime
