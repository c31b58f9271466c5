"""One step moves logprobs the way the advantage says; checkpoints round-trip exactly."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from learner_helpers import make_sample, true_logprobs

from broker.replay import Entry
from learner import checkpoint
from learner.assembly import Assembler
from learner.backends.torch_backend import TorchBackend
from learner.checkpoint import LearnerState
from learner.config import LearnerConfig
from learner.losses import kl_k3
from learner.packing import make_microbatches
from learner.train import batch_items, finish_stats, train_step


def one_group_batch(model_dir, rewards=(1.0, 0.0), **kw):
    samples = [make_sample("g", i, reward=r, length=16, seed=i, **kw) for i, r in enumerate(rewards)]
    true_logprobs(model_dir, samples)
    asm = Assembler(n_per_group=len(rewards), batch_size=len(rewards), max_staleness=0, group_timeout_s=60)
    asm.add([Entry(f"1-{i}", s) for i, s in enumerate(samples)])
    batch = asm.take_batch(version=0)
    assert batch is not None
    return batch


def seq_logprob(backend: TorchBackend, items) -> list[float]:
    out = []
    for it in items:
        mb = make_microbatches([it], 10_000)[0]
        lp, _ = backend.logprobs(mb, grad=False, with_entropy=False)
        out.append(float((lp * mb.loss_mask).sum()))
    return out


@pytest.mark.parametrize("objective", ["decoupled", "tis"])
def test_positive_advantage_rises_negative_falls(small_model_dir, objective: str) -> None:
    cfg = LearnerConfig(lr=1e-3, objective=objective, grad_clip=1.0)
    backend = TorchBackend(cfg, small_model_dir)
    items, stats = batch_items(one_group_batch(small_model_dir), cfg)
    assert [it.adv for it in items] == [0.5, -0.5]
    assert stats["reward_mean"] == 0.5 and stats["resolve_rate"] == 0.5
    before = seq_logprob(backend, items)
    m = train_step(backend, items, cfg)
    after = seq_logprob(backend, items)
    assert after[0] > before[0] + 1e-3, (before, after)
    assert after[1] < before[1] - 1e-3, (before, after)
    # on-policy rollout logprobs: importance weights are 1, nothing clipped
    assert m["imp_weight_mean"] == pytest.approx(1.0, abs=1e-4)
    assert m["clip_frac"] == 0.0 and m["grad_norm"] > 0 and m["entropy"] > 0


def test_dynamic_history_steps_share_the_episode_advantage(small_model_dir) -> None:
    samples = [make_sample("g", 0, reward=1.0, step_index=k, steps_total=3, seed=k) for k in range(3)]
    samples += [make_sample("g", 1, reward=0.0, seed=9)]
    asm = Assembler(n_per_group=2, batch_size=2, max_staleness=0, group_timeout_s=60)
    asm.add([Entry(f"1-{i}", s) for i, s in enumerate(samples)])
    items, _ = batch_items(asm.take_batch(0), LearnerConfig())
    assert sorted((it.sample_id, it.adv) for it in items) == [
        ("g/0/0", 0.5), ("g/0/1", 0.5), ("g/0/2", 0.5), ("g/1/0", -0.5)]


def test_per_step_rewards_give_per_step_advantages() -> None:
    """PRM step rewards (actor.prm.reward_mode step): each step's reward minus the group baseline,
    the mean of the episodes' mean step rewards."""
    # episode 0: steps rewarded 1.5, 0.5, 1.0 (mean 1.0); episode 1: one step, -1.0
    samples = [make_sample("g", 0, reward=r, step_index=k, steps_total=3, seed=k)
               for k, r in enumerate((1.5, 0.5, 1.0))]
    samples += [make_sample("g", 1, reward=-1.0, seed=9)]
    items, stats = batch_items(_rebatch(samples), LearnerConfig())
    assert sorted((it.sample_id, it.adv) for it in items) == [
        ("g/0/0", 1.5), ("g/0/1", 0.5), ("g/0/2", 1.0), ("g/1/0", -1.0)]  # baseline (1 - 1) / 2 = 0
    assert stats["reward_mean"] == 0.0 and stats["adv_mean"] == 0.0
    # with std_norm the scale is the std of the episode means (1.0 here)
    items, _ = batch_items(_rebatch(samples), LearnerConfig(advantage_std_norm=True))
    assert sorted(round(it.adv, 4) for it in items) == [-1.0, 0.5, 1.0, 1.5]


