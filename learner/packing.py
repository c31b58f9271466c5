"""Micro-batches of variable-length samples under a token budget.

packed: samples are laid end to end in one row (first-fit decreasing); position ids restart
at 0 for each sample and a block-diagonal causal mask keeps attention inside each sample, so
every token sees exactly what it would see alone (per-sample "varlen" attention, or a
block-diagonal causal mask: LearnerConfig.attention). padded: each sample is its own row, right-
padded to the longest of its micro-batch (the baseline the benchmark compares against).

Per-token tensors are over *prediction slots*: token i (i >= 1) of a sample is predicted by the
logits at i - 1; only tokens that carry loss (loss_mask 1) have a slot (`slot_positions`), and
slot arrays are concatenated sample after sample.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch


@dataclass
class TrainItem:
    """One sample ready to train: tokens and per-token arrays aligned with them."""

    sample_id: str
    tokens: np.ndarray         # int32 [L]
    loss_mask: np.ndarray      # uint8 [L]
    behav_logp: np.ndarray     # float32 [L] (0 where mask is 0)
    adv: float
    tok_w: float = 0.0         # aggregation weight per loss token (losses.token_weights), per minibatch
    minibatch: int = 0         # which optimizer update of a pass trains it (learner.minibatches)
    fresh: bool = False        # made by the learner's current policy: its mismatch KL is a bug's
    prox_logp: np.ndarray | None = None  # float32 [L]: the policy before the step's first update (0 off the loss)


@dataclass
class MicroBatch:
    input_ids: torch.Tensor          # [R, L] long
    position_ids: torch.Tensor       # [R, L] long
    attention_mask: torch.Tensor | None  # packed: None (see block_mask, cu_seqlens); padded: [R, L]
    rows: torch.Tensor               # [N] row of each slot's logits
    cols: torch.Tensor               # [N] column of each slot's logits
    targets: torch.Tensor            # [N] token predicted at the slot
    loss_mask: torch.Tensor          # [N] float
    behav_logp: torch.Tensor         # [N] float
    adv: torch.Tensor                # [N] float
    tok_w: torch.Tensor              # [N] float
    slot_sample: torch.Tensor        # [N] index into `items`
    prox_logp: torch.Tensor | None   # [N] float: every item's prox_logp, else None
    fresh: torch.Tensor              # [N] float 1/0: the slot's sample is TrainItem.fresh
    items: list[TrainItem] = field(default_factory=list)
    packed: bool = True
    cu_seqlens: torch.Tensor | None = None  # packed: [n+1] int32 sample boundaries in the row

    def block_mask(self) -> torch.Tensor:
        """Packed: the [1, 1, L, L] bool block-diagonal causal mask (True = attend)."""
        assert self.cu_seqlens is not None
        lens = (self.cu_seqlens[1:] - self.cu_seqlens[:-1]).long()
        seg = torch.repeat_interleave(torch.arange(len(lens)), lens)
        n = len(seg)
        causal = torch.ones(n, n, dtype=torch.bool).tril_()
        return ((seg[:, None] == seg[None, :]) & causal)[None, None]

    @property
    def n_tokens(self) -> int:
        """Real (non-pad) tokens in the micro-batch."""
        return int(sum(len(it.tokens) for it in self.items))

    @property
    def n_positions(self) -> int:
        """Positions the model computes (rows x row length), padding included."""
        return int(self.input_ids.numel())


def first_fit_decreasing(lengths: list[int], budget: int) -> list[list[int]]:
    """Bins of sample indices whose lengths sum to <= budget (a longer sample gets a bin alone)."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    bins: list[list[int]] = []
    room: list[int] = []
    for i in order:
        for b, r in enumerate(room):
            if lengths[i] <= r:
                bins[b].append(i)
                room[b] -= lengths[i]
                break
        else:
            bins.append([i])
            room.append(budget - lengths[i])
    return bins


def padded_groups(lengths: list[int], budget: int) -> list[list[int]]:
    """Consecutive samples (in arrival order) while rows x longest <= budget."""
    groups: list[list[int]] = []
    cur: list[int] = []
    longest = 0
    for i, n in enumerate(lengths):
        if cur and (len(cur) + 1) * max(longest, n) > budget:
            groups.append(cur)
            cur, longest = [], 0
        cur.append(i)
        longest = max(longest, n)
    if cur:
        groups.append(cur)
    return groups


