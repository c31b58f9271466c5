"""One training step on a batch of groups: advantages, minibatches, the proximal pass, the
optimizer updates, and the diagnostics people read to judge whether RL is working.

A step is `learner.epochs` passes over the batch, each pass `learner.minibatches` optimizer
updates (minibatches of whole groups); gradients accumulate over a minibatch's packed
micro-batches. The proximal policy is the parameters before the step: on the first update's
minibatch its logprobs are that update's own forward's, detached (nothing has moved yet); on the
other minibatches a no-grad pass before the first update computes them, and the clip acts
against them from the second update on. One policy version is published per step (learner.loop).
"""

from __future__ import annotations

import time
from collections import defaultdict

import numpy as np
import torch

from learner.advantages import grpo_steps, shuffle_episode_rewards
from learner.assembly import Batch
from learner.backends.base import LossFn, TrainBackend
from learner.config import LearnerConfig
from learner.losses import LossInputs, policy_loss, token_weights
from learner.packing import MicroBatch, TrainItem, make_microbatches, slot_positions
from learner.spike_clip import SpikeClip
from learner.trust_region import constrain, kl_sum

# statistics of a step that are means over its optimizer updates: each update's per-token
# statistics are weighted sums adding up to a mean over its minibatch (over all ranks)
PER_UPDATE = ("loss", "pg_loss", "clip_frac", "dual_clip_frac", "ratio_mean", "imp_weight_mean", "imp_weight_zeroed_frac",
              "kl_ref", "entropy", "behav_kl")


def split_minibatches(group_sizes: list[int], n: int) -> list[int]:
    """The minibatch of each group: `n` minibatches (fewer when there are fewer groups) about
    equal in episodes, largest group first to the lightest minibatch (ties: the lowest index)."""
    k = max(1, min(n, len(group_sizes)))
    load = [0] * k
    out = [0] * len(group_sizes)
    for g in sorted(range(len(group_sizes)), key=lambda i: (-group_sizes[i], i)):
        m = min(range(k), key=lambda j: (load[j], j))
        out[g] = m
        load[m] += group_sizes[g]
    return out


def set_token_weights(items: list[TrainItem], aggregation: str) -> None:
    """Each item's loss weight per token, normalised within its minibatch (one optimizer update
    is a mean over its minibatch; with one minibatch, over the whole batch)."""
    by_mb: dict[int, list[TrainItem]] = defaultdict(list)
    for it in items:
        by_mb[it.minibatch].append(it)
    for part in by_mb.values():
        weights = token_weights([int(it.loss_mask[1:].sum()) for it in part], aggregation)
        for it, w in zip(part, weights, strict=True):
            it.tok_w = w


def batch_items(batch: Batch, cfg: LearnerConfig) -> tuple[list[TrainItem], dict[str, float]]:
    """TrainItems (one per sample, sharing the episode's advantage, each in its group's
    minibatch) and the batch's reward/advantage statistics."""
    items: list[TrainItem] = []
    rewards: list[float] = []
    advs: list[float] = []
    resolved: list[float] = []
    zero_spread = 0
    # each sample's own reward: equal within an episode, unless the actors gave steps theirs
    batch_rewards = [[[s.reward for s in ep.samples] for ep in g.episodes] for g in batch.groups]
    if cfg.reward_shuffle:  # the control: rewards permuted across the batch
        batch_rewards = shuffle_episode_rewards(
            batch_rewards, ",".join(ep.first.sample_id for g in batch.groups for ep in g.episodes))
    groups_mb = split_minibatches([len(g.episodes) for g in batch.groups], cfg.minibatches)
    for g, step_rewards, mb in zip(batch.groups, batch_rewards, groups_mb, strict=True):
        step_adv = grpo_steps(step_rewards, cfg.advantage_std_norm)
        ep_rewards = [float(np.mean(r)) for r in step_rewards]
        rewards += ep_rewards
        # a group whose episodes all scored the same has no advantage: no signal (DAPO drops them)
        zero_spread += int(max(ep_rewards, default=0.0) - min(ep_rewards, default=0.0) < 1e-9)
        for ep, ep_adv in zip(g.episodes, step_adv, strict=True):
            m = ep.first.metrics
            resolved.append(float(m.get("resolved", m.get("agent/resolved", ep.first.reward > 0))))
            advs.append(float(np.mean(ep_adv)))
            for s, a in zip(ep.samples, ep_adv, strict=True):
                items.append(TrainItem(s.sample_id, s.tokens, s.loss_mask, s.rollout_logprobs, a,
                                       minibatch=mb, fresh=s.policy_version == batch.version))
    set_token_weights(items, cfg.aggregation)
    adv = np.asarray(advs or [0.0])
    stats = {"reward_mean": float(np.mean(rewards or [0.0])), "resolve_rate": float(np.mean(resolved or [0.0])),
             "adv_mean": float(adv.mean()), "adv_std": float(adv.std()), "adv_min": float(adv.min()),
             "adv_max": float(adv.max()), "adv_abs_mean": float(np.abs(adv).mean()),
             "zero_spread_groups_frac": zero_spread / len(batch.groups) if batch.groups else 0.0}
    return items, stats


