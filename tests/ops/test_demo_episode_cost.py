"""benchmarks/demo_episode_cost.py: a run made with --no-record is recorded from its printed line and
its run dir (the phases read again, the window's CPU as it was printed); gradings answered by envd's
cache are counted apart from the ones graded afresh; a run dir that does not hold the printed run is
refused."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from demo_episode_cost import from_log


def _episode(run_dir: Path, i: int, eval_time: float, cached: bool) -> None:
    d = run_dir / "trajectories" / f"task-{i}"
    d.mkdir(parents=True)
    m = {"env_execution_time_sum": 1.0, "model_query_time_sum": 2.0, "eval_time": eval_time,
         "eval_cached": float(cached), "total_time": 5.0, "turns": 3}
    (d / "traj.json").write_text(json.dumps({"metrics": m, "resolved": eval_time > 0}))


def test_a_printed_run_is_recorded_from_its_dir(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    for i, (t, cached) in enumerate([(6.0, False), (4.0, True), (0.0, False), (8.0, False)]):
        _episode(run_dir, i, t, cached)
    (run_dir / "metrics.jsonl").write_text(json.dumps({"step": 1, "step_time_s": 5.0, "samples": 4}) + "\n")
    printed = {"label": "x", "minutes": 1.0, "episodes": 4, "episodes_per_min": 4.0, "cpu_s": {"envd": 3.0},
               "load_avg_start": [1.0, 1.0, 1.0], "load_avg_end": [2.0, 2.0, 2.0], "sets": [],
               "requested_minutes": 1.0, "run_dir": str(run_dir), "commit": "abc1234"}
    log = tmp_path / "run.log"
    log.write_text("progress...\n└───┘" + json.dumps(printed) + "\n")
    got = from_log(log)
    ph = got["phases"]
    assert ph["grading (evaluate, per graded episode)"]["n"] == 3
    assert ph["grading: graded afresh"]["n"] == 2 and ph["grading: graded afresh"]["mean"] == 7.0
    assert ph["grading: answered from envd's cache"]["n"] == 1 and ph["grading: answered from envd's cache"]["mean"] == 4.0
    assert got["cpu_s"] == {"envd": 3.0} and got["commit"] == "abc1234" and got["learner_steps"] == 1
    printed["episodes"] = 5
    log.write_text(json.dumps(printed) + "\n")
    with pytest.raises(SystemExit, match="holds 4 episodes, the log says 5"):
        from_log(log)
