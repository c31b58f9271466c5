"""The episode on its protocols: scripted policy (in-process) + a real local bash env."""

from __future__ import annotations

import pytest
from actor_localenv import INSTANCE, LocalEnv, make_repo

from actors.config import ActorConfig
from actors.encoding import ChatEncoder
from actors.episode import EpisodeJob, make_agent, run_episode
from actors.protocols import InfraError
from actors.templates import load_templates
from inference.generation import Generation
from inference.scripted import SCRIPTED_LOGPROB, ScriptedPolicy, script_turn

JOB = EpisodeJob("test:local__calc-1:g0:s0", INSTANCE, "local__calc-1:g0", 0, 2)


@pytest.fixture
def base_repo(tmp_path):
    return make_repo(tmp_path / "base")


class GarbledFirstTurn(ScriptedPolicy):
    """A reply without an action, then the gold fix and submit."""

    def answer(self, input_ids: list[int], max_new_tokens: int, rid: str | None = None) -> Generation:
        inst, turn = self.locate(input_ids)
        text = script_turn("format", inst, 0) if turn == 0 else script_turn("fix", inst, turn - 1)
        ids = [*self.tok(text, add_special_tokens=False)["input_ids"], self.eos_id]
        return Generation(ids, [SCRIPTED_LOGPROB] * len(ids), "stop", self.weight_version, text)


async def _run(tok, base_repo, mode="fix", version="3", pinned=3, policy_cls=ScriptedPolicy, **overrides):
    cfg = ActorConfig(**{"exec_timeout_s": 10, "step_limit": 6, **overrides})
    env = LocalEnv(base_repo)
    policy = policy_cls(tok, mode, version, [INSTANCE], sleep_s=5)
    try:
        agent = make_agent(cfg, load_templates(), ChatEncoder(tok), policy, env, JOB, pinned)
        return await run_episode(agent, JOB), env
    finally:
        await env.close()


async def test_gold_fix_resolves_with_plus_one(chatml_tokenizer, base_repo):
    ep, env = await _run(chatml_tokenizer, base_repo, "fix")
    assert ep.agent.ending == "submitted" and ep.resolved and ep.reward == 1.0
    assert "a + b" in ep.agent.patch and ep.status == "completed"
    assert env.commands[0] == INSTANCE["swarl_fix_command"]
    assert len(ep.samples) == 2                     # dynamic history: one per step
    for k, s in enumerate(ep.samples):
        assert s.sample_id == f"{JOB.job_id}:{k}" and s.episode_id == JOB.job_id
        assert (s.step_index, s.steps_total, s.policy_version) == (k, 2, 3)
        assert s.weight_versions == ["3"] * (k + 1)
        assert s.reward == 1.0 and not s.masked and s.group_id == JOB.group_id
        gen = s.tokens[s.prompt_len:]
        assert s.loss_mask[: s.prompt_len].sum() == 0 and s.loss_mask[s.prompt_len:].all()
        assert gen[-1] == ChatEncoder(chatml_tokenizer).eos_id
        assert abs(s.rollout_logprobs[s.prompt_len:] - SCRIPTED_LOGPROB).max() < 1e-6
        assert (s.rollout_logprobs[: s.prompt_len] == 0).all()
    # step 1's prompt is step 0's sample + the observation (the context only grows)
    s0, s1 = ep.samples
    assert list(s1.tokens[: len(s0.tokens)]) == list(s0.tokens)
    m = ep.metrics
    assert m["turns"] == 2 and m["tool_calls"] == 2 and m["resolved"] == 1.0
    assert m["total_time"] >= m["model_query_time_sum"] + m["env_execution_time_sum"]


async def test_wrong_fix_gets_minus_one(chatml_tokenizer, base_repo):
    ep, _ = await _run(chatml_tokenizer, base_repo, "wrong")
    assert ep.agent.ending == "submitted" and not ep.resolved and ep.reward == -1.0
    assert "a * b" in ep.agent.patch


async def test_format_errors_answered_then_step_limit(chatml_tokenizer, base_repo):
    ep, env = await _run(chatml_tokenizer, base_repo, "format", step_limit=3,
                         format_error_penalty=0.1, compact_filtering=True)
    assert ep.agent.ending == "step" and ep.status == "truncated"
    assert ep.agent.format_errors == 3 and env.commands == []
    assert all("found 0 actions" in s.observation for s in ep.agent.steps)
    assert ep.reward == pytest.approx(-1.3)   # empty patch: unresolved, minus the penalty
    assert ep.evaluation is None
    assert all(s.masked and s.mask_reason == "compact_filtering:step" for s in ep.samples)


