"""learner.spike_clip: a gradient spike must not shrink the updates after it (Adam's second
moment), and the clip follows the run's own scale."""

from __future__ import annotations

import math

import pytest
import torch
from test_learner_train import many_groups_batch

from learner.backends.base import clip_and_step
from learner.backends.torch_backend import TorchBackend
from learner.config import LearnerConfig
from learner.spike_clip import WARMUP, SpikeClip
from learner.train import batch_items, finish_stats, train_step


def test_threshold_follows_the_runs_own_norms() -> None:
    s = SpikeClip(3.0)
    for _ in range(WARMUP):
        assert s.threshold() is None  # too few norms to judge a spike
        assert not s.observe(0.01)
    assert s.threshold() == pytest.approx(0.03)
    assert s.observe(1.0)  # 100x the mean: cut
    assert s.threshold() == pytest.approx(3 * (0.9 * 0.01 + 0.1 * 0.03))  # the mean took the clipped norm
    assert not s.observe(float("nan")) and s.seen == WARMUP + 1  # a skipped step teaches nothing
    big = SpikeClip(3.0)
    for _ in range(WARMUP):
        big.observe(10.0)
    assert big.threshold() == pytest.approx(30.0)  # another run's scale: its own threshold
    off = SpikeClip(None)
    for _ in range(20):
        assert not off.observe(5.0)
    assert off.threshold() is None


def _movement(spike_clip: float | None) -> tuple[float, float]:
    """AdamW (the learner's betas) on a small layer, gradients of norm 0.01 in a steady direction
    with noise (a learning signal), and at update 20 one of norm 1 (a garbled reply's batch). Mean
    parameter movement per update before the spike (10-19) and well after it (50-79, past the
    spike's momentum)."""
    torch.manual_seed(0)
    layer = torch.nn.Linear(32, 32)
    cfg = LearnerConfig()
    opt = torch.optim.AdamW(layer.parameters(), lr=1e-3, betas=cfg.betas, eps=cfg.eps, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda _: 1.0)
    signal = [torch.randn_like(p) for p in layer.parameters()]
    spikes = SpikeClip(spike_clip)
    moved: list[float] = []
    for i in range(80):
        before = [p.detach().clone() for p in layer.parameters()]
        grads = [s + 0.5 * torch.randn_like(s) for s in signal]
        total = math.sqrt(sum(float((g * g).sum()) for g in grads))
        for p, g in zip(layer.parameters(), grads, strict=True):
            p.grad = g * (1.0 if i == 20 else 0.01) / total
        out = clip_and_step(layer, opt, sched, cfg.grad_clip, spikes.threshold())
        spikes.observe(out["grad_norm"])
        moved.append(math.sqrt(sum(float(((p.detach() - b) ** 2).sum())
                                   for p, b in zip(layer.parameters(), before, strict=True))))
    return sum(moved[10:20]) / 10, sum(moved[50:]) / 30


def test_a_spike_freezes_adam_and_the_spike_clip_keeps_it_moving() -> None:
    pre, post = _movement(None)
    assert post < 0.3 * pre, (pre, post)  # the mechanism: one spike shrinks every later update
    pre, post = _movement(3.0)
    assert post > 0.8 * pre, (pre, post)


def test_train_step_clips_at_the_threshold_and_counts_it(small_model_dir) -> None:
    """Through the learner's step: a threshold below the batch's norm is applied (the update is
    smaller than the same step unclipped) and counted in spike_clipped."""
    cfg = LearnerConfig(lr=1e-3, minibatches=1, spike_clip=2.0)
    items, _ = batch_items(many_groups_batch(small_model_dir), cfg)

    def moved(spikes: SpikeClip | None) -> tuple[float, dict[str, float]]:
        backend = TorchBackend(cfg, small_model_dir)
        before = {n: t.clone() for n, t in backend.named_tensors()}
        m = finish_stats(train_step(backend, items, cfg, spikes=spikes))
        return math.sqrt(sum(float(((t - before[n]) ** 2).sum()) for n, t in backend.named_tensors())), m

    free, m_free = moved(None)
    tight = SpikeClip(2.0)
    tight.mean, tight.seen = m_free["grad_norm"] / 100, WARMUP  # earlier updates 100x smaller
    cut, m_cut = moved(tight)
    assert m_free["spike_clipped"] == 0 and m_cut["spike_clipped"] == 1
    assert m_cut["grad_norm"] == pytest.approx(m_free["grad_norm"], rel=1e-5)  # reported before clipping
    assert tight.mean < m_free["grad_norm"] / 10  # the spike entered the mean clipped
    assert cut < free, (cut, free)
