"""Step rewards from a process reward model: episodes (scripted policy in-process, real bash env)
judged by a real scripted judge server (subprocess) over /v1/chat/completions."""

from __future__ import annotations

import asyncio
import json
import time

import pytest
from actor_localenv import INSTANCE, LocalEnv, make_repo

from actors.artifacts import write_trajectory
from actors.config import ActorConfig, PrmConfig
from actors.encoding import ChatEncoder
from actors.episode import EpisodeJob, make_agent, run_episode
from actors.prm import HttpJudge, JudgeTemplates, StepJudge, parse_vote
from actors.templates import load_templates
from common.services import free_port
from inference.scripted import ScriptedPolicy

# One row per vote pattern, told apart (by the policy and the judge) by their problem statements.
# fix: one judged step (the fix), then the submission (not judged); loop: `ls` until the step limit.
PATTERNS = {
    "fix-mixed": ("fix", [["+1", "+1", "-1"]]),
    "fix-bad": ("fix", [["bad", "bad", "-1"]]),
    "fix-allbad": ("fix", [["bad", "bad", "bad"]]),
    "loop-steps": ("loop", [["+1", "+1", "+1"], ["-1", "bad", "bad"], ["+1", "+1", "-1"]]),
    "loop-errors": ("loop", [["error", "error", "error"], ["+1", "error", "bad"], ["-1"]]),
}


def row(name: str) -> dict:
    mode, votes = PATTERNS[name]
    return {**INSTANCE, "instance_id": f"local__{name}",
            "problem_statement": f"[{name}] {INSTANCE['problem_statement']}",
            "swarl_scripted_mode": mode, "swarl_prm_votes": votes}


ROWS = [row(n) for n in PATTERNS]


@pytest.fixture(scope="module")
def judge_server(tmp_path_factory, tiny_model_dir):
    from inference.local_server import start_scripted_server

    h = start_scripted_server(tiny_model_dir, ROWS, mode="judge",
                              log_dir=tmp_path_factory.mktemp("judge"))
    yield h
    h.stop()


class SlowEnv(LocalEnv):
    """Each command takes at least `delay_s` (a slow container)."""

    def __init__(self, base, delay_s: float) -> None:
        super().__init__(base)
        self.delay_s = delay_s

    async def exec(self, command: str, timeout_s: float):
        await asyncio.sleep(self.delay_s)
        return await super().exec(command, timeout_s)


async def _episode(tok, tmp_path, name: str, urls: list[str], api_key: str | None, env_delay_s: float = 0.0,
                   **prm):
    r = next(x for x in ROWS if x["instance_id"] == f"local__{name}")
    cfg = ActorConfig(exec_timeout_s=10, step_limit=3, prm=PrmConfig(enable=True, **prm))
    job = EpisodeJob(f"test:{name}", r, f"{name}:g0", 0, 1)
    env = SlowEnv(make_repo(tmp_path / f"base-{name}"), env_delay_s)
    client = HttpJudge(lambda: _const(urls), api_key, cfg.prm.timeout_s)
    enc = ChatEncoder(tok)
    judge = StepJudge(cfg.prm, client, JudgeTemplates(), job.task, lambda t: len(enc.tokenize(t)))
    try:
        agent = make_agent(cfg, load_templates(), enc, ScriptedPolicy(tok, "fix", "0", ROWS), env, job, 0, judge)
        t0 = time.monotonic()
        ep = await run_episode(agent, job)
        return ep, time.monotonic() - t0
    finally:
        await client.aclose()
        await env.close()


async def _const(urls: list[str]) -> list[str]:
    return urls


def test_votes_are_parsed_strictly():
    assert parse_vote("good step.\n\\boxed{+1}") == 1
    assert parse_vote("\\boxed{-1} and later \\boxed{+1}") == -1   # the first box counts
    assert parse_vote("\\boxed{ 1.0 }") == 1
    for bad in ("+1", "\\boxed{+1 (good)}", "\\boxed{2}", "\\boxed{}", "\\boxed{\\text{+1}}", "", "\\boxed{0}"):
        assert parse_vote(bad) is None, bad


