"""`evaluate(seed=...)` against a real CPU server, pool and task containers: one seed replays
every episode's draws (common random numbers for before/after/control), another seed does not."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from actors.config import ActorConfig, SamplingConfig
from actors.evaluate import EvalTarget, episode_seed, evaluate
from swe.tasks import load_tasks

pytestmark = [pytest.mark.docker]


def replies(out: Path) -> dict[str, list[str]]:
    rows = [json.loads(x) for x in (out / "results.jsonl").read_text().splitlines() if x.strip()]
    assert rows and not any(r.get("error") for r in rows), rows
    return {r["key"]: [m["content"] for m in json.loads((Path(r["traj_dir"]) / "traj.json").read_text())["messages"]
                       if m["role"] == "assistant"] for r in rows}


async def test_one_seed_replays_each_episode_another_does_not(task_images, pool_server, cpu_server,
                                                              tiny_model_dir, tmp_path):
    rows = load_tasks("train")[:2]
    cfg = ActorConfig(exec_timeout_s=10, step_limit=2, sampling=SamplingConfig(max_new_tokens=24))
    target = EvalTarget(cpu_server.url, cpu_server.api_key, pool_server.url, pool_server.token, str(tiny_model_dir))
    got = {}
    for name in ("a", "b"):
        await evaluate(rows, target, tmp_path / name, cfg, max_concurrent=4, n_samples=2, seed=3)
        got[name] = replies(tmp_path / name)
    assert set(got["a"]) == {f"{r['instance_id']}#{k}" for r in rows for k in (0, 1)}
    assert all(len(v) == 2 for v in got["a"].values())  # two turns each: the seed covers every turn
    assert got["a"] == got["b"]
    # another seed, other draws: the two samples of a task (each its own seed) differ
    for r in rows:
        assert got["a"][f"{r['instance_id']}#0"] != got["a"][f"{r['instance_id']}#1"]
    first = rows[0]["instance_id"]
    assert len({episode_seed(3, first, 0), episode_seed(3, first, 1), episode_seed(4, first, 0)}) == 3