def make_microbatches(items: list[TrainItem], max_tokens: int, packed: bool = True,
                      pad_to: str = "microbatch") -> list[MicroBatch]:
    """packed: first-fit-decreasing rows. Padded: pad_to "microbatch" pads each micro-batch to
    its own longest sample; "batch" pads every sample to the longest of the whole batch
    (fixed shapes, rows = max_tokens // longest)."""
    lengths = [len(it.tokens) for it in items]
    if packed:
        return [_packed([items[i] for i in b]) for b in first_fit_decreasing(lengths, max_tokens)]
    if pad_to == "batch":
        longest = max(lengths, default=1)
        rows = max(1, max_tokens // longest)
        return [_padded(items[i:i + rows], longest) for i in range(0, len(items), rows)]
    return [_padded([items[i] for i in g]) for g in padded_groups(lengths, max_tokens)]


def slot_positions(it: TrainItem) -> np.ndarray:
    """The tokens of a sample that carry loss (mask 1), as indices into tokens[1:]: the only
    prediction slots the learner computes (a prompt's logits would be multiplied by 0)."""
    return np.flatnonzero(it.loss_mask[1:])


def _slots(items: list[TrainItem], starts: list[tuple[int, int]]) -> dict[str, Any]:
    rows, cols, tgt, mask, behav, adv, w, idx, prox, fresh = [], [], [], [], [], [], [], [], [], []
    has_prox = bool(items) and all(it.prox_logp is not None for it in items)
    for k, (it, (r, off)) in enumerate(zip(items, starts, strict=True)):
        pos = slot_positions(it)
        n = len(pos)
        if n == 0:
            continue
        rows.append(np.full(n, r))
        cols.append(off + pos)
        tgt.append(it.tokens[1:][pos])
        mask.append(it.loss_mask[1:][pos])
        behav.append(it.behav_logp[1:][pos])
        adv.append(np.full(n, it.adv, dtype=np.float32))
        w.append(np.full(n, it.tok_w, dtype=np.float32))
        idx.append(np.full(n, k))
        fresh.append(np.full(n, float(it.fresh), dtype=np.float32))
        if has_prox:
            assert it.prox_logp is not None
            prox.append(it.prox_logp[1:][pos])

    def cat(xs: list[np.ndarray], dtype: torch.dtype) -> torch.Tensor:
        if not xs:
            return torch.zeros(0, dtype=dtype)
        return torch.from_numpy(np.concatenate(xs).astype(np.float64 if dtype.is_floating_point
                                                          else np.int64)).to(dtype)

    return {"rows": cat(rows, torch.long), "cols": cat(cols, torch.long),
            "targets": cat(tgt, torch.long), "loss_mask": cat(mask, torch.float32),
            "behav_logp": cat(behav, torch.float32), "adv": cat(adv, torch.float32),
            "tok_w": cat(w, torch.float32), "slot_sample": cat(idx, torch.long),
            "prox_logp": cat(prox, torch.float32) if has_prox else None, "fresh": cat(fresh, torch.float32)}


def _packed(items: list[TrainItem]) -> MicroBatch:
    total = sum(len(it.tokens) for it in items)
    ids = np.zeros(total, dtype=np.int64)
    pos = np.zeros(total, dtype=np.int64)
    starts = []
    cu = [0]
    off = 0
    for it in items:
        n = len(it.tokens)
        ids[off:off + n] = it.tokens
        pos[off:off + n] = np.arange(n)
        starts.append((0, off))
        off += n
        cu.append(off)
    return MicroBatch(input_ids=torch.from_numpy(ids)[None], position_ids=torch.from_numpy(pos)[None],
                      attention_mask=None, items=items, packed=True,
                      cu_seqlens=torch.tensor(cu, dtype=torch.int32), **_slots(items, starts))


def _padded(items: list[TrainItem], pad_to: int | None = None) -> MicroBatch:
    longest = max(max(len(it.tokens) for it in items), pad_to or 0)
    ids = np.zeros((len(items), longest), dtype=np.int64)
    att = np.zeros((len(items), longest), dtype=np.int64)
    for r, it in enumerate(items):
        ids[r, :len(it.tokens)] = it.tokens
        att[r, :len(it.tokens)] = 1
    pos = np.broadcast_to(np.arange(longest), (len(items), longest)).copy()
    return MicroBatch(input_ids=torch.from_numpy(ids), position_ids=torch.from_numpy(pos),
                      attention_mask=torch.from_numpy(att), items=items, packed=False,
                      **_slots(items, [(r, 0) for r in range(len(items))]))
