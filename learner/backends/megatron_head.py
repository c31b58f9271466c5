"""The logprob head on vocab-parallel logits: each tensor-parallel rank keeps its own slice of the
vocabulary, and only per-token numbers cross ranks.

The distribution is inference.logprobs' convention, softmax(logits / T) over the model's real
vocabulary (T from `logprob_temperature`: the rollout temperature, 1 for greedy or
SGLANG_RETURN_ORIGINAL_LOGPROB). Megatron pads the vocabulary to a multiple of 128 x TP; those
columns never enter the softmax (the server's distribution has no such tokens).

The scheme is megatron-core's `vocab_parallel_cross_entropy` (all-reduce the max, then the sum of
exp and the target's logit), with three things it does not do: the temperature, the padded
columns cut, and the entropy with its gradient. With z = logits / T, m = max z, S = sum exp(z - m):

    logprob  = z_target - m - log S
    entropy  = log S - E[z - m]                     (E under p = exp(z - m) / S)
    d logprob / dz_j = [j = target] - p_j
    d entropy / dz_j = -p_j ((z_j - m) - E[z - m])

so the backward needs only the per-token m, log S and E[z - m], and recomputes p from the saved
logits. Tokens are processed in chunks (rows of at most CHUNK_ELEMENTS logits), so beside the
logits themselves and their gradient nothing of size tokens x vocabulary is ever allocated: the
fp32 temporaries are a chunk's. The input logits are read, never written.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from inference.logprobs import logprob_temperature

# fp32 temporaries of a chunk are a few times this many elements (64 MiB each)
CHUNK_ELEMENTS = 1 << 24


def vocab_parallel_logprobs(logits: torch.Tensor, targets: torch.Tensor, *, vocab: int,
                            temperature: float, with_entropy: bool, slots: torch.Tensor | None = None,
                            group: Any = None, chunk_elements: int | None = None
                            ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """logits [M, V/tp]: this rank's vocabulary slice (rank r holds global entries
    [r V/tp, (r+1) V/tp)), any float dtype. `slots` [N] picks the rows that predict `targets`
    [N] (global token ids), all M rows when None. `vocab`: the real vocabulary, without
    Megatron's padding. `group`: the tensor-parallel group (None: one rank). `chunk_elements`:
    logits per chunk (CHUNK_ELEMENTS when None). Returns
    (logprobs [N], entropy [N] or None) in fp32, equal on every rank of the group, with
    gradients to `logits` for both."""
    t = logprob_temperature(temperature)
    rank = dist.get_rank(group) if group is not None else 0
    width = logits.shape[-1]
    n_real = max(0, min(width, vocab - rank * width))  # this slice's entries that are not padding
    rows = max(1, (chunk_elements or CHUNK_ELEMENTS) // max(1, width))
    out = _Head.apply(logits, targets, slots, rank * width, n_real, t, with_entropy, group, rows)
    return (out[0], out[1]) if with_entropy else (out[0], None)


def _chunks(n: int, rows: int) -> list[slice]:
    return [slice(i, min(n, i + rows)) for i in range(0, n, rows)]


def _rows(logits: torch.Tensor, slots: torch.Tensor | None, c: slice) -> torch.Tensor:
    """A chunk of the slots' logits: a view without `slots`, else a fresh copy."""
    return logits[c] if slots is None else logits.index_select(0, slots[c])


def _z(x: torch.Tensor, fresh: bool, n_real: int, t: float) -> torch.Tensor:
    """logits / T of a chunk, real columns only, as an fp32 tensor this head may overwrite."""
    z = x[:, :n_real]
    if z.dtype != torch.float32:
        z = z.float()
    elif not fresh:
        z = z.clone()
    return z.div_(t) if t != 1.0 else z


class _Head(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, logits: torch.Tensor, targets: torch.Tensor, slots: torch.Tensor | None,
                start: int, n_real: int, t: float, with_entropy: bool, group: Any,
                rows: int) -> tuple[torch.Tensor, ...]:
        n = logits.shape[0] if slots is None else slots.numel()
        dev = logits.device
        targets = targets.to(dev).long()
        chunks = _chunks(n, rows)
        # the max first, so every rank subtracts the same one before exponentiating
        m = torch.full((n,), float("-inf"), device=dev)
        if n_real:
            for c in chunks:  # max(x) / T is max(x / T) exactly: both roundings are monotone
                m[c] = _rows(logits, slots, c)[:, :n_real].amax(-1).float() / t
        if group is not None:
            dist.all_reduce(m, op=dist.ReduceOp.MAX, group=group)
        # then the sums, in one all-reduce: sum exp(z - m), sum exp(z - m)(z - m), z_target - m
        local = targets - start
        mine = (local >= 0) & (local < n_real)
        sums = torch.zeros(3, n, device=dev)
        if n_real:
            for c in chunks:
                d = _z(_rows(logits, slots, c), slots is not None, n_real, t).sub_(m[c, None])
                sums[2, c] = torch.where(mine[c], d.gather(-1, local[c].clamp(0, n_real - 1)[:, None])[:, 0], 0.0)
                e = d.exp()
                sums[0, c] = e.sum(-1)
                if with_entropy:
                    sums[1, c] = e.mul_(d).sum(-1)
                del d, e
        if group is not None:
            dist.all_reduce(sums, group=group)
        log_s = sums[0].log()
        mean_d = sums[1] / sums[0]  # E[z - m]
        lp = sums[2] - log_s
        ctx.save_for_backward(logits, targets, slots, m, log_s, mean_d)
        ctx.start, ctx.n_real, ctx.t, ctx.rows = start, n_real, t, rows
        ctx.set_materialize_grads(False)  # an unused entropy takes no work in backward
        return (lp, log_s - mean_d) if with_entropy else (lp,)

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor | None) -> tuple[torch.Tensor | None, ...]:
        logits, targets, slots, m, log_s, mean_d = ctx.saved_tensors
        g_lp = grads[0]
        g_ent = grads[1] if len(grads) > 1 else None
        n_real, t = ctx.n_real, ctx.t
        grad = torch.zeros_like(logits)  # padded columns and rows without a slot: no gradient
        local = targets - ctx.start
        mine = (local >= 0) & (local < n_real)
        n = logits.shape[0] if slots is None else slots.numel()
        for c in _chunks(n, ctx.rows) if n_real else []:
            # dz_j = -p_j (g_lp + g_ent (d_j - E[d])) + g_lp [j = target], d = z - m, in two
            # chunk-sized fp32 tensors: d becomes the bracket, p (whole rows, for index_copy_)
            # the gradient
            d = _z(_rows(logits, slots, c), slots is not None, n_real, t).sub_(m[c, None])
            g_all = torch.zeros(d.shape[0], logits.shape[1], device=d.device)
            g = g_all[:, :n_real]
            g.copy_(d).sub_(log_s[c, None]).exp_()  # p
            if g_ent is not None:
                d.sub_(mean_d[c, None]).mul_(g_ent[c, None])
                if g_lp is not None:
                    d.add_(g_lp[c, None])
                g.mul_(d).neg_()
            else:
                assert g_lp is not None
                g.mul_(-g_lp[c, None])
            del d
            if g_lp is not None:
                at = mine[c].nonzero()[:, 0]
                g[at, local[c][at]] += g_lp[c][at]
            if t != 1.0:
                g.div_(t)
            if slots is None:
                grad[c] = g_all
            else:
                grad.index_copy_(0, slots[c], g_all.to(grad.dtype))
            del g, g_all
        return grad, None, None, None, None, None, None, None, None
