"""benchmarks/demo_learning.py records a finished run only with the settings it ran with: every
arm's effective config is read against the `--set` values the record will claim (the proof's
DESIGN and any given after `--`), a number equal however YAML wrote it."""

from __future__ import annotations

import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

from demo_learning import DESIGN, settings_disagree  # noqa: E402


def _arm(run_dir: Path, seed: int, arm: str, **learner: object) -> None:
    d = run_dir / f"seed-{seed}" / arm
    d.mkdir(parents=True)
    cfg = {"admission": {"batch_size": 32},
           "learner": {"minibatches": 2, "spike_clip": 3.0, "max_update_kl": 0.01, "lr": 2e-4, **learner}}
    (d / "config.yaml").write_text(yaml.safe_dump(cfg))
    (d / "result.json").write_text("{}")


def test_a_run_with_the_design_agrees(tmp_path) -> None:
    for arm in ("rl", "shuffled"):
        _arm(tmp_path, 0, arm)
    assert settings_disagree(tmp_path, list(DESIGN)) == []
    assert settings_disagree(tmp_path, [*DESIGN, "--set", "learner.lr=2e-4"]) == []


def test_each_arm_that_ran_otherwise_is_named(tmp_path) -> None:
    _arm(tmp_path, 0, "rl")
    _arm(tmp_path, 1, "shuffled", max_update_kl=None)
    assert settings_disagree(tmp_path, list(DESIGN)) == ["seed-1/shuffled: learner.max_update_kl is None, not 0.01"]
    why = settings_disagree(tmp_path, [*DESIGN, "--set", "learner.lr=4e-4"])
    assert len(why) == 3 and sum("learner.lr is 0.0002, not 4e-4" in w for w in why) == 2, why
    (tmp_path / "seed-1" / "shuffled" / "result.json").unlink()  # not finished: not recorded, not read
    assert settings_disagree(tmp_path, list(DESIGN)) == []