@pytest.mark.parametrize(("name", "coef", "outcome", "scores"), [
    ("fix-mixed", 1.0, 1.0, [1 / 3]),
    ("fix-bad", 0.5, 1.0, [-1.0]),
    ("fix-allbad", 1.0, 1.0, [None]),                 # no valid vote: unscored, the outcome alone
    ("loop-steps", 0.5, -1.0, [1.0, -1.0, 1 / 3]),
    ("loop-errors", 1.0, -1.0, [None, 1.0, -1.0]),    # a judge error leaves its step unscored
])
async def test_reward_is_outcome_plus_coef_times_mean_step_score(chatml_tokenizer, tmp_path, judge_server,
                                                                 name, coef, outcome, scores):
    ep, _ = await _episode(chatml_tokenizer, tmp_path, name, [judge_server.url], judge_server.api_key,
                           step_coef=coef)
    assert ep.outcome == outcome and ep.resolved == (outcome > 0)
    got = [s.prm_score for s in ep.agent.steps if s.prm_status]
    assert got == pytest.approx(scores)
    scored = [s for s in scores if s is not None]
    want = outcome + coef * (sum(scored) / len(scored)) if scored else outcome
    assert ep.reward == pytest.approx(want)
    assert all(s.reward == pytest.approx(want) for s in ep.samples)  # episode mode: one reward
    m = ep.metrics
    assert m["prm_steps_judged"] == len(scores) and m["prm_steps_unscored"] == scores.count(None)
    assert m["outcome_reward"] == outcome
    # the sample of a judged step carries its score and votes
    for s, rec in zip(ep.samples, ep.agent.steps, strict=True):
        if rec.prm_score is not None:
            assert s.metrics["prm_step_score"] == pytest.approx(rec.prm_score)
        assert s.metrics.get("prm_step_votes_pos", 0) == sum(v == 1 for v in rec.prm_votes)
    # and traj.json has them all
    d = write_trajectory(tmp_path / "traj", ep.job, None, ep, None, {})
    traj = json.loads((d / "traj.json").read_text())
    assert [x["score"] for x in traj["prm"]["steps"]] == pytest.approx(scores)
    if name == "loop-errors":
        assert traj["prm"]["steps"][0]["reason"] == "judge_failed" and traj["prm"]["steps"][0]["failed"] == 3
        assert traj["prm"]["steps"][1]["votes"] == [1, None] or sorted(traj["prm"]["steps"][1]["votes"],
                                                                       key=str) == [1, None]


async def test_step_rewards_reach_each_steps_sample(chatml_tokenizer, tmp_path, judge_server):
    ep, _ = await _episode(chatml_tokenizer, tmp_path, "loop-steps", [judge_server.url], judge_server.api_key,
                           step_coef=0.5, reward_mode="step")
    assert [s.reward for s in ep.samples] == pytest.approx([-0.5, -1.5, -1 + 0.5 / 3])
    assert ep.reward == pytest.approx(-1 + 0.5 * (1 - 1 + 1 / 3) / 3)  # the episode's own: the mean
    with pytest.raises(ValueError, match="dynamic_history"):
        ActorConfig(dynamic_history=False, prm=PrmConfig(enable=True, reward_mode="step"))


async def test_judge_down_leaves_steps_unscored(chatml_tokenizer, tmp_path, judge_server):
    # nothing listens there: every vote fails at once; the episode completes with its outcome
    ep, _ = await _episode(chatml_tokenizer, tmp_path, "loop-steps", [f"http://127.0.0.1:{free_port()}"], "k")
    assert ep.reward == -1.0 and ep.outcome == -1.0 and len(ep.samples) == 3
    assert all(s.prm_status == "unscored" and s.prm_reason == "judge_failed" for s in ep.agent.steps)
    assert ep.metrics["prm_steps_unscored"] == 3 and ep.metrics["prm_votes_failed"] == 9
    # a judge that refuses the key: the same
    ep, _ = await _episode(chatml_tokenizer, tmp_path, "fix-mixed", [judge_server.url], "wrong-key")
    assert ep.reward == 1.0 and ep.agent.steps[0].prm_reason == "judge_failed"


@pytest.fixture(scope="module")
def slow_judge(tmp_path_factory, tiny_model_dir):
    """The same votes, each taking 2 s."""
    from inference.local_server import start_scripted_server

    h = start_scripted_server(tiny_model_dir, ROWS, mode="judge", log_dir=tmp_path_factory.mktemp("slow"),
                              extra_args=["--judge-delay-s", "2"])
    yield h
    h.stop()


async def test_a_hanging_judge_never_stalls_the_episode(chatml_tokenizer, tmp_path, slow_judge):
    # votes bounded at 0.3 s against a judge taking 2 s: every vote times out
    ep, wall = await _episode(chatml_tokenizer, tmp_path, "loop-steps", [slow_judge.url], slow_judge.api_key,
                              timeout_s=0.3)
    assert ep.reward == -1.0 and all(s.prm_status == "unscored" for s in ep.agent.steps)
    assert {s.prm_reason for s in ep.agent.steps} <= {"judge_failed", "timeout"}
    assert ep.metrics["prm_votes_failed"] == 9
    assert wall < 20  # bounded by prm.timeout_s, never by the judge


