"""Policy-gradient losses on per-token tensors (one entry per predicted token of a micro-batch).

Every micro-batch's loss is already divided by the WHOLE training batch's denominators
(`tok_w`), so summing gradients over micro-batches gives exactly the full-batch gradient.

Objectives (`LearnerConfig.objective`):
- decoupled: ratio = pi_theta / pi_prox, clipped; weight w = pi_prox / pi_behaviour,
  tokens with w > behav_imp_weight_cap get weight 0.
- tis: ratio = pi_theta / pi_old, clipped; weight
  clamp(pi_old / pi_behaviour, tis_clip_low, tis_clip).
- ppo: ratio = pi_theta / pi_behaviour, clipped; no weight (the naive off-policy baseline).
With a negative advantage each is also bounded by clip_ratio_c (dual clip).
pi_prox (= pi_old) is the learner's policy before this optimizer step, recomputed by the learner.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from learner.config import LearnerConfig


@dataclass
class LossInputs:
    logp: torch.Tensor        # [N] current policy, with grad
    prox_logp: torch.Tensor   # [N] policy before this step (no grad)
    behav_logp: torch.Tensor  # [N] what the inference server reported
    adv: torch.Tensor         # [N] advantage of the token's sample
    mask: torch.Tensor        # [N] float 1/0: tokens the policy generated and that train
    tok_w: torch.Tensor       # [N] aggregation weight (token or sequence mean over the batch)
    fresh: torch.Tensor | None = None  # [N] 1 where the behaviour policy is the proximal one
    entropy: torch.Tensor | None = None   # [N], with grad if entropy_coef != 0
    ref_logp: torch.Tensor | None = None  # [N] reference policy (KL), no grad


def policy_loss(x: LossInputs, cfg: LearnerConfig) -> tuple[torch.Tensor, dict[str, float]]:
    """Return (loss to backward, sums of per-token statistics weighted by tok_w*mask)."""
    eps_lo = cfg.clip_eps
    eps_hi = cfg.clip_eps if cfg.clip_eps_high is None else cfg.clip_eps_high
    old = x.behav_logp if cfg.objective == "ppo" else x.prox_logp
    log_ratio = x.logp - old
    ratio = torch.exp(log_ratio)
    clipped = ratio.clamp(1.0 - eps_lo, 1.0 + eps_hi)
    pg_unclipped = -x.adv * ratio
    pg_clipped = -x.adv * clipped
    pg = torch.maximum(pg_unclipped, pg_clipped)
    clip_active = (pg_clipped > pg_unclipped).float()
    dual_active = torch.zeros_like(pg)
    if cfg.clip_ratio_c is not None:
        # dual clip (Ye et al. 2020; verl's clip_ratio_c): with a negative advantage the clipped
        # objective above is unbounded in the ratio, and after earlier minibatches' updates a token
        # the proximal policy found unlikely can have a ratio of 100s: its gradient grows with it
        bound = -x.adv * cfg.clip_ratio_c
        dual_active = ((x.adv < 0) & (pg > bound)).float()
        pg = torch.where(x.adv < 0, torch.minimum(pg, bound), pg)

    weight = importance_weight(x.prox_logp, x.behav_logp, cfg)
    per_token = pg * weight
    kl = None  # unclamped, for kl_ref
    if x.ref_logp is not None and cfg.kl_coef:
        kl = kl_k3(x.logp, x.ref_logp)
        # clamped as verl's low_var_kl: k3's gradient is exp(ref - logp), unbounded where the
        # policy has pushed a sampled token far below the reference (grad norms of 1e3-1e4 seen)
        per_token = per_token + cfg.kl_coef * (kl.clamp(max=cfg.kl_clamp) if cfg.kl_clamp else kl)
    if x.entropy is not None and cfg.entropy_coef:
        per_token = per_token - cfg.entropy_coef * x.entropy

    w = x.tok_w * x.mask
    loss = (per_token * w).sum()
    with torch.no_grad():
        m = x.mask.bool()
        stats = {
            "pg_loss": float((pg * weight * w).sum()),
            "clip_frac": float((clip_active * w).sum()),
            "dual_clip_frac": float((dual_active * w).sum()),
            "ratio_mean": float((ratio * w).sum()),
            "imp_weight_mean": float((weight * w).sum()),
            "imp_weight_max": float(weight[m].max()) if m.any() else 0.0,
            "imp_weight_zeroed_frac": float(((weight == 0).float() * w).sum()),
            # behaviour vs proximal policy on the sampled tokens, k3 of KL(behaviour || prox):
            # off-policy drift (staleness) plus trainer/inference mismatch; on the tokens the
            # current policy made (fresh) it is the mismatch alone (a bug's, not RL's)
            "behav_kl": float((kl_k3(x.behav_logp, x.prox_logp) * w).sum()),
            "weight_sum": float(w.sum()),
        }
        if x.fresh is not None:
            wf = w * x.fresh
            stats["mismatch_kl_sum"] = float((kl_k3(x.behav_logp, x.prox_logp) * wf).sum())
            stats["mismatch_k1_sum"] = float(((x.behav_logp - x.prox_logp) * wf).sum())
            stats["mismatch_weight"] = float(wf.sum())
        if kl is not None:
            stats["kl_ref"] = float((kl * w).sum())  # unclamped: how far it is
        if x.entropy is not None:
            stats["entropy"] = float((x.entropy * w).sum())
    return loss, stats


def importance_weight(prox_logp: torch.Tensor, behav_logp: torch.Tensor,
                      cfg: LearnerConfig) -> torch.Tensor:
    """The behaviour correction (no grad): see the module docstring."""
    with torch.no_grad():
        if cfg.objective == "ppo":
            return torch.ones_like(prox_logp)
        w = torch.exp(prox_logp - behav_logp)
        if cfg.objective == "tis":
            return w.clamp(min=cfg.tis_clip_low, max=cfg.tis_clip)
        if cfg.behav_imp_weight_cap is not None:
            w = torch.where(w <= cfg.behav_imp_weight_cap, w, torch.zeros_like(w))
        return w


def kl_k3(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Schulman's k3 estimator of KL(pi || pi_ref): exp(r) - r - 1 with r = ref - logp (>= 0)."""
    r = ref_logp - logp
    return torch.exp(r) - r - 1.0


def token_weights(lengths_masked: list[int], aggregation: str) -> list[float]:
    """Per-sample weight of each of its loss tokens, for the whole training batch.

    token: 1 / (all loss tokens of the batch); sequence: 1 / (n samples * that sample's loss
    tokens), so the loss is the mean over samples of each sample's token mean. Samples
    without loss tokens get weight 0 (and do not count as samples).
    """
    if aggregation == "token":
        total = sum(lengths_masked)
        return [1.0 / total if total else 0.0 for _ in lengths_masked]
    n = sum(1 for n_tok in lengths_masked if n_tok > 0)
    return [1.0 / (n * n_tok) if n_tok else 0.0 for n_tok in lengths_masked]