def by_minibatch(items: list[TrainItem]) -> list[list[TrainItem]]:
    """This rank's items per minibatch, in minibatch order (every rank holds every minibatch:
    learner.trainer.shard_items gives an idle sample where a shard would be empty)."""
    parts: dict[int, list[TrainItem]] = defaultdict(list)
    for it in items:
        parts[it.minibatch].append(it)
    return [parts[k] for k in sorted(parts)]


def _microbatches(items: list[TrainItem], cfg: LearnerConfig) -> list[MicroBatch]:
    return [mb for mb in make_microbatches(items, cfg.max_tokens_per_microbatch, cfg.packing, cfg.pad_to)
            if mb.targets.numel() > 0]


def keep_prox(mb: MicroBatch, lp: torch.Tensor) -> None:
    """The proximal policy's per-slot logprobs `lp` on the micro-batch (prox_logp) and its items
    (for a backend that re-lays a micro-batch out from its items)."""
    if lp.numel() != mb.targets.numel():
        raise ValueError(f"proximal logprobs for {lp.numel()} slots, the micro-batch has {mb.targets.numel()}")
    mb.prox_logp = lp
    off = 0
    for it in mb.items:  # slots in sample order, one per token that carries loss
        pos = slot_positions(it)
        it.prox_logp = np.zeros(len(it.tokens), dtype=np.float32)
        it.prox_logp[1:][pos] = lp[off:off + len(pos)].numpy()
        off += len(pos)


def proximal_pass(backend: TrainBackend, mbs: list[MicroBatch]) -> None:
    """The policy before the step's first update (no grad), on each micro-batch."""
    for mb in mbs:
        with torch.no_grad():
            keep_prox(mb, backend.logprobs(mb, grad=False, with_entropy=False)[0].detach().float().cpu())


def update_kl(backend: TrainBackend, mbs: list[MicroBatch], n_minibatches: int, known: float | None = None) -> float:
    """How far the step's updates moved the policy on the batch's sampled tokens: k3 of
    KL(prox || new) after the last update, weighted as the loss is (this rank's share). `known`:
    the last minibatch's, already measured at the final parameters and summed over the ranks
    (the trust region's), in place of a pass over it (`mbs` are then the other minibatches')."""
    total = known / n_minibatches if known is not None and backend.dp_rank == 0 else 0.0
    return total + kl_sum(backend, mbs) / n_minibatches


