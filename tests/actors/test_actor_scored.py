"""The in-process scored environment (actors/scored.py): scorers by name or module:function with
errors naming what is wrong, scored rows validated field by field, `swarl enqueue` of scored rows
onto a real Redis, and one scored episode against a real CPU inference server: the answer's
tokens and logprobs are the server's, the reward the scorer's."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import redis as redis_sync

from actors.config import ActorConfig
from actors.scored import (
    ScoredEpisodes,
    exact_answer,
    load_scorer,
    read_scored_rows,
    validate_scored_row,
)
from broker.keys import Keys
from swe.rows import RowError

REPO = Path(__file__).resolve().parents[2]


def always_half(row: dict, answer: str) -> float:
    return 0.5


def test_scorers_by_name_and_path_and_clear_errors() -> None:
    assert load_scorer("exact") is exact_answer
    assert load_scorer(f"{__name__}:always_half") is always_half
    for bad, says in (("nope", "expected one of"), ("json:nothing_here", "AttributeError"),
                      ("no_such_module_xyz:f", "ModuleNotFoundError"), ("json:__doc__", "not callable")):
        with pytest.raises(ValueError, match=says):
            load_scorer(bad)
    assert exact_answer({"answer": "+"}, " +\n") and not exact_answer({"answer": "+"}, "-")
    with pytest.raises(ValueError, match="needs the row's `answer`"):
        exact_answer({"instance_id": "x"}, "+")


def test_scored_rows_are_validated_by_field(tmp_path: Path) -> None:
    assert validate_scored_row({"instance_id": "a", "prompt": "p"})["prompt"] == "p"
    with pytest.raises(RowError, match="'prompt'"):
        validate_scored_row({"instance_id": "a", "prompt": " "})
    with pytest.raises(RowError, match="'instance_id'"):
        validate_scored_row({"prompt": "p"})
    data = tmp_path / "rows.jsonl"
    data.write_text(json.dumps({"instance_id": "a", "prompt": "p", "answer": "1"}) + "\nnot json\n"
                    + json.dumps({"instance_id": "b"}) + "\n")
    errors: list[RowError] = []
    rows = list(read_scored_rows(data, errors))
    assert [r.instance["instance_id"] for r in rows] == ["a"] and rows[0].data_source == "rows.jsonl"
    assert [e.where for e in errors] == ["rows.jsonl line 2", "rows.jsonl line 3"]
    assert errors[1].field == "prompt"


def test_swarl_enqueue_takes_scored_rows(redis_url: str, tmp_path: Path) -> None:
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps({"instance_id": f"r{i}", "prompt": f"{i} + 1 = ?", "answer": str(i + 1)})
                            + "\n" for i in range(3)) + json.dumps({"instance_id": "bad"}) + "\n")
    base = [sys.executable, "-m", "swarl.cli", "enqueue", "--data", str(data), "--n-samples", "2",
            "--set", f"redis.url={redis_url}", "--set", "run.id=scored", "--set", f"run.dir={tmp_path / 'run'}"]
    p = subprocess.run([*base, "--set", "actor.environment=scored"], cwd=REPO, capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0, p.stderr
    assert "enqueued 6 jobs" in p.stdout and "1 bad rows skipped" in p.stdout, p.stdout
    assert "rows.jsonl line 4: prompt: missing" in p.stderr, p.stderr
    r = redis_sync.Redis.from_url(redis_url)
    assert r.zcard(Keys("swarl", "scored").queue) == 6
    # read as SWE rows (the default environment) the same file is refused row by row
    p = subprocess.run([*base, "--set", "run.id=swe"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert "enqueued 0 jobs" in p.stdout and "4 bad rows skipped" in p.stdout, (p.stdout, p.stderr)


async def test_one_scored_episode_on_a_real_server(cpu_server_factory, tiny_model_dir: Path) -> None:
    from actors.backends import ServerPolicy
    from actors.episode import EpisodeJob

    srv = cpu_server_factory.start(tiny_model_dir, api_key="k")
    cfg = ActorConfig(environment="scored", scorer=f"{__name__}:always_half", tokenizer=str(tiny_model_dir))
    cfg.sampling.max_new_tokens = 5
    runner = ScoredEpisodes(cfg, owner="t", tokenizer=str(tiny_model_dir), traj_dir=None)
    job = EpisodeJob.from_payload({"job_id": "j", "group_id": "g", "sample_index": 0,
                                   "instance": {"instance_id": "r0", "prompt": "1 + 1 = ?"}}, need_image=False)
    policy = ServerPolicy(srv.url, "k", 60)
    try:
        ep = await runner.run(job, policy, pinned_version=0)
    finally:
        await policy.aclose()
    assert ep.reward == 0.5 and not ep.resolved and len(ep.samples) == 1  # a float is the reward
    s = ep.samples[0]
    answer = s.loss_mask == 1
    assert 1 <= int(answer.sum()) <= 5 and (s.rollout_logprobs[answer] < 0).all()
    assert s.weight_versions == ["0"] and not answer[:s.prompt_len].any() and answer[s.prompt_len]