@pytest.mark.parametrize("dynamic_history", [True, False])
async def test_mask_format_errors_trains_only_the_turns_with_one_action(chatml_tokenizer, base_repo,
                                                                        dynamic_history):
    runs = {mask: await _run(chatml_tokenizer, base_repo, policy_cls=GarbledFirstTurn,
                             format_error_penalty=0.5, mask_format_errors=mask,
                             dynamic_history=dynamic_history)
            for mask in (False, True)}
    for mask, (ep, _) in runs.items():
        steps = ep.agent.steps
        assert [s.format_error for s in steps] == [True, False, False], ep.agent.ending
        assert ep.resolved and ep.reward == pytest.approx(0.5)  # the penalty is still paid
        assert not any(s.masked for s in ep.samples)  # every sample counts in its group
        answers = [len(s.answer_ids) for s in steps]
        trained = sum(int(s.loss_mask.sum()) for s in ep.samples)
        assert trained == (sum(answers[1:]) if mask else sum(answers))
        if dynamic_history:
            assert [int(s.loss_mask.sum()) for s in ep.samples] == [0 if mask else answers[0], *answers[1:]]


async def test_step_limit_without_filtering_is_scored(chatml_tokenizer, base_repo):
    ep, _ = await _run(chatml_tokenizer, base_repo, "loop", step_limit=4)
    assert ep.agent.ending == "step" and len(ep.samples) == 4
    assert not any(s.masked for s in ep.samples) and ep.reward == -1.0


async def test_exec_timeout_is_observed(chatml_tokenizer, base_repo):
    ep, _ = await _run(chatml_tokenizer, base_repo, "sleep", exec_timeout_s=0.5)
    first = ep.agent.steps[0]
    assert first.returncode == -1 and "timed out" in first.observation
    assert ep.agent.ending == "submitted"


async def test_episode_time_limit(chatml_tokenizer, base_repo):
    ep, _ = await _run(chatml_tokenizer, base_repo, "sleep", exec_timeout_s=10, episode_timeout_s=1.0,
                       compact_filtering=True)
    assert ep.agent.ending == "time" and all(s.masked for s in ep.samples)


def _window(tok, blocks: int) -> int:
    """A context window that holds the prompt, a 64-token answer and about `blocks` steps."""
    t = load_templates()
    v = {"task": INSTANCE["problem_statement"], "instance": INSTANCE, "step_limit": 12, "cwd": "/testbed"}
    prompt = ChatEncoder(tok).prompt(t.render("system", **v), t.render("instance", **v))
    return len(prompt) + 64 + blocks * 60


async def test_context_truncation_keeps_prompt_budget(chatml_tokenizer, base_repo):
    window = _window(chatml_tokenizer, 5)
    ep, _ = await _run(chatml_tokenizer, base_repo, "loop", step_limit=12, max_context_len=window,
                       sampling={"max_new_tokens": 64})
    omitted = [s.n_omitted for s in ep.agent.steps]
    assert len(omitted) == 12 and omitted[0] == 0 and max(omitted) > 0
    for s in ep.samples:
        assert s.prompt_len <= window - 64
        assert len(s.tokens) <= window
    text = chatml_tokenizer.decode(ep.samples[-1].tokens)
    assert text.count("omitted due to context window limit") == 1
    assert ep.metrics["context_truncations"] > 0


async def test_context_limit_ends_episode_without_management(chatml_tokenizer, base_repo):
    ep, _ = await _run(chatml_tokenizer, base_repo, "loop", step_limit=12,
                       max_context_len=_window(chatml_tokenizer, 5),
                       sampling={"max_new_tokens": 64}, context_management=False)
    assert ep.agent.ending == "context" and ep.status == "truncated"
    assert 0 < len(ep.agent.steps) < 12


async def test_one_sample_per_episode_without_dynamic_history(chatml_tokenizer, base_repo):
    ep, _ = await _run(chatml_tokenizer, base_repo, "fix", dynamic_history=False)
    (s,) = ep.samples
    steps = ep.agent.steps
    assert s.loss_mask.sum() == sum(len(st.answer_ids) for st in steps)
    assert list(s.tokens[: len(steps[1].prompt_ids)]) == steps[1].prompt_ids
    assert s.weight_versions == ["3", "3"] and s.steps_total == 1


async def test_weight_version_mismatch_is_infra(chatml_tokenizer, base_repo):
    with pytest.raises(InfraError, match="weight_version_mismatch"):
        await _run(chatml_tokenizer, base_repo, "fix", version="4", pinned=3)


async def test_length_cut_answer(chatml_tokenizer, base_repo):
    ep, _ = await _run(chatml_tokenizer, base_repo, "fix", step_limit=2, sampling={"max_new_tokens": 5})
    s = ep.samples[0]
    assert ep.agent.steps[0].finish == "length" and ep.metrics["length_truncated_turns"] == 2
    assert s.loss_mask.sum() == 5 and s.loss_mask[-1] == 0  # closing eos not trained on


