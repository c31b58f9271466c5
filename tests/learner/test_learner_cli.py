"""`swarl learner` refuses a config it would train wrongly with, naming the keys."""

from __future__ import annotations

import subprocess

from common.procs import swarl_exe

SWARL = swarl_exe()


def test_a_sampling_temperature_the_learner_does_not_assume_is_named(tmp_path):
    r = subprocess.run([*SWARL, "learner", "--set", "actor.sampling.temperature=0.7",
                        "--set", f"run.dir={tmp_path}"], capture_output=True, text=True, timeout=120,
                       env={"PATH": "/usr/bin:/bin", "SWARL_REDIS_URL": "redis://127.0.0.1:1/0"})
    assert r.returncode == 2, r.stderr
    assert "learner.rollout_temperature=1" in r.stderr and "actor.sampling.temperature=0.7" in r.stderr
    assert "Traceback" not in r.stderr


def test_the_demo_refuses_it_before_starting_anything(tmp_path):
    run_dir = tmp_path / "demo"
    r = subprocess.run([*SWARL, "demo", "--set", "actor.sampling.temperature=0.35", "--run-dir", str(run_dir)],
                       capture_output=True, text=True, timeout=120, env={"PATH": "/usr/bin:/bin"})
    assert r.returncode == 2, r.stderr
    assert "learner.rollout_temperature=" in r.stderr and "actor.sampling.temperature=0.35" in r.stderr
    assert "Traceback" not in r.stderr and not run_dir.exists()
