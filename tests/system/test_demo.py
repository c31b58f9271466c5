"""`swarl demo` with small options runs end to end (its own Redis, Docker images, warm start,
envd, pool, a CPU server, learner and actors, resolve rates before and after on the generated
splits and the hand-written suite, the SFT control, the determinism re-check) and ends with its
JSON line."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
from system_helpers import swarl

from common.provenance import code_version

pytestmark = [pytest.mark.docker, pytest.mark.slow, pytest.mark.timeout(1200)]

KEYS = {"train_before", "train_after", "heldout_before", "heldout_after", "samples_trained",
        "learner_steps", "policy_version", "seed", "minutes", "run_dir", "arm",
        # the two-edit family, the hand-written suite, the changes with their intervals, the SFT control's
        "heldout_family_before", "heldout_family_after", "handwritten_before", "handwritten_after",
        "train_change", "train_change_ci", "heldout_change_ci", "train_sft_change", "train_sft_change_ci",
        "recheck_identical"}


def test_one_minute_demo(docker_url, tmp_path) -> None:
    run_dir = tmp_path / "demo"
    # two learner steps, a minute at most: what the test asks of training (a step taken, a version
    # published and loaded) without a minute of it
    p = swarl("demo", "--minutes", "1", "--steps", "2", "--actors", "1", "--concurrency", "4", "--servers", "1",
              "--eval-samples", "1", "--eval-per-family", "1", "--train-per-family", "2", "--sft-demos", "200", "--reading-demos", "0", "--handwritten",
              "--recheck", "--run-dir", str(run_dir),
              "--set", "admission.batch_size=4", "--set", "learner.n_samples_per_prompt=2",
              # an empty cache: the warm start runs (and shows its progress) whatever ran before
              env={"SWARL_CACHE": str(tmp_path / "cache")}, timeout=1100)
    assert p.returncode == 0, p.stderr[-4000:]
    lines = [x for x in p.stdout.splitlines() if x.strip()]
    result = json.loads(lines[-1])
    assert KEYS <= set(result), result
    assert result["minutes"] == 1 and result["run_dir"] == str(run_dir)
    for k in ("train_before", "train_after", "heldout_before", "heldout_after"):
        assert 0.0 <= result[k] <= 1.0, (k, result)
    # it trained: steps were taken and each published a version the servers could load
    assert 1 <= result["learner_steps"] <= 2 and result["policy_version"] >= 1, result
    here = code_version()  # the result names the code it ran (by commit: a parallel test may touch a file)
    assert (result["code"] and result["code"]["commit"]) == (here and here["commit"]), result
    assert result["samples_trained"] > 0
    # the demo pinned its CPU kernels before its first tensor op (swarl/demo/kernels.py)
    assert result["cpu_kernels"]["mkl_cbwr"] == os.environ.get("MKL_CBWR", "AVX2"), result["cpu_kernels"]
    if "ATEN_CPU_CAPABILITY" not in os.environ and "avx2" in Path("/proc/cpuinfo").read_text():
        assert result["cpu_kernels"]["aten"] == "AVX2", result["cpu_kernels"]  # on an AVX-512 CPU too
    assert (run_dir / "metrics.jsonl").exists()
    # the plots a newcomer reads: the run's learning.png, and no panel without data
    plots = {p.name for p in (run_dir / "plots").glob("*.png")}
    assert {"learning.png", "reward.png", "resolve_rate.png"} <= plots and "eval.png" not in plots, plots
    lo, hi = result["train_change_ci"]
    assert lo <= result["train_change"] <= hi
    # the evidence behind the line: per split rates, intervals, control and outcome breakdowns
    learning = json.loads((run_dir / "learning.json").read_text())
    assert set(learning["splits"]) == {"train", "heldout", "heldout_family", "handwritten"}
    for split, d in learning["splits"].items():
        # one task per family: 4 train families, 1 held-out family, 8 hand-written ones
        assert d["before"]["tasks"] == d["before"]["episodes"] == {"heldout_family": 1, "handwritten": 8}.get(split, 4)
        assert abs(sum(d["outcomes"]["after"].values()) - 1.0) < 1e-6
        assert "sft" in d["controls"] and len(d["per_family"]) == d["before"]["tasks"]
    shapes = learning["splits"]["heldout"]["per_shape"]
    assert len(shapes) == 4 and all(re.fullmatch(r"\w+:\w+/(return|result)", k) for k in shapes), shapes
    assert learning["arm"] == "rl"
    # determinism: the warm start evaluated again with the same draws gives the same episodes
    assert all(result["recheck_identical"].values()), result["recheck_identical"]
    assert (run_dir / "model" / "sft-control" / "model.safetensors").exists()
    # progress was shown while warming up and evaluating (stderr is not a terminal here)
    assert "warm start step" in p.stderr and "before: train" in p.stderr, p.stderr[-3000:]


@pytest.mark.long  # two more demo runs (~90 s idle): `make long`; make test keeps the one-minute demo
def test_seeds_equal_steps_and_shared_before(docker_url, tmp_path) -> None:
    """`--seeds` with `--steps`: both arms stop at the same learner step count (equal compute),
    the shuffled arm reuses the RL arm's "before" episodes (same warm start and draws), and a
    run stopped part-way is summarised from the seeds whose every arm finished."""
    import sys
    from pathlib import Path

    run_dir = tmp_path / "seeds"
    p = swarl("demo", "--seeds", "0", "--steps", "2", "--minutes", "6", "--actors", "1", "--concurrency", "4",
              "--servers", "1", "--eval-samples", "1", "--eval-per-family", "1", "--train-per-family", "2",
              "--sft-demos", "100", "--reading-demos", "0", "--no-handwritten", "--no-sft-control", "--run-dir", str(run_dir),
              "--set", "admission.batch_size=4", "--set", "learner.n_samples_per_prompt=2",
              env={"SWARL_CACHE": str(tmp_path / "cache")}, timeout=1100)
    assert p.returncode == 0, p.stderr[-4000:]
    rl, sh = (json.loads((run_dir / "seed-0" / arm / "result.json").read_text()) for arm in ("rl", "shuffled"))
    assert rl["learner_steps"] == sh["learner_steps"] == 2, (rl, sh)
    assert rl["steps_budget"] == sh["steps_budget"] == 2
    here = code_version()  # the record names the code the run was (its commit: a parallel test may touch a file)
    assert [r["code"] and r["code"]["commit"] for r in (rl, sh)] == [here and here["commit"]] * 2, (rl, sh)
    learning = json.loads((run_dir / "seed-0" / "shuffled" / "learning.json").read_text())
    assert learning["before_from"] == str(run_dir / "seed-0" / "rl")
    for split in ("train", "heldout", "heldout_family"):
        a, b = ((run_dir / "seed-0" / arm / "eval" / f"before-{split}" / "results.jsonl").read_text()
                for arm in ("rl", "shuffled"))
        assert a == b and a.strip(), split
    # a partial run: seed 1 has only its RL arm, so the summary holds seed 0 alone (built from
    # the seed directories: learning-seeds.json describes only the last call into the directory)
    (run_dir / "seed-1" / "rl").mkdir(parents=True)
    for f in ("learning.json", "result.json"):
        (run_dir / "seed-1" / "rl" / f).write_text((run_dir / "seed-0" / "rl" / f).read_text())
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    from demo_learning import collect

    data = collect(run_dir, expected=[0, 1])
    assert data["partial"] and data["aggregate"]["seeds"] == [0]
    assert not collect(run_dir, expected=[0])["partial"]
    assert [r["seed"] for r in data["runs"]["shuffled"]] == [0]