def _rebatch(samples):
    asm = Assembler(n_per_group=2, batch_size=2, max_staleness=0, group_timeout_s=60)
    asm.add([Entry(f"1-{i}", s) for i, s in enumerate(samples)])
    return asm.take_batch(0)


def test_checkpoint_round_trip(small_model_dir, tmp_path) -> None:
    cfg = LearnerConfig(lr=1e-3, warmup_steps=3)
    a = TorchBackend(cfg, small_model_dir)
    items, _ = batch_items(one_group_batch(small_model_dir), cfg)
    train_step(a, items, cfg)
    state = LearnerState(step=1, version=1, consumed=["g/0/0", "g/1/0"], closed_groups=["g"],
                         dropped={"stale": 2}, trained_samples=2)
    path = checkpoint.save(tmp_path, a, state)
    rng_after_save = torch.rand(3)
    np_after_save = np.random.rand(2)

    b = TorchBackend(cfg, small_model_dir)
    got = checkpoint.load(checkpoint.latest(tmp_path), b)
    assert checkpoint.latest(tmp_path) == path
    assert got == state
    assert torch.equal(torch.rand(3), rng_after_save) and np.array_equal(np.random.rand(2), np_after_save)
    for (na, pa), (nb, pb) in zip(a.named_tensors(), b.named_tensors(), strict=True):
        assert na == nb and torch.equal(pa, pb)
    assert b.sched.get_last_lr() == a.sched.get_last_lr()
    # the optimizer state came back: the next identical step gives identical weights
    train_step(a, items, cfg)
    train_step(b, items, cfg)
    for (_, pa), (_, pb) in zip(a.named_tensors(), b.named_tensors(), strict=True):
        assert torch.equal(pa, pb)


def test_checkpoints_pruned_and_tmp_ignored(small_model_dir, tmp_path) -> None:
    cfg = LearnerConfig()
    a = TorchBackend(cfg, small_model_dir)
    for step in (1, 2, 3):
        checkpoint.save(tmp_path, a, LearnerState(step=step), keep=2)
    root = checkpoint.ckpt_root(tmp_path)
    (root / ".tmp_step_00000004_1").mkdir()  # what a kill -9 mid-save leaves
    assert sorted(p.name for p in root.glob("step_*")) == ["step_00000002", "step_00000003"]
    assert checkpoint.latest(tmp_path).name == "step_00000003"


# -- several optimizer updates per batch (learner.minibatches, learner.epochs) -----------------


def many_groups_batch(model_dir, n_groups: int = 4, per_group: int = 2):
    """`n_groups` groups of `per_group` on-policy episodes with rewards 1, 0, 1, ... in each."""
    samples = [make_sample(f"g{g}", i, reward=float(i % 2 == 0), length=14 + 3 * g + i, seed=100 * g + i)
               for g in range(n_groups) for i in range(per_group)]
    true_logprobs(model_dir, samples)
    asm = Assembler(n_per_group=per_group, batch_size=len(samples), max_staleness=0, group_timeout_s=60)
    asm.add([Entry(f"1-{i}", s) for i, s in enumerate(samples)])
    batch = asm.take_batch(version=0)
    assert batch is not None and len(batch.groups) == n_groups
    return batch


def _params(backend: TorchBackend) -> dict[str, torch.Tensor]:
    return {n: t.clone() for n, t in backend.named_tensors()}


