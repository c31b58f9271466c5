"""actor.sample_per auto: one sample per episode where no step's context was cut, carrying
exactly the steps' trained tokens and logprobs; the learner's loss is the same up to its
aggregation weights (scripted episodes in a local bash env, the tiny model in the learner)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from actor_localenv import INSTANCE, LocalEnv, make_repo

from actors.config import ActorConfig
from actors.encoding import ChatEncoder
from actors.episode import EpisodeJob, EpisodeResult, build_samples, make_agent, run_episode
from actors.templates import load_templates
from broker.replay import Entry
from broker.wire import Sample
from inference.scripted import ScriptedPolicy
from learner.assembly import Assembler
from learner.backends.torch_backend import TorchBackend
from learner.config import LearnerConfig
from learner.packing import make_microbatches
from learner.train import batch_items, train_step


@pytest.fixture(scope="module")
def tiny_tok(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


async def episode(tok, tmp_path, mode: str, index: int, **overrides) -> EpisodeResult:
    cfg = ActorConfig(**{"exec_timeout_s": 10, "step_limit": 6, "sample_per": "auto", **overrides})
    job = EpisodeJob(f"test:local__calc-1:g0:s{index}", INSTANCE, "local__calc-1:g0", index, 2)
    env = LocalEnv(make_repo(tmp_path / f"base-{mode}-{index}"))
    try:
        agent = make_agent(cfg, load_templates(), ChatEncoder(tok), ScriptedPolicy(tok, mode, "3", [INSTANCE]),
                           env, job, 3)
        return await run_episode(agent, job)
    finally:
        await env.close()


def per(ep: EpisodeResult, sample_per: str, **overrides) -> list[Sample]:
    cfg = ActorConfig(exec_timeout_s=10, step_limit=6, sample_per=sample_per, **overrides)
    return build_samples(cfg, ep, 3)


def trained(samples: list[Sample]) -> tuple[list[int], list[float], list[list[int]]]:
    """Trained token ids and logprobs in order, and the context before each trained token."""
    ids, lps, ctx = [], [], []
    for s in samples:
        for i in np.flatnonzero(s.loss_mask):
            ids.append(int(s.tokens[i]))
            lps.append(float(s.rollout_logprobs[i]))
            ctx.append([int(t) for t in s.tokens[:i]])
    return ids, lps, ctx


async def test_auto_is_one_sample_with_the_steps_trained_tokens(tiny_tok, tmp_path):
    ep = await episode(tiny_tok, tmp_path, "fix", 0)
    assert len(ep.agent.steps) == 2 and ep.resolved
    steps, (one,) = per(ep, "step"), ep.samples
    assert len(steps) == 2 and one.steps_total == 1 and one.step_index == 0
    assert trained([one]) == trained(steps)  # the same tokens and logprobs after the same contexts
    assert one.prompt_len == len(ep.agent.conversation.prompt)  # the issue, before the first turn
    assert len(one.tokens) == len(steps[-1].tokens) < sum(len(s.tokens) for s in steps)
    assert one.weight_versions == steps[-1].weight_versions and one.policy_version == 3
    assert one.reward == steps[0].reward == 1.0 and one.sample_id == f"{ep.job.job_id}:0"
    tv = one.token_versions
    assert tv is not None and set(tv[one.loss_mask == 1].tolist()) == {3} and (tv[one.loss_mask == 0] == -1).all()


async def test_auto_keeps_one_sample_per_step_when_a_context_was_cut(tiny_tok, tmp_path):
    t = load_templates()
    v = {"task": INSTANCE["problem_statement"], "instance": INSTANCE, "step_limit": 12, "cwd": "/testbed"}
    prompt = ChatEncoder(tiny_tok).prompt(t.render("system", **v), t.render("instance", **v))
    ep = await episode(tiny_tok, tmp_path, "loop", 0, step_limit=12, max_context_len=len(prompt) + 64 + 300,
                       sampling={"max_new_tokens": 64})
    assert max(s.n_omitted for s in ep.agent.steps) > 0
    assert len(ep.samples) == len(ep.agent.steps) == 12
    assert [s.step_index for s in ep.samples] == list(range(12))
    # the same episode in a window that holds it is one sample
    whole = await episode(tiny_tok, tmp_path, "loop", 1, step_limit=12, sampling={"max_new_tokens": 64})
    assert max(s.n_omitted for s in whole.agent.steps) == 0
    assert len(whole.samples) == 1 and trained(whole.samples) == trained(per(whole, "step"))


async def test_step_rewards_keep_samples_per_step(tiny_tok, tmp_path):
    ep = await episode(tiny_tok, tmp_path, "fix", 0)
    assert len(build_samples(ActorConfig(sample_per="auto"), dataclasses.replace(ep, step_rewards=[0.5, 1.0]), 3)) == 2
    assert len(per(ep, "step", dynamic_history=False)) == 1  # no dynamic history: one per episode, as before


def _items(samples: list[Sample], cfg: LearnerConfig):
    asm = Assembler(n_per_group=2, batch_size=2, max_staleness=0, group_timeout_s=60)
    asm.add([Entry(f"1-{i}", s) for i, s in enumerate(samples)])
    batch = asm.take_batch(0)
    assert batch is not None
    return batch_items(batch, cfg)[0]


def _token_logprobs(backend: TorchBackend, items) -> list[float]:
    out: list[float] = []
    for it in items:
        mb = make_microbatches([it], 10_000)[0]
        lp, _ = backend.logprobs(mb, grad=False, with_entropy=False)
        out += lp[mb.loss_mask.bool()].tolist()
    return out


@pytest.mark.parametrize("aggregation", ["token", "sequence"])
async def test_the_learner_trains_the_same_on_either(tiny_tok, tiny_model_dir, tmp_path, aggregation):
    """A group of a resolved and a wrong episode (2 steps each), trained once as step samples and
    once as episode samples from the same weights: the same logprob at every trained token, and
    under token aggregation the same step (the same weights after it); under sequence aggregation
    a step sample's turn weighs what an episode sample's whole episode does, so the step differs."""
    torch.set_num_threads(1)
    eps = [await episode(tiny_tok, tmp_path, mode, i) for i, mode in enumerate(("fix", "wrong"))]
    assert [len(e.agent.steps) for e in eps] == [2, 2] and [e.reward for e in eps] == [1.0, -1.0]
    # AdamW with eps far above every gradient: the first update is lr x 0.1 x the gradient, so
    # the weights after it compare the gradients (not their signs)
    cfg = LearnerConfig(lr=100.0, eps=1.0, aggregation=aggregation, objective="ppo", kl_coef=0.0,
                        grad_clip=0.0, warmup_steps=0, rollout_temperature=1.0)
    forms = {k: [s for e in eps for s in per(e, k)] for k in ("step", "auto")}
    assert [len(v) for v in forms.values()] == [4, 2]
    after = {}
    for k, samples in forms.items():
        backend = TorchBackend(cfg, tiny_model_dir)
        items = _items(samples, cfg)
        assert sorted({it.adv for it in items}) == [-1.0, 1.0]
        after[k] = (_token_logprobs(backend, items), train_step(backend, items, cfg),
                    [p.detach().clone() for _, p in backend.named_tensors()])
    (lp_s, m_s, w_s), (lp_e, m_e, w_e) = after["step"], after["auto"]
    np.testing.assert_allclose(lp_s, lp_e, rtol=0, atol=2e-5)
    assert m_s["loss_tokens"] == m_e["loss_tokens"]
    diff = max(float((a - b).abs().max()) for a, b in zip(w_s, w_e, strict=True))
    moved = max(float((a - b).abs().max()) for a, b in zip(w_s, after_init(tiny_model_dir, cfg), strict=True))
    assert moved > 1e-3
    if aggregation == "token":
        assert diff < 1e-4 * moved, (diff, moved)  # float rounding (measured ~3e-6 of it)
    else:
        assert diff > 5e-3 * moved, (diff, moved)  # measured ~2e-2 of it


def after_init(model_dir, cfg: LearnerConfig) -> list[torch.Tensor]:
    return [p.detach().clone() for _, p in TorchBackend(cfg, model_dir).named_tensors()]