async def test_judge_calls_overlap_the_agent_steps(chatml_tokenizer, tmp_path, slow_judge):
    ep, wall = await _episode(chatml_tokenizer, tmp_path, "loop-steps", [slow_judge.url], slow_judge.api_key,
                              env_delay_s=2.0)
    judge_time = sum(sc.latency_s for sc in ep.prm)
    agent_time = ep.metrics["env_execution_time_sum"] + ep.metrics["model_query_time_sum"]
    assert len(ep.prm) == 3 and all(sc.status == "scored" for sc in ep.prm)
    assert judge_time >= 6.0 and agent_time >= 6.0
    # run one after the other they would take agent + judge time; overlapped, about agent + one
    # judge call (the last step's). A loaded machine stretches both alike: a generous margin.
    assert wall < 0.85 * (agent_time + judge_time), (wall, agent_time, judge_time)


@pytest.mark.docker
async def test_actor_episodes_on_bundled_tasks_with_a_registered_judge(task_images, pool_server, redis_url,
                                                                        tiny_model_dir, tmp_path):
    """The whole actor path: a scripted policy and a scripted judge (role prm) both registered in
    Redis, episodes on bundled tasks in Docker; the judge is found in the registry (never pinned)."""
    from actor_services import actor_config, actor_sets, payload, start_scripted

    from actors.rollout import Rollouts
    from broker.connection import connect
    from broker.keys import Keys
    from broker.registry import ServerRegistry
    from swarl.wiring import actor_runtime
    from swe.tasks import load_tasks

    a, b = load_tasks("train")[:2]
    rows = [{**a, "swarl_scripted_mode": "fix", "swarl_prm_votes": [["+1", "-1", "+1"]]},
            {**b, "swarl_scripted_mode": "wrong", "swarl_prm_votes": [["-1", "bad", "-1"]]}]
    policy = start_scripted(tiny_model_dir, rows, redis_url, tmp_path / "logs")
    judge = start_scripted(tiny_model_dir, rows, redis_url, tmp_path / "logs", mode="judge")
    cfg = actor_config(actor_sets(redis_url, tmp_path / "run", pool_server.url, pool_server.token,
                                  tiny_model_dir, policy.api_key, **{
                                      "actor.prm.enable": "true", "actor.prm.api_key": judge.api_key,
                                      "actor.prm.reward_mode": "step"}))
    r = connect(redis_url)
    ro = Rollouts(actor_runtime(cfg), r, actor_id="actor-prm")
    try:
        roles = {s.url: s.role for s in await ServerRegistry(r, Keys("swarl", "test")).list()}
        assert roles == {policy.url: "policy", judge.url: "prm"}
        good, bad = await asyncio.gather(ro.run(payload(rows[0])), ro.run(payload(rows[1])))
        assert good["resolved"] and good["reward"] == pytest.approx(1 + 1 / 3), good
        assert not bad["resolved"] and bad["reward"] == pytest.approx(-2.0), bad
        trajs = [json.loads((d / "traj.json").read_text()) for d in (tmp_path / "run" / "trajectories").iterdir()]
        by_id = {t["instance_id"]: t for t in trajs}
        assert by_id[a["instance_id"]]["prm"]["step_rewards"] == pytest.approx([1 + 1 / 3, 1.0])
        assert by_id[b["instance_id"]]["prm"]["steps"][0]["votes"].count(-1) == 2
    finally:
        await ro.aclose()
        await r.aclose()
        policy.stop()
        judge.stop()


def test_judge_prompt_keeps_head_and_tail_of_the_history():
    """The earlier steps shown to the judge follow the context's head+tail rule within
    prm.history_tokens; the rendered template names what was left out."""

    class NoJudge:
        async def chat(self, messages, cfg):  # never called: prompt() only renders
            raise AssertionError

    cfg = PrmConfig(enable=True, history_tokens=100)
    judge = StepJudge(cfg, NoJudge(), JudgeTemplates(), "The issue text.", lambda t: 20, head_ratio=0.3)
    from actors.prm import StepView

    for k in range(8):  # what submit() records, without starting a task
        judge.history.append({"n": k + 1, "action": f"cmd-{k + 1}", "returncode": 0, "output": f"out-{k + 1}"})
        judge._lengths.append(20)
    system, user = judge.prompt(StepView(8, "THOUGHT: last\n```bash\nls\n```", "ls", 0, "x" * 10_000))
    assert system["role"] == "system" and "strict evaluator" in system["content"]
    text = user["content"]
    # 100 tokens of 20-token steps: 1 at the head (30%), 4 at the tail; steps 2-4 omitted
    shown = [k for k in range(1, 9) if f"$ cmd-{k}\n" in text]
    assert shown == [1, 5, 6, 7, 8]
    assert "(3 steps omitted)" in text and "Recent History (5 steps)" in text
    assert "Current Step to Evaluate (step 9)" in text and "returncode=0" in text
    assert "characters omitted" in text and len(text) < 8000  # the output was elided
    assert text.index("The issue text.") < text.index("$ cmd-1") < text.index("$ cmd-8")
