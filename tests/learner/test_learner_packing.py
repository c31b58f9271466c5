"""Packed micro-batches give the same per-token logprobs as each sample alone; the token
budget splits and accumulates without changing the gradient."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from learner.backends.torch_backend import TorchBackend
from learner.config import LearnerConfig
from learner.packing import TrainItem, first_fit_decreasing, make_microbatches, padded_groups
from learner.train import train_step


def items(n: int = 7, seed: int = 0) -> list[TrainItem]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        length = int(rng.integers(4, 60))
        toks = rng.integers(1, 512, size=length).astype(np.int32)
        mask = np.zeros(length, dtype=np.uint8)
        mask[2:] = 1
        behav = np.where(mask == 1, -6.0, 0.0).astype(np.float32)
        out.append(TrainItem(f"s{i}", toks, mask, behav, adv=float(rng.normal()), tok_w=1.0 / 100))
    return out


def per_sample(backend: TorchBackend, mbs) -> dict[str, torch.Tensor]:
    got = {}
    for mb in mbs:
        lp, _ = backend.logprobs(mb, grad=False, with_entropy=False)
        for k, it in enumerate(mb.items):
            got[it.sample_id] = lp[mb.slot_sample == k]
    return got


def test_first_fit_and_padded_groups_respect_budget() -> None:
    lengths = [50, 10, 30, 70, 5, 40, 120]
    bins = first_fit_decreasing(lengths, 100)
    assert sorted(i for b in bins for i in b) == list(range(len(lengths)))
    assert all(sum(lengths[i] for i in b) <= 100 or len(b) == 1 for b in bins)
    groups = padded_groups(lengths, 100)
    assert [i for g in groups for i in g] == list(range(len(lengths)))
    assert all(len(g) * max(lengths[i] for i in g) <= 100 or len(g) == 1 for g in groups)


@pytest.mark.parametrize("attention", ["varlen", "mask"])
def test_packed_equals_unpacked(small_model_dir, attention: str) -> None:
    backend = TorchBackend(LearnerConfig(attention=attention), small_model_dir)
    its = items()
    alone = per_sample(backend, [make_microbatches([it], 10_000)[0] for it in its])
    packed_mbs = make_microbatches(its, 128, packed=True)
    assert len(packed_mbs) < len(its)  # really packed several samples per row
    packed = per_sample(backend, packed_mbs)
    padded = per_sample(backend, make_microbatches(its, 128, packed=False))
    fixed = make_microbatches(its, 128, packed=False, pad_to="batch")
    assert {mb.input_ids.shape[1] for mb in fixed} == {max(len(it.tokens) for it in its)}
    fixed_lp = per_sample(backend, fixed)
    for it in its:
        torch.testing.assert_close(fixed_lp[it.sample_id], alone[it.sample_id], atol=1e-5, rtol=0)
        assert len(alone[it.sample_id]) == int(it.loss_mask[1:].sum())  # a slot per loss token only
        torch.testing.assert_close(packed[it.sample_id], alone[it.sample_id], atol=1e-5, rtol=0)
        torch.testing.assert_close(padded[it.sample_id], alone[it.sample_id], atol=1e-5, rtol=0)


@pytest.mark.parametrize("packing", [True, False])
def test_microbatch_budget_does_not_change_the_gradient(small_model_dir, packing: bool) -> None:
    grads = []
    for budget in (10_000, 64):
        cfg = LearnerConfig(max_tokens_per_microbatch=budget, packing=packing, lr=0.0, grad_clip=0.0)
        backend = TorchBackend(cfg, small_model_dir)
        captured = {}
        orig = backend.step

        def step(max_norm=None, *, b=backend, c=captured, o=orig):
            c.update({n: p.grad.clone() for n, p in b.model.named_parameters() if p.grad is not None})
            return o(max_norm)

        backend.step = step
        m = train_step(backend, items(), cfg)
        assert m["microbatches"] == (1 if budget == 10_000 else m["microbatches"])
        grads.append(captured)
    assert grads[0].keys() == grads[1].keys()
    for n in grads[0]:
        torch.testing.assert_close(grads[0][n], grads[1][n], atol=1e-6, rtol=1e-4)