def train_step(backend: TrainBackend, items: list[TrainItem], cfg: LearnerConfig,
               per_update: list[dict[str, float]] | None = None, spikes: SpikeClip | None = None
               ) -> dict[str, float]:
    """This rank's share of one step: `epochs` x (its minibatches) optimizer updates. Under
    several data-parallel ranks `items` is this rank's shard (the loss weights are the whole
    minibatch's) and the backend sums the gradients over ranks; the statistics are this rank's
    sums, merged over ranks by learner.trainer and averaged over updates by `finish_stats`.
    `per_update`, when given, receives each update's statistics (tests). `spikes`: the rank's
    learner.spike_clip state, carried from step to step."""
    t0 = time.perf_counter()
    parts = by_minibatch(items)
    updates = len(parts) * cfg.epochs
    single = updates == 1
    mbs_of = [_microbatches(p, cfg) for p in parts]
    if not any(mbs_of):
        raise ValueError(f"nothing to train: {len(items)} samples without a predicted token")
    every_mb = [mb for mbs in mbs_of for mb in mbs]
    trust = cfg.max_update_kl is not None
    whole = trust and cfg.max_update_kl_scope == "batch"  # the region's KL is the whole batch's
    # the proximal policy's logprobs, before any update moves it: the first update's forward
    # gives them on its own minibatch, where the backend's loss sees each of the rank's
    # micro-batches (not on a pipeline stage before the last); a no-grad pass on the others
    own = backend.loss_sees_every_microbatch
    keep = not single or cfg.update_kl or trust  # a later pass reads the proximal logprobs
    if keep:
        proximal_pass(backend, [mb for mbs in (mbs_of[1:] if own else mbs_of) for mb in mbs])

    def loss_for(mbs: list[MicroBatch]) -> LossFn:
        order = iter(mbs)  # loss_fn sees the rank's micro-batches in order (maybe re-laid out)

        def loss_fn(logp: torch.Tensor, ent: torch.Tensor | None, mb: MicroBatch
                    ) -> tuple[torch.Tensor, dict[str, float]]:
            orig = next(order) if own else mb
            return micro_loss(logp, ent, mb, orig)

        return loss_fn

    def micro_loss(logp: torch.Tensor, ent: torch.Tensor | None, mb: MicroBatch, orig: MicroBatch
                   ) -> tuple[torch.Tensor, dict[str, float]]:
        dev = logp.device
        if single or orig.prox_logp is None:  # the step's first update: nothing has moved yet
            prox = logp.detach()
            if keep and orig.prox_logp is None:
                keep_prox(orig, prox.float().cpu())
        else:
            prox = orig.prox_logp.to(dev)
        if ent is not None and not cfg.entropy_coef:
            ent = ent.detach()
        ref = ref_of(mb, orig, logp.numel()) if cfg.kl_coef else None
        return policy_loss(LossInputs(
            logp=logp, prox_logp=prox, behav_logp=mb.behav_logp.to(dev), adv=mb.adv.to(dev),
            mask=mb.loss_mask.to(dev), tok_w=mb.tok_w.to(dev), fresh=mb.fresh.to(dev), entropy=ent,
            ref_logp=None if ref is None else ref.to(dev)), cfg)

    # the frozen reference's logprobs of each micro-batch, the same in every epoch: one forward
    # of the reference per step, not one per epoch
    refs: dict[int, torch.Tensor] = {}

    def ref_of(mb: MicroBatch, orig: MicroBatch, n: int) -> torch.Tensor | None:
        got = refs.get(id(orig))
        if got is None or got.numel() != n:  # (a backend that lays a micro-batch out anew)
            got = backend.ref_logprobs(mb)
            if got is not None and cfg.epochs > 1:
                refs[id(orig)] = got
        return got

    sums: dict[str, float] = defaultdict(float)
    w_max = 0.0
    grad_norms: list[float] = []
    spiked = backtracked = 0
    alpha_min = 1.0
    last_kl: float | None = None  # the trust region's last KL (its scope's), at the final parameters
    lr = 0.0
    for _ in range(cfg.epochs):
        for mbs in mbs_of:
            upd: dict[str, float] = defaultdict(float)
            for st in backend.train_microbatches(mbs, loss_for(mbs)):
                w_max = max(w_max, st.pop("imp_weight_max"))
                st.pop("weight_sum", None)
                for k, v in st.items():
                    upd[k] += v
            before = backend.params_snapshot() if trust else None
            out = backend.step(spikes.threshold() if spikes is not None else None)
            if before is not None:  # learner.max_update_kl: scale the update back into the region
                assert cfg.max_update_kl is not None
                alpha, last_kl = constrain(backend, before, every_mb if whole else mbs, cfg.max_update_kl,
                                           cfg.max_update_kl_tries, len(parts) if whole else 1)
                out["update_kl_region"] = last_kl
                backtracked += alpha < 1.0
                alpha_min = min(alpha_min, alpha)
                del before
            grad_norms.append(out["grad_norm"])
            spiked += spikes is not None and spikes.observe(out["grad_norm"])
            lr = out["lr"]
            for k, v in upd.items():
                sums[k] += v
            if per_update is not None:
                per_update.append({**upd, **out})
    if cfg.update_kl and whole:  # the region's last measure: the whole batch at the final parameters
        assert last_kl is not None
        sums["update_kl"] = last_kl if backend.dp_rank == 0 else 0.0  # (summed over ranks already)
    elif cfg.update_kl:
        measured = [mb for mbs in (mbs_of[:-1] if last_kl is not None else mbs_of) for mb in mbs]
        sums["update_kl"] = update_kl(backend, measured, len(parts), last_kl)
    for mb in every_mb:
        sums["tokens"] += mb.n_tokens
        sums["positions"] += mb.n_positions
        sums["loss_tokens"] += float((mb.loss_mask * (mb.tok_w > 0)).sum())  # not an idle rank's
    dt = time.perf_counter() - t0
    return {**sums, "grad_norm": float(np.mean(grad_norms)), "grad_norm_max": float(max(grad_norms)),
            "spike_clipped": float(spiked),
            **({"update_backtracked": float(backtracked), "update_alpha_min": alpha_min} if trust else {}),
            "lr": lr, "imp_weight_max": w_max, "updates": float(updates),
            "microbatches": float(len(every_mb) * cfg.epochs), "step_time_s": dt,
            "tokens_per_s": sums["tokens"] / dt if dt > 0 else 0.0, "samples": float(len(items))}


def finish_stats(m: dict[str, float]) -> dict[str, float]:
    """Per-update sums (over every rank) as means over the step's updates; the mismatch KL as a
    mean over the fresh tokens (made by the learner's current policy; none: not measured)."""
    n = max(1.0, m.get("updates", 1.0))
    out = {k: (v / n if k in PER_UPDATE else v) for k, v in m.items()
           if k not in ("mismatch_kl_sum", "mismatch_k1_sum", "mismatch_weight")}
    fresh = m.get("mismatch_weight", 0.0)
    out["fresh_frac"] = fresh / n
    if fresh > 0:
        out["mismatch_kl"] = m["mismatch_kl_sum"] / fresh
        out["mismatch_k1"] = m["mismatch_k1_sum"] / fresh
    return out
