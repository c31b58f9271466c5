"""A trust region on each optimizer update (`learner.max_update_kl`).

Adam scales every parameter's step by the root of its own running mean of squared gradients, so
an update's size in the policy is not its gradient's: where a gradient falls on parameters whose
history is small, a gradient of ordinary norm moves the policy far; neither the gradient clip nor
learner.spike_clip sees it. In the SWE demo (docs/demo.md, "A second seed with both controls")
single updates moved the policy 20-40x the run's median update KL at ordinary gradient norms, and
the rewarded policy's edit commands began to come out garbled right after the chosen replacement
(the shuffled-reward arm had as many such updates and garbled none: they carry what the reward
pushes, too far at once). With a bound of 0.01 the same seed garbled none, and its held-out
resolve rate rose 0.55 -> 0.91 where it had risen 0.02.

After each update the KL the step has moved the policy is measured (k3 of KL(proximal || new)
on the sampled tokens, weighted as the loss is, summed over the data-parallel ranks so every rank
decides alike): over every minibatch of the step (`learner.max_update_kl_scope: batch`, the
mean over minibatches, as the step's update KL), or over the update's own minibatch
(`minibatch`). Above the bound the parameters are set back to before + alpha * (after - before),
alpha halved until the KL is within the bound, and the update is undone (alpha 0) if it is still
above after `max_update_kl_tries` halvings — TRPO's backtracking line search, with Adam's
direction in place of the natural gradient. Adam's moments keep the update's gradient. The KL is
measured against the proximal policy (before the step's first update), so the bound holds for the
step's updates together, as PPO's clip does.

Why the batch: an update within the bound on its own minibatch can move the policy far on the
step's other minibatches. In the SWE demo with two epochs of two minibatches (docs/demo.md "Two
epochs, half the steps") one step ended at an update KL of 0.71 over its batch, every update
within 0.01 on its own minibatch or undone, and the next step's format errors went 0 -> 0.28.
Cost: one no-grad forward of the batch per update (of the minibatch, with `minibatch`), one more
per halving, and two copies of the parameters; the last update's measure is also the step's
update KL (learner.train), so that pass is not made twice.
"""

from __future__ import annotations

import torch

from learner.backends.base import TrainBackend
from learner.losses import kl_k3
from learner.packing import MicroBatch


def kl_sum(backend: TrainBackend, mbs: list[MicroBatch]) -> float:
    """This rank's KL(proximal || current) on the sampled tokens of `mbs`, weighted as the loss is
    (summed over the micro-batches: each minibatch's weights add up to 1 over the ranks)."""
    total = 0.0
    for mb in mbs:
        assert mb.prox_logp is not None, "the proximal pass must run before the policy's KL to it"
        with torch.no_grad():
            lp = backend.logprobs(mb, grad=False, with_entropy=False)[0].detach().float().cpu()
        total += float((kl_k3(mb.prox_logp, lp) * mb.tok_w * mb.loss_mask).sum())
    return total


def region_kl(backend: TrainBackend, mbs: list[MicroBatch], n_minibatches: int = 1) -> float:
    """KL(proximal || current) on the sampled tokens of `mbs` (micro-batches of `n_minibatches`
    minibatches), weighted as the loss is, a mean over those minibatches, over every
    data-parallel rank."""
    return backend.dp_sum(kl_sum(backend, mbs) / n_minibatches)


def constrain(backend: TrainBackend, before: list[torch.Tensor], mbs: list[MicroBatch],
              bound: float, tries: int, n_minibatches: int = 1) -> tuple[float, float]:
    """After an optimizer update from the parameters `before`: scale it back until the policy's
    KL on `mbs` (`n_minibatches` minibatches' micro-batches) is within `bound`. Returns (alpha
    kept, KL at it)."""
    kl = region_kl(backend, mbs, n_minibatches)
    if kl <= bound:
        return 1.0, kl
    after = backend.params_snapshot()
    alpha = 1.0
    for _ in range(tries):
        alpha /= 2
        backend.params_blend(before, after, alpha)
        kl = region_kl(backend, mbs, n_minibatches)
        if kl <= bound:
            return alpha, kl
    backend.params_blend(before, after, 0.0)
    return 0.0, region_kl(backend, mbs, n_minibatches)