class UpdatedUnderTheEpisode(GarbledFirstTurn):
    """Answers turn 0 at version 3, then (weights loaded in flight) at 5."""

    def answer(self, input_ids: list[int], max_new_tokens: int, rid: str | None = None) -> Generation:
        gen = super().answer(input_ids, max_new_tokens, rid)
        self.weight_version = "5"
        return gen


@pytest.mark.parametrize("dynamic_history", [True, False])
async def test_in_flight_turns_carry_the_oldest_version_that_may_have_made_them(chatml_tokenizer, base_repo,
                                                                              dynamic_history):
    """weight_sync.rollout_mode in-flight: no mismatch; a turn answered at a newer version than the
    one before may have begun under the older one and is recorded at it; every generated token
    carries its turn's version and a sample's policy_version is its oldest trained token's."""
    cfg = ActorConfig(exec_timeout_s=10, step_limit=6, dynamic_history=dynamic_history)
    env = LocalEnv(base_repo)
    policy = UpdatedUnderTheEpisode(chatml_tokenizer, "fix", "3", [INSTANCE], sleep_s=5)
    try:
        agent = make_agent(cfg, load_templates(), ChatEncoder(chatml_tokenizer), policy, env, JOB, 3,
                           follow_updates=True)
        ep = await run_episode(agent, JOB)
    finally:
        await env.close()
    assert [s.weight_version for s in ep.agent.steps] == ["3", "3", "5"]
    lens = [len(s.answer_ids) for s in ep.agent.steps]
    if dynamic_history:
        assert [s.policy_version for s in ep.samples] == [3, 3, 5]
        for s, n, v in zip(ep.samples, lens, (3, 3, 5), strict=True):
            assert s.token_versions is not None
            assert s.token_versions.tolist() == [-1] * s.prompt_len + [v] * n
            assert s.generated_tokens == n and s.oldest_version == v
    else:
        (s,) = ep.samples
        assert s.policy_version == 3 and s.weight_versions == ["3", "3", "5"]
        assert s.token_versions is not None
        got = s.token_versions[s.token_versions >= 0].tolist()
        assert got == [3] * (lens[0] + lens[1]) + [5] * lens[2]
        assert ((s.token_versions >= 0) == (s.loss_mask == 1)).all()


class SpansUnderTheEpisode(GarbledFirstTurn):
    """Answers with SGLang 0.5.23's per-token versions: turn 1 was loaded version 5 after its
    first 4 tokens (retracted, then continued), every later token is 5's."""

    def answer(self, input_ids: list[int], max_new_tokens: int, rid: str | None = None) -> Generation:
        gen = super().answer(input_ids, max_new_tokens, rid)
        turn = self.locate(input_ids)[1]
        n = len(gen.ids)
        gen.token_versions = ["3"] * n if turn == 0 else (["3"] * 4 + ["5"] * (n - 4) if turn == 1 else ["5"] * n)
        gen.weight_version = gen.token_versions[-1]
        return gen


@pytest.mark.parametrize("dynamic_history", [True, False])
async def test_in_flight_tokens_carry_the_version_the_server_says_made_them(chatml_tokenizer, base_repo,
                                                                           dynamic_history):
    """Where the server gives weight_versions spans, each token gets its own version (not its
    turn's oldest): the turn across the update is 3 for its first 4 tokens, 5 after."""
    cfg = ActorConfig(exec_timeout_s=10, step_limit=6, dynamic_history=dynamic_history)
    env = LocalEnv(base_repo)
    policy = SpansUnderTheEpisode(chatml_tokenizer, "fix", "3", [INSTANCE], sleep_s=5)
    try:
        agent = make_agent(cfg, load_templates(), ChatEncoder(chatml_tokenizer), policy, env, JOB, 3,
                           follow_updates=True)
        ep = await run_episode(agent, JOB)
    finally:
        await env.close()
    steps = ep.agent.steps
    lens = [len(s.answer_ids) for s in steps]
    assert [s.weight_version for s in steps] == ["3", "3", "5"]  # a turn counts as its oldest token
    want = [[3] * lens[0], [3] * 4 + [5] * (lens[1] - 4), [5] * lens[2]]
    assert [s.token_versions for s in steps] == want
    if dynamic_history:
        for s, w in zip(ep.samples, want, strict=True):
            assert s.token_versions is not None and s.token_versions[s.prompt_len:][:len(w)].tolist() == w
    else:
        (s,) = ep.samples
        assert s.token_versions is not None
        assert s.token_versions[s.token_versions >= 0].tolist() == [v for w in want for v in w]