@pytest.mark.parametrize("update_kl", [True, False])
def test_one_update_is_todays_step(small_model_dir, update_kl: bool) -> None:
    """minibatches 1 / epochs 1: the loss and the update of the single optimizer step as it was
    written before several updates existed (the proximal policy = the forward's own logprobs,
    detached), to 1e-6, whether or not the proximal and update-KL passes run beside it."""
    from learner.backends.base import clip_and_step
    from learner.losses import LossInputs, policy_loss

    cfg = LearnerConfig(lr=1e-3, update_kl=update_kl, minibatches=1)
    batch = many_groups_batch(small_model_dir)
    ref = TorchBackend(cfg, small_model_dir)
    items, _ = batch_items(batch, cfg)
    loss_ref = 0.0
    for mb in make_microbatches(items, cfg.max_tokens_per_microbatch):
        logp, ent = ref.logprobs(mb, grad=True, with_entropy=True)
        loss, _ = policy_loss(LossInputs(logp=logp, prox_logp=logp.detach(), behav_logp=mb.behav_logp,
                                         adv=mb.adv, mask=mb.loss_mask, tok_w=mb.tok_w,
                                         entropy=ent.detach()), cfg)
        loss.backward()
        loss_ref += float(loss)
    clip_and_step(ref.model, ref.opt, ref.sched, cfg.grad_clip)

    new = TorchBackend(cfg, small_model_dir)
    items, _ = batch_items(batch, cfg)
    m = train_step(new, items, cfg)
    assert m["updates"] == 1
    assert m["loss"] == pytest.approx(loss_ref, abs=1e-6)
    a, b = _params(ref), _params(new)
    assert max(float((a[k] - b[k]).abs().max()) for k in a) <= 1e-6
    assert ("update_kl" in m) == update_kl
    if update_kl:  # the update moved the policy
        assert m["update_kl"] > 0


def test_minibatches_keep_groups_whole_and_normalise_each() -> None:
    from learner.train import split_minibatches

    assert split_minibatches([4, 4, 4, 4], 4) == [0, 1, 2, 3]
    assert split_minibatches([4, 2, 2, 4], 2) == [0, 0, 1, 1]  # 6 episodes each
    assert split_minibatches([3, 3], 4) == [0, 1]  # no more minibatches than groups
    assert split_minibatches([5], 1) == [0]


def test_several_updates_clip_against_the_proximal_policy(small_model_dir) -> None:
    """Four minibatches: the first update starts at the proximal policy (nothing clipped), every
    later one from parameters the earlier ones moved, so the clip acts; each minibatch is a mean
    of its own (token weights sum to 1 per minibatch)."""
    cfg = LearnerConfig(lr=3e-3, minibatches=4, epochs=2, clip_eps=0.05)
    backend = TorchBackend(cfg, small_model_dir)
    items, _ = batch_items(many_groups_batch(small_model_dir, n_groups=4), cfg)
    assert sorted({it.minibatch for it in items}) == [0, 1, 2, 3]
    for k in range(4):
        part = [it for it in items if it.minibatch == k]
        assert len({it.sample_id.split("/")[0] for it in part}) == 1  # one whole group
        assert sum(it.tok_w * int(it.loss_mask[1:].sum()) for it in part) == pytest.approx(1.0)
    per_update: list[dict[str, float]] = []
    m = finish_stats(train_step(backend, items, cfg, per_update))
    assert len(per_update) == 8 and m["updates"] == 8
    assert per_update[0]["clip_frac"] == 0.0
    assert all(u["clip_frac"] > 0 for u in per_update[1:]), [u["clip_frac"] for u in per_update]
    # on-policy samples: the proximal policy is the behaviour policy, so no mismatch
    assert m["mismatch_kl"] == pytest.approx(0.0, abs=1e-6)
    assert m["update_kl"] > 0 and m["grad_norm_max"] >= m["grad_norm"] > 0


class EveryMinibatchPassed(TorchBackend):
    """The torch backend as a pipeline stage before the last sees it: no proximal logprobs from
    the first update's forward, a no-grad pass over every minibatch instead."""

    @property
    def loss_sees_every_microbatch(self) -> bool:
        return False


def _counted(backend: TorchBackend) -> list[int]:
    """Counts the backend's no-grad forwards (micro-batches through logprobs(grad=False))."""
    calls = [0]
    inner = backend.logprobs

    def logprobs(mb, *, grad, with_entropy):
        calls[0] += not grad
        return inner(mb, grad=grad, with_entropy=with_entropy)

    backend.logprobs = logprobs  # type: ignore[method-assign]
    return calls


