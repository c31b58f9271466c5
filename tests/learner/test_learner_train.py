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
from learner.packing import make_microbatches
from learner.train import batch_items, train_step


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
