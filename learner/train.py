"""One optimizer step on a batch of groups: advantages, packing, loss, accumulation, step."""

from __future__ import annotations

import time
from collections import defaultdict

import numpy as np
import torch

from learner.advantages import grpo_steps, shuffle_episode_rewards
from learner.assembly import Batch
from learner.backends.base import TrainBackend
from learner.config import LearnerConfig
from learner.losses import LossInputs, policy_loss, token_weights
from learner.packing import MicroBatch, TrainItem, make_microbatches


def batch_items(batch: Batch, cfg: LearnerConfig) -> tuple[list[TrainItem], dict[str, float]]:
    """TrainItems (one per sample, sharing the episode's advantage) and reward/advantage stats."""
    items: list[TrainItem] = []
    rewards: list[float] = []
    advs: list[float] = []
    resolved: list[float] = []
    # each sample's own reward: equal within an episode, unless the actors gave steps theirs
    batch_rewards = [[[s.reward for s in ep.samples] for ep in g.episodes] for g in batch.groups]
    if cfg.reward_shuffle:  # the control: rewards permuted across the batch
        batch_rewards = shuffle_episode_rewards(
            batch_rewards, ",".join(ep.first.sample_id for g in batch.groups for ep in g.episodes))
    for g, step_rewards in zip(batch.groups, batch_rewards, strict=True):
        step_adv = grpo_steps(step_rewards, cfg.advantage_std_norm)
        rewards += [float(np.mean(r)) for r in step_rewards]
        for ep, ep_adv in zip(g.episodes, step_adv, strict=True):
            m = ep.first.metrics
            resolved.append(float(m.get("resolved", m.get("agent/resolved", ep.first.reward > 0))))
            advs.append(float(np.mean(ep_adv)))
            for s, a in zip(ep.samples, ep_adv, strict=True):
                items.append(TrainItem(s.sample_id, s.tokens, s.loss_mask, s.rollout_logprobs, a))
    weights = token_weights([int(it.loss_mask[1:].sum()) for it in items], cfg.aggregation)
    for it, w in zip(items, weights, strict=True):
        it.tok_w = w
    adv = np.asarray(advs or [0.0])
    stats = {"reward_mean": float(np.mean(rewards or [0.0])), "resolve_rate": float(np.mean(resolved or [0.0])),
             "adv_mean": float(adv.mean()), "adv_std": float(adv.std()), "adv_min": float(adv.min()),
             "adv_max": float(adv.max()), "adv_abs_mean": float(np.abs(adv).mean())}
    return items, stats


def train_step(backend: TrainBackend, items: list[TrainItem], cfg: LearnerConfig) -> dict[str, float]:
    """Gradient accumulation over this rank's packed micro-batches, then one optimizer step.

    There is exactly one optimizer step per batch, so the proximal policy (the parameters
    before this step) is the policy of every forward here: its logprobs are the detached
    forward logprobs, which saves a second forward pass. Under several data-parallel ranks
    `items` is this rank's shard (the loss weights are the whole batch's), and the backend sums
    the gradients over ranks.
    """
    t0 = time.perf_counter()
    mbs = [mb for mb in make_microbatches(items, cfg.max_tokens_per_microbatch, cfg.packing, cfg.pad_to)
           if mb.targets.numel() > 0]
    if not mbs:
        raise ValueError(f"nothing to train: {len(items)} samples without a predicted token")

    def loss_fn(logp: torch.Tensor, ent: torch.Tensor | None, mb: MicroBatch
                ) -> tuple[torch.Tensor, dict[str, float]]:
        if ent is not None and not cfg.entropy_coef:
            ent = ent.detach()
        ref = backend.ref_logprobs(mb) if cfg.kl_coef else None
        dev = logp.device
        return policy_loss(LossInputs(
            logp=logp, prox_logp=logp.detach(), behav_logp=mb.behav_logp.to(dev), adv=mb.adv.to(dev),
            mask=mb.loss_mask.to(dev), tok_w=mb.tok_w.to(dev), entropy=ent,
            ref_logp=None if ref is None else ref.to(dev)), cfg)

    sums: dict[str, float] = defaultdict(float)
    w_max = 0.0
    for st in backend.train_microbatches(mbs, loss_fn):
        w_max = max(w_max, st.pop("imp_weight_max"))
        for k, v in st.items():
            sums[k] += v
    for mb in mbs:
        sums["tokens"] += mb.n_tokens
        sums["positions"] += mb.n_positions
        sums["loss_tokens"] += float(mb.loss_mask.sum())
    out = backend.step()
    dt = time.perf_counter() - t0
    sums.pop("weight_sum", None)
    return {**sums, **out, "imp_weight_max": w_max, "microbatches": len(mbs), "step_time_s": dt,
            "tokens_per_s": sums["tokens"] / dt if dt > 0 else 0.0, "samples": len(items)}
