"""benchmarks/demo_learning.py records a finished run only with the settings it ran with: every
arm's effective config is read against the `--set` values the record will claim (the proof's
DESIGN and any given after `--`), a number equal however YAML wrote it; and each arm's warm-start
options (its result.json) against the `--warm-seed`, `--practice-names` and `--reading-demos` claimed."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

from demo_learning import DESIGN, settings_disagree  # noqa: E402


def _arm(run_dir: Path, seed: int, arm: str, result: dict | None = None, **learner: object) -> None:
    d = run_dir / f"seed-{seed}" / arm
    d.mkdir(parents=True)
    cfg = {"admission": {"batch_size": 32},
           "learner": {"minibatches": 2, "epochs": 2, "spike_clip": 3.0, "max_update_kl": 0.01, "lr": 2e-4, **learner}}
    (d / "config.yaml").write_text(yaml.safe_dump(cfg))
    (d / "result.json").write_text(json.dumps({"seed": seed, "warm_seed": 0, "reading_demos": 3200, **(result or {})}))


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


def test_an_arm_of_another_warm_start_is_named(tmp_path) -> None:
    _arm(tmp_path, 0, "rl", result={"reading_demos": 3200, "practice_names": "all"})
    _arm(tmp_path, 0, "shuffled")
    (tmp_path / "seed-0" / "shuffled" / "result.json").write_text(  # a result from before reading_demos
        json.dumps({"seed": 0, "warm_seed": 0, "practice_names": "all"}))
    _arm(tmp_path, 1, "rl", result={"warm_seed": 1, "reading_demos": 3200, "practice_names": "all"})
    claimed = ["--warm-seed", "0", "--practice-names", "all", "--reading-demos", "3200"]
    assert settings_disagree(tmp_path, claimed) == [
        "seed-0/shuffled: --reading-demos was 0, not 3200", "seed-1/rl: --warm-seed was 1, not 0"]
    assert settings_disagree(tmp_path, ["--warm-seed", "0"]) == [  # unclaimed: at their defaults
        "seed-0/rl: --practice-names was all, not train", "seed-0/rl: --reading-demos was 3200, not 0",
        "seed-0/shuffled: --practice-names was all, not train", "seed-1/rl: --warm-seed was 1, not 0",
        "seed-1/rl: --practice-names was all, not train", "seed-1/rl: --reading-demos was 3200, not 0"]


def test_an_arm_short_of_its_steps_is_named() -> None:
    from demo_learning import short_arms

    def arm(seed: int, steps: int) -> dict:
        return {"result": {"seed": seed, "learner_steps": steps, "steps_budget": 90}}

    assert short_arms({"rl": [arm(0, 90)], "shuffled": [arm(0, 90)]}) == ""
    note = short_arms({"rl": [arm(0, 90), arm(3, 78)], "shuffled": [arm(0, 90), arm(3, 90)]})
    assert "seed 3's rl arm 78 of 90" in note and "seed 0" not in note and "SFT control" in note, note
    note = short_arms({"rl": [arm(4, 90)], "shuffled": [arm(4, 85)]})
    assert "seed 4's shuffled arm 85 of 90" in note and "SFT" not in note, note


def test_the_code_each_arm_ran_is_named() -> None:
    from demo_learning import code_clause

    def arm(seed: int, commit: str | None, dirty: bool = False) -> dict:
        return {"result": {"seed": seed, **({"code": {"commit": commit, "dirty": dirty}} if commit else {})}}

    a, b = "a" * 40, "b" * 40
    assert code_clause({"rl": [arm(0, a), arm(1, a)], "shuffled": [arm(0, a), arm(1, a)]}) == " Every arm ran at aaaaaaa."
    assert "did not record" in code_clause({"rl": [arm(0, None)], "shuffled": [arm(0, None)]})
    note = code_clause({"rl": [arm(0, a), arm(1, b)], "shuffled": [arm(0, a, dirty=True), arm(1, None)]})
    assert note == (" The arms ran at aaaaaaa (seed 0's rl arm); aaaaaaa with uncommitted changes (seed 0's shuffled "
                    "arm); bbbbbbb (seed 1's rl arm); code not recorded (seed 1's shuffled arm)."), note


def test_make_demo_runs_the_proofs_design() -> None:
    """`swarl demo` with no option (`make demo`) trains what the proof measured: DESIGN's warm start
    and every learner setting it sets, from the CLI's defaults and configs/demo.yaml, at the proof's
    18 steps. A default drifting from DESIGN fails here."""
    import inspect

    from swarl.commands.run import demo as demo_command
    from swarl.demo.run import Demo, DemoOptions

    cli = {name: p.default.default if hasattr(p.default, "default") else p.default
           for name, p in inspect.signature(demo_command).parameters.items()}
    sets = [DESIGN[i + 1] for i, a in enumerate(DESIGN) if a == "--set"]
    options = {a: DESIGN[i + 1] for i, a in enumerate(DESIGN) if a.startswith("--") and a != "--set"
               and i + 1 < len(DESIGN) and not DESIGN[i + 1].startswith("--")}
    assert options == {"--warm-seed": "0", "--reading-demos": "3200"}, options
    # the warm start: seed 0's (the default warm seed is --seed, 0) with the reading demonstrations
    assert cli["seed"] == DemoOptions().seed == 0 and cli["warm_seed"] is DemoOptions().warm_seed is None
    assert cli["reading_demos"] == DemoOptions().reading_demos == int(options["--reading-demos"])
    assert cli["steps"] == DemoOptions().steps == 18 and cli["minutes"] == DemoOptions().minutes
    assert "--no-handwritten" in DESIGN and cli["handwritten"] is DemoOptions().handwritten is False
    cfg = Demo(DemoOptions(run_dir="/nonexistent")).config().model_dump()
    for kv in sets:
        key, value = kv.split("=", 1)
        section, name = key.split(".")
        have = cfg[section][name]
        same = float(have) == float(value) if isinstance(have, int | float) else str(have) == value
        assert same, (kv, have)