@pytest.mark.parametrize("trust", [None, 1e-5])
def test_the_first_update_is_its_own_proximal_pass(small_model_dir, monkeypatch, trust: float | None) -> None:
    """The first update's forward gives its minibatch's proximal logprobs: the same step to 1e-6
    as with a no-grad pass over every minibatch, with that pass one minibatch shorter. With the
    trust region on each update's own minibatch (a bound of 1e-5 scales every update back) its
    measure of the last update is the last minibatch's update KL: the pass after the step leaves
    it out, and the step's update KL is still the one a forward at the final parameters gives."""
    import learner.train as train

    cfg = LearnerConfig(lr=3e-3, minibatches=2, epochs=2, max_update_kl=trust, max_update_kl_tries=10,
                        max_update_kl_scope="minibatch")
    batch = many_groups_batch(small_model_dir, n_groups=4)
    after_pass: list[int] = []  # micro-batches the update-KL pass ran over
    inner = train.update_kl
    monkeypatch.setattr(train, "update_kl", lambda b, mbs, n, known=None: (after_pass.append(len(mbs)),
                                                                            inner(b, mbs, n, known))[1])
    runs = []
    for cls in (EveryMinibatchPassed, TorchBackend):
        backend = cls(cfg, small_model_dir)
        calls = _counted(backend)
        items, _ = batch_items(batch, cfg)
        per: list[dict[str, float]] = []
        m = finish_stats(train_step(backend, items, cfg, per))
        runs.append((m, per, _params(backend), calls[0], items, backend))
    (m0, per0, p0, n0, items0, _), (m1, per1, p1, n1, items1, b1) = runs
    assert max(float((p0[k] - p1[k]).abs().max()) for k in p0) <= 1e-6
    for k in ("loss", "pg_loss", "clip_frac", "ratio_mean", "update_kl", "behav_kl", "mismatch_kl"):
        assert m1[k] == pytest.approx(m0[k], abs=1e-6), k
    assert [u["grad_norm"] for u in per1] == pytest.approx([u["grad_norm"] for u in per0], rel=1e-5)
    for a, b in zip(items0, items1, strict=True):  # the proximal logprobs each sample trained against
        assert a.prox_logp is not None and b.prox_logp is not None
        assert np.abs(a.prox_logp - b.prox_logp).max() <= 1e-6
    first = len(make_microbatches([it for it in items1 if it.minibatch == 0], cfg.max_tokens_per_microbatch))
    last = len(make_microbatches([it for it in items1 if it.minibatch == 1], cfg.max_tokens_per_microbatch))
    assert n0 - n1 == first, (n0, n1, first)  # saved: the first minibatch's proximal pass
    assert after_pass == [first if trust else first + last] * 2
    # the update KL against a forward of every minibatch at the final parameters
    every = make_microbatches(items1, cfg.max_tokens_per_microbatch)
    want = 0.0
    for mb in every:
        lp = b1.logprobs(mb, grad=False, with_entropy=False)[0].detach()
        assert mb.prox_logp is not None
        want += float((kl_k3(mb.prox_logp, lp) * mb.tok_w * mb.loss_mask).sum()) / 2
    assert m1["update_kl"] == pytest.approx(want, rel=1e-4, abs=1e-9)
    if trust:
        assert m1["update_backtracked"] == 4 and m1["update_kl"] > 0


