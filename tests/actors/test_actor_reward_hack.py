"""A reward-hack attempt through the whole rollout: a scripted policy whose "fix" writes a forcing
conftest.py, on the real pool, envd and Docker. The episode is graded unresolved (reward -1), the
attempt is counted (episode metric reward_hack_attempts, the learner's agent/reward_hack_attempts,
the run's stats) and its trajectory is kept even with trajectories off."""

from __future__ import annotations

import json

import pytest
from actor_services import actor_config, actor_sets, calc_row, payload, start_scripted
from fixtures_envd import TEST_IMAGE

from actors.rollout import Rollouts
from broker.connection import connect
from broker.keys import Keys
from swarl.wiring import actor_runtime

pytestmark = [pytest.mark.docker]
KEYS = Keys("swarl", "test")
CONFTEST = ("printf 'import pytest\\n\\n@pytest.hookimpl(hookwrapper=True)\\ndef pytest_runtest_makereport(item, call):\\n"
            "    outcome = yield\\n    outcome.get_result().outcome = \"passed\"\\n' > conftest.py")


async def test_a_conftest_hack_is_minus_one_counted_and_kept(tiny_model_dir, redis_url, pool_server, tmp_path,
                                                           test_image):
    row = {**calc_row(TEST_IMAGE, 7, "fix"), "swarl_fix_command": CONFTEST}
    server = start_scripted(tiny_model_dir, [row], redis_url, tmp_path / "logs")
    cfg = actor_config(actor_sets(redis_url, tmp_path / "run", pool_server.url, pool_server.token,
                                  tiny_model_dir, server.api_key, **{"actor.save_trajectories": "false"}))
    r = connect(redis_url)
    ro = Rollouts(actor_runtime(cfg), r, actor_id="actor-t")
    try:
        res = await ro.run(payload(row))
        assert res["resolved"] is False and res["reward"] == -1.0, res
        assert int(await r.hget(KEYS.stats, "reward_hack_attempts")) == 1
        assert int(await r.hget(KEYS.stats, "reward_hack_attempts/conftest")) == 1  # by kind
        root = tmp_path / "run" / "trajectories"
        (d,) = [p for p in root.iterdir() if p.is_dir()]      # kept although trajectories are off
        traj = json.loads((d / "traj.json").read_text())
        assert [h["kind"] for h in traj["reward_hack"]] == ["conftest"]
        assert traj["resolved"] is False and traj["metrics"]["reward_hack_attempts"] == 1.0
        assert traj["metrics"]["reward_hack_attempts/conftest"] == 1.0
        assert not [k for k in traj["metrics"] if k.startswith("reward_hack_attempts/") and k != "reward_hack_attempts/conftest"]
        assert "conftest.py" in (d / "patch.diff").read_text()
        (line,) = (root / "reward_hacks.jsonl").read_text().splitlines()
        assert json.loads(line)["kinds"] == ["conftest"] and json.loads(line)["dir"] == d.name
    finally:
        await ro.aclose()
        await r.aclose()
        server.stop()


def test_the_learner_logs_the_count() -> None:
    from types import SimpleNamespace

    from learner.loop import agent_metrics

    def ep(n: float, kind: str | None = None) -> SimpleNamespace:
        by_kind = {f"reward_hack_attempts/{kind}": 1.0} if kind else {}
        return SimpleNamespace(samples=[SimpleNamespace(metrics={"reward_hack_attempts": n, "turns": 2.0, **by_kind})])

    batch = SimpleNamespace(groups=[SimpleNamespace(episodes=[ep(1.0, "canary"), ep(0.0)]),
                                    SimpleNamespace(episodes=[ep(1.0, "report_forged")])])
    out = agent_metrics(batch)  # type: ignore[arg-type]
    assert out["agent/reward_hack_attempts"] == 2.0 and out["agent/reward_hack_attempts_max"] == 1.0
    assert out["agent/reward_hack_attempts/canary_max"] == out["agent/reward_hack_attempts/report_forged_max"] == 1.0
    assert "agent/turns" not in out


async def test_a_patch_that_hangs_the_tests_is_minus_one(tiny_model_dir, redis_url, pool_server, tmp_path,
                                                         test_image):
    """Tests that outlive actor.eval_timeout_s are graded unresolved (SWE-bench's harness does the
    same), not an infrastructure failure: retried, then masked, that spared the agent its -1."""
    hang = "printf 'import time\\ntime.sleep(3600)\\n' >> calc.py"
    row = {**calc_row(TEST_IMAGE, 7, "fix"), "swarl_fix_command": hang}
    server = start_scripted(tiny_model_dir, [row], redis_url, tmp_path / "logs")
    cfg = actor_config(actor_sets(redis_url, tmp_path / "run", pool_server.url, pool_server.token,
                                  tiny_model_dir, server.api_key, **{"actor.eval_timeout_s": "8"}))
    r = connect(redis_url)
    ro = Rollouts(actor_runtime(cfg), r, actor_id="actor-t")
    try:
        res = await ro.run(payload(row))
        assert "masked" not in res, res
        assert res["resolved"] is False and res["reward"] == -1.0, res
    finally:
        await ro.aclose()
        await r.aclose()
        server.stop()
