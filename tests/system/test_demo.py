"""`swarl demo` with small options runs end to end (its own Redis, Docker images, warm start,
envd, pool, a CPU server, learner and actors, resolve rates before and after) and ends with its
JSON line."""

from __future__ import annotations

import json

import pytest
from system_helpers import swarl

pytestmark = [pytest.mark.docker, pytest.mark.slow, pytest.mark.timeout(1200)]

KEYS = {"train_before", "train_after", "heldout_before", "heldout_after", "samples_trained",
        "learner_steps", "policy_version", "seed", "minutes", "run_dir"}


def test_one_minute_demo(docker_url, tmp_path) -> None:
    run_dir = tmp_path / "demo"
    p = swarl("demo", "--minutes", "1", "--actors", "1", "--concurrency", "4", "--servers", "1",
              "--eval-samples", "1", "--sft-epochs", "2", "--run-dir", str(run_dir),
              "--set", "admission.batch_size=4", "--set", "learner.n_samples_per_prompt=2",
              timeout=1100)
    assert p.returncode == 0, p.stderr[-4000:]
    lines = [x for x in p.stdout.splitlines() if x.strip()]
    result = json.loads(lines[-1])
    assert KEYS <= set(result), result
    assert result["minutes"] == 1 and result["run_dir"] == str(run_dir)
    for k in ("train_before", "train_after", "heldout_before", "heldout_after"):
        assert 0.0 <= result[k] <= 1.0, (k, result)
    # it trained: steps were taken and each published a version the servers could load
    assert result["learner_steps"] >= 1 and result["policy_version"] >= 1, result
    assert result["samples_trained"] > 0
    assert (run_dir / "metrics.jsonl").exists()