def test_the_reference_runs_once_a_step(small_model_dir) -> None:
    """With the KL term (learner.kl_coef) and two epochs, the frozen reference's forward runs once
    per micro-batch of the step, not once per epoch (its logprobs do not change)."""
    cfg = LearnerConfig(lr=3e-3, minibatches=2, epochs=2, kl_coef=0.1)
    batch = many_groups_batch(small_model_dir, n_groups=4)
    backend = TorchBackend(cfg, small_model_dir, ref_model_dir=small_model_dir)
    seen: list[int] = []
    inner = backend.ref_logprobs

    def ref_logprobs(mb):
        seen.append(id(mb))
        return inner(mb)

    backend.ref_logprobs = ref_logprobs  # type: ignore[method-assign]
    items, _ = batch_items(batch, cfg)
    per: list[dict[str, float]] = []
    m = finish_stats(train_step(backend, items, cfg, per))
    n_mbs = sum(len(make_microbatches([it for it in items if it.minibatch == k], cfg.max_tokens_per_microbatch))
                for k in (0, 1))
    assert len(seen) == len(set(seen)) == n_mbs, (len(seen), n_mbs)
    # the term is live: the second epoch starts where the first moved the policy from the reference
    assert len(per) == 4 and per[2]["kl_ref"] > per[0]["kl_ref"] >= 0 and m["kl_ref"] > 0


def test_diagnostics_of_a_step(small_model_dir) -> None:
    """Zero-spread groups, mismatch KL against off-policy behaviour logprobs, mean |advantage|."""
    samples = [make_sample("a", i, reward=1.0, seed=i) for i in range(2)]  # all equal: no signal
    samples += [make_sample("b", i, reward=float(i), seed=10 + i) for i in range(2)]
    true_logprobs(small_model_dir, samples)
    for s in samples:  # the actors' logprobs a bit off the learner's: a mismatch of known size
        s.rollout_logprobs = np.where(s.loss_mask == 1, s.rollout_logprobs - 0.1, 0.0).astype(np.float32)
    asm = Assembler(n_per_group=2, batch_size=4, max_staleness=0, group_timeout_s=60)
    asm.add([Entry(f"1-{i}", s) for i, s in enumerate(samples)])
    cfg = LearnerConfig(lr=1e-3)
    items, stats = batch_items(asm.take_batch(0), cfg)
    assert stats["zero_spread_groups_frac"] == 0.5 and stats["adv_abs_mean"] == 0.25
    m = finish_stats(train_step(TorchBackend(cfg, small_model_dir), items, cfg))
    # behaviour = prox - 0.1 on every token: k1 = -0.1, k3 = exp(0.1) - 0.1 - 1
    assert m["fresh_frac"] == pytest.approx(1.0)  # made at the learner's version: all fresh
    assert m["mismatch_k1"] == pytest.approx(-0.1, abs=1e-5)
    assert m["mismatch_kl"] == pytest.approx(np.exp(0.1) - 1.1, abs=1e-5)
    assert m["behav_kl"] == pytest.approx(m["mismatch_kl"], abs=1e-6)
    assert m["entropy"] > 0


def test_the_mismatch_is_measured_on_fresh_tokens_only(small_model_dir) -> None:
    """A stale sample (made by an older version) differs from the learner's policy because the
    policy moved, not because of a bug: it counts in behav_kl, never in the mismatch KL."""
    samples = [make_sample("a", i, reward=float(i), seed=i, version=1) for i in range(2)]
    samples += [make_sample("b", i, reward=float(i), seed=10 + i, version=0) for i in range(2)]
    true_logprobs(small_model_dir, samples)
    for s in samples[2:]:  # the stale ones, far off the learner's policy
        s.rollout_logprobs = np.where(s.loss_mask == 1, s.rollout_logprobs - 1.0, 0.0).astype(np.float32)
    asm = Assembler(n_per_group=2, batch_size=4, max_staleness=1, group_timeout_s=60)
    asm.add([Entry(f"1-{i}", s) for i, s in enumerate(samples)])
    cfg = LearnerConfig(lr=1e-3)
    batch = asm.take_batch(1)
    items, _ = batch_items(batch, cfg)
    assert {it.sample_id: it.fresh for it in items} == {"a/0/0": True, "a/1/0": True, "b/0/0": False,
                                                        "b/1/0": False}
    m = finish_stats(train_step(TorchBackend(cfg, small_model_dir), items, cfg))
    assert m["mismatch_kl"] == pytest.approx(0.0, abs=1e-6)
    assert m["behav_kl"] > 0.1 and 0 < m["fresh_frac"] < 1
