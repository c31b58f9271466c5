"""The seam every training backend implements; the loop and train step depend only on this.

Under torchrun a backend is built on every rank. Methods marked COLLECTIVE must be called on
every rank of the learner, in the same order (rank 0 tells the others when, see
learner/ranks.py); the rest are local to the rank.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Protocol

import torch

from learner.packing import MicroBatch

# (logprobs [N], entropy [N] or None, micro-batch) -> (loss to backward, statistics)
LossFn = Callable[[torch.Tensor, torch.Tensor | None, MicroBatch], tuple[torch.Tensor, dict[str, float]]]


class TrainBackend(Protocol):
    @property
    def dp_rank(self) -> int:
        """This rank's data-parallel index: ranks with the same index (tensor/pipeline peers)
        train the same micro-batches; ranks with different indices get different shards."""
        ...

    @property
    def dp_size(self) -> int:
        """Number of data-parallel shards of a step (1 on a single process)."""
        ...

    @property
    def loss_sees_every_microbatch(self) -> bool:
        """Whether train_microbatches calls `loss_fn` on this rank for each of its micro-batches,
        in order, with their slots in order (not on a pipeline stage before the last): the step's
        first update's forward then gives the proximal logprobs of its minibatch (learner.train).
        The same on every rank."""
        ...

    def train_microbatches(self, mbs: list[MicroBatch], loss_fn: LossFn) -> list[dict[str, float]]:
        """COLLECTIVE over the data-parallel and model-parallel peers. Forward and backward
        every micro-batch of this rank's shard, accumulating gradients; gradients are reduced
        across data-parallel ranks once, after the last micro-batch (any number of micro-batches,
        which may differ between ranks). `loss_fn` gives each micro-batch's loss already
        normalised by the whole step's batch, so the reduced gradient must be the SUM over
        micro-batches and data-parallel ranks. Returns one statistics dict per micro-batch
        (with "loss"). An empty list is allowed only on a single rank."""
        ...

    def logprobs(self, mb: MicroBatch, *, grad: bool,
                 with_entropy: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Per-slot logprobs [N] (and entropy [N]) of softmax(logits / T) for a micro-batch
        (local: no gradient reduction; for evaluation and tests)."""
        ...

    def ref_logprobs(self, mb: MicroBatch) -> torch.Tensor | None:
        """Per-slot logprobs of the frozen reference model (None when KL is off)."""
        ...

    def step(self, max_norm: float | None = None) -> dict[str, float]:
        """COLLECTIVE. Clip gradients (at grad_clip, or at `max_norm` where lower), optimizer +
        scheduler step, zero grads; returns grad_norm (before clipping) and lr (the same on
        every rank)."""
        ...

    def params_snapshot(self) -> list[torch.Tensor]:
        """Copies of this rank's trainable parameters (learner.max_update_kl)."""
        ...

    def params_blend(self, before: list[torch.Tensor], after: list[torch.Tensor], alpha: float) -> None:
        """Set this rank's parameters to before + alpha * (after - before), both params_snapshot()s."""
        ...

    def dp_sum(self, x: float) -> float:
        """COLLECTIVE over the data-parallel ranks: the sum of `x` (x itself on one rank)."""
        ...

    def publish_tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        """COLLECTIVE: every rank iterates it to the end. The policy's weights in HF naming,
        gathered to global rank 0 one tensor at a time and handed out there as CPU tensors;
        other ranks take part in the gathering and get nothing."""
        ...

    def save(self, path: Path) -> None:
        """COLLECTIVE. Model (HF safetensors + config), optimizer and scheduler state into the
        directory `path` (shared by all ranks); each rank writes what only it holds."""
        ...

    def load(self, path: Path) -> None:
        """COLLECTIVE. Restore what `save` wrote."""
        ...


class NoSync(Protocol):
    def __call__(self) -> AbstractContextManager[None]: ...


def clip_at(grad_clip: float, max_norm: float | None) -> float:
    """The norm an update is clipped at: grad_clip (0: none), or `max_norm` where lower."""
    at = grad_clip if grad_clip > 0 else float("inf")
    return at if max_norm is None else min(at, max_norm)


def clip_and_step(model: torch.nn.Module, opt: torch.optim.Optimizer, sched: torch.optim.lr_scheduler.LRScheduler,
                  grad_clip: float, max_norm: float | None = None) -> dict[str, float]:
    """The plain-torch optimizer step: clip, step, schedule, zero grads."""
    params = [p for p in model.parameters() if p.grad is not None]
    max_norm = clip_at(grad_clip, max_norm)
    norm = torch.nn.utils.clip_grad_norm_(params, max_norm) if params else torch.tensor(0.0)
    lr = sched.get_last_lr()[0]
    opt.step()
    sched.step()
    opt.zero_grad(set_to_none=True)
    return {"grad_norm": float(norm), "lr": float(lr)}


def accumulate(mbs: list[MicroBatch], loss_fn: LossFn, forward: Callable[[MicroBatch], tuple[torch.Tensor, torch.Tensor | None]],
               no_sync: NoSync, scale: float) -> list[dict[str, float]]:
    """Gradient accumulation over micro-batches for backends driven from Python: every
    backward but the last runs under `no_sync()` (no gradient reduction), the last one reduces.
    `scale` undoes a reduction that averages over `scale` data-parallel ranks."""
    stats: list[dict[str, float]] = []
    for i, mb in enumerate(mbs):
        last = i == len(mbs) - 1
        with no_sync() if not last else nullcontext():
            logp, ent = forward(mb)
            loss, st = loss_fn(logp, ent, mb)
            (loss * scale).backward()
        st["loss"] = float(loss.detach())
        stats.append(st)
    return stats
