"""The short version of benchmarks/async_vs_sync.py (--quick: max_staleness 0 then 2, batch 4,
one minute each, real processes): it runs to its JSON line and the staleness bound holds in
both settings. Speed figures are the benchmark's job (benchmarks/RESULTS.md), not asserted
here: on a shared 2-core machine they depend on the load."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from system_helpers import REPO, swarl_env

pytestmark = [pytest.mark.docker, pytest.mark.slow, pytest.mark.long, pytest.mark.timeout(1200)]


def test_async_vs_sync_quick(docker_url, tmp_path) -> None:
    png = tmp_path / "avs.png"
    p = subprocess.run([sys.executable, str(REPO / "benchmarks" / "async_vs_sync.py"), "--quick",
                        "--no-record", "--out", str(tmp_path / "run"), "--png", str(png)],
                       cwd=REPO, env=swarl_env(), capture_output=True, text=True, timeout=1100)
    assert p.returncode == 0, (p.stdout[-2000:], p.stderr[-4000:])
    summary = json.loads(p.stdout.strip().splitlines()[-1])
    for k in ("speedup_eta2", "ideal_speedup", "learner_idle_eta0", "learner_idle_eta2",
              "max_staleness_seen_eta2", "wasted_fraction_eta2", "held_s_per_step_eta2", "actor_idle_eta2",
              "left_behind_eta2", "goals_eta2"):
        assert k in summary, summary
    assert 0 <= summary["wasted_fraction_eta2"] <= 1 and summary["held_s_per_step_eta2"] >= 0
    assert summary["max_staleness_seen_eta0"] == 0  # synchronous: trained at the version it was made
    assert summary["max_staleness_seen_eta2"] <= 2
    assert summary["samples_per_min_eta0"] > 0 and summary["samples_per_min_eta2"] > 0
    assert summary["ideal_speedup"] > 1  # the profile drew durations of different lengths
    assert 0 <= summary["learner_idle_eta0"] <= 1 and 0 <= summary["learner_idle_eta2"] <= 1
    # where a slot's time goes: a slot is busy at least as long as the episodes it ran took (less
    # a margin: the busy window and the trained episodes' window differ by the ends of episodes)
    assert 0 < 0.8 * summary["episode_wall_s_eta2"] <= summary["slot_s_per_episode_eta2"], summary
    assert png.stat().st_size > 0
    # the run-to-run report reads the finished run again and gives the same ratio
    p = subprocess.run([sys.executable, str(REPO / "benchmarks" / "async_vs_sync_repeats.py"), "--from",
                        str(tmp_path / "run"), "--no-record", "--png", str(tmp_path / "rep.png")],
                       cwd=REPO, env=swarl_env(), capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, (p.stdout[-2000:], p.stderr[-4000:])
    rep = json.loads(p.stdout.strip().splitlines()[-1])
    assert rep["runs"] == 1 and rep["speedup_eta2_vs_ideal_mean"] == summary["speedup_eta2_vs_ideal"], rep
    assert (tmp_path / "rep.png").stat().st_size > 0
