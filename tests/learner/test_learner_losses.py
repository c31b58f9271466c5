"""The loss on a hand-built batch equals the formula, computed here token by token."""

from __future__ import annotations

import math

import pytest
import torch

from learner.config import LearnerConfig
from learner.losses import LossInputs, policy_loss, token_weights

# two sequences: 3 and 4 tokens; token 2 of seq 0 is not a loss token
SEQ = [0, 0, 0, 1, 1, 1, 1]
LOGP = [-1.0, -0.5, -2.0, -0.3, -1.2, -0.9, -3.0]
PROX = [-1.1, -0.9, -1.0, -0.3, -1.0, -0.7, -1.5]
BEHAV = [-1.2, -0.4, -1.0, -2.5, -1.0, -0.6, -1.4]
ADV = [1.0, 1.0, 1.0, -0.5, -0.5, -0.5, -0.5]
MASK = [1, 1, 0, 1, 1, 1, 1]


def reference(cfg: LearnerConfig) -> tuple[float, list[float]]:
    """Loss and d loss / d logp from the definitions (AReaL decoupled PPO, slime TIS, PPO)."""
    lo = cfg.clip_eps
    hi = cfg.clip_eps if cfg.clip_eps_high is None else cfg.clip_eps_high
    per_tok, dper = [], []
    for lp, px, bh, a in zip(LOGP, PROX, BEHAV, ADV, strict=True):
        old = bh if cfg.objective == "ppo" else px
        r = math.exp(lp - old)
        unclipped, clipped = -a * r, -a * min(max(r, 1 - lo), 1 + hi)
        pg = max(unclipped, clipped)
        dpg = -a * r if unclipped >= clipped else 0.0  # the clipped branch has no gradient
        if cfg.clip_ratio_c is not None and a < 0 and pg > -a * cfg.clip_ratio_c:
            pg, dpg = -a * cfg.clip_ratio_c, 0.0  # dual clip: bounded, no gradient
        if cfg.objective == "ppo":
            w = 1.0
        elif cfg.objective == "tis":
            w = min(max(math.exp(px - bh), cfg.tis_clip_low), cfg.tis_clip)
        else:
            w = math.exp(px - bh)
            if cfg.behav_imp_weight_cap is not None and w > cfg.behav_imp_weight_cap:
                w = 0.0
        per_tok.append(pg * w)
        dper.append(dpg * w)
    if cfg.aggregation == "token":
        n = sum(MASK)
        coef = [m / n for m in MASK]
    else:
        lens = {s: sum(m for m, q in zip(MASK, SEQ, strict=True) if q == s) for s in set(SEQ)}
        coef = [m / (len(lens) * lens[s]) for m, s in zip(MASK, SEQ, strict=True)]
    loss = sum(c * t for c, t in zip(coef, per_tok, strict=True))
    return loss, [c * d for c, d in zip(coef, dper, strict=True)]


@pytest.mark.parametrize("objective", ["decoupled", "tis", "ppo"])
@pytest.mark.parametrize("aggregation", ["token", "sequence"])
def test_loss_matches_formula(objective: str, aggregation: str) -> None:
    cfg = LearnerConfig(objective=objective, aggregation=aggregation, clip_eps=0.2, clip_eps_high=0.28,
                        behav_imp_weight_cap=5.0, tis_clip=2.0, tis_clip_low=0.5)
    per_seq = token_weights([sum(m for m, q in zip(MASK, SEQ, strict=True) if q == s) for s in (0, 1)],
                            aggregation)
    logp = torch.tensor(LOGP, dtype=torch.float64, requires_grad=True)
    x = LossInputs(logp=logp, prox_logp=torch.tensor(PROX, dtype=torch.float64),
                   behav_logp=torch.tensor(BEHAV, dtype=torch.float64),
                   adv=torch.tensor(ADV, dtype=torch.float64),
                   mask=torch.tensor(MASK, dtype=torch.float64),
                   tok_w=torch.tensor([per_seq[s] for s in SEQ], dtype=torch.float64))
    loss, stats = policy_loss(x, cfg)
    loss.backward()
    want, grad = reference(cfg)
    assert float(loss) == pytest.approx(want, abs=1e-12)
    assert logp.grad.tolist() == pytest.approx(grad, abs=1e-12)
    assert 0.0 < stats["clip_frac"] < 1.0  # this batch clips some tokens and not others


def test_cap_masks_tokens_and_tis_truncates() -> None:
    """Token 3 has pi_prox/pi_behaviour = e^2.2 ≈ 9: masked by the AReaL cap, truncated by TIS."""
    base = dict(clip_eps=0.2, tis_clip=2.0, tis_clip_low=0.0)
    x = dict(logp=torch.tensor([-0.3]), prox_logp=torch.tensor([-0.3]), behav_logp=torch.tensor([-2.5]),
             adv=torch.tensor([-0.5]), mask=torch.tensor([1.0]), tok_w=torch.tensor([1.0]))
    dec, st = policy_loss(LossInputs(**x), LearnerConfig(objective="decoupled", behav_imp_weight_cap=5.0, **base))
    assert float(dec) == 0.0 and st["imp_weight_zeroed_frac"] == 1.0
    tis, _ = policy_loss(LossInputs(**x), LearnerConfig(objective="tis", **base))
    assert float(tis) == pytest.approx(0.5 * 1.0 * 2.0)


def test_kl_and_entropy_terms() -> None:
    cfg = LearnerConfig(objective="ppo", kl_coef=0.1, entropy_coef=0.01)
    logp = torch.tensor([-1.0, -2.0])
    ref = torch.tensor([-1.5, -1.0])
    ent = torch.tensor([2.0, 3.0])
    x = LossInputs(logp=logp, prox_logp=logp, behav_logp=logp, adv=torch.zeros(2), mask=torch.ones(2),
                   tok_w=torch.full((2,), 0.5), entropy=ent, ref_logp=ref)
    loss, st = policy_loss(x, cfg)
    kl = [math.exp(r - lp) - (r - lp) - 1 for lp, r in zip([-1.0, -2.0], [-1.5, -1.0], strict=True)]
    want = 0.5 * sum(0.1 * k - 0.01 * e for k, e in zip(kl, [2.0, 3.0], strict=True))
    assert float(loss) == pytest.approx(want, abs=1e-6)
    assert st["kl_ref"] == pytest.approx(sum(kl) / 2, abs=1e-6)
    assert st["entropy"] == pytest.approx(2.5)


def test_dual_clip_bounds_a_negative_advantage_token_whose_ratio_ran_away() -> None:
    """After earlier minibatches' updates a token the proximal policy found unlikely (p 1e-3)
    can be likely (p 0.5): with a negative advantage the PPO clip leaves its loss and gradient
    growing with the ratio (~500); the dual clip bounds the loss at c|A| with no gradient, and
    leaves positive advantages and ratios below c as they were."""
    logp = torch.tensor([math.log(0.5), math.log(0.5), math.log(0.5)], requires_grad=True)
    prox = torch.tensor([math.log(1e-3), math.log(1e-3), math.log(0.4)])
    adv = torch.tensor([-1.0, 1.0, -1.0])

    def run(c: float | None) -> tuple[torch.Tensor, list[float], dict[str, float]]:
        lp = logp.detach().clone().requires_grad_(True)
        x = LossInputs(logp=lp, prox_logp=prox, behav_logp=prox, adv=adv, mask=torch.ones(3),
                       tok_w=torch.ones(3))
        loss, st = policy_loss(x, LearnerConfig(objective="decoupled", clip_ratio_c=c))
        loss.backward()
        return loss, lp.grad.tolist(), st

    _, g_off, _ = run(None)
    assert g_off[0] == pytest.approx(500.0, rel=1e-4)  # -A * ratio: the runaway gradient
    loss, g_on, st = run(3.0)
    assert g_on[0] == 0.0 and st["dual_clip_frac"] == 1.0
    assert g_on[1:] == pytest.approx(g_off[1:])  # A > 0 (clipped by PPO) and ratio 1.25 < c: unchanged
    assert float(loss) == pytest.approx(3.0 + (-1.0 * 1.2) + 0.5 / 0.4)


def test_kl_clamp_bounds_k3_where_the_policy_left_the_reference() -> None:
    """k3's gradient is 1 - exp(ref - logp): a sampled token the policy pushed to p 1e-6 where the
    reference had 0.9 gives ~1e6; clamped at kl_clamp (verl's low_var_kl) there is no gradient,
    and kl_ref still reports the unclamped value."""
    ref = torch.tensor([math.log(0.9), math.log(0.5)])
    for clamp, want0 in ((None, 1 - 0.9 / 1e-6), (10.0, 0.0)):
        lp = torch.tensor([math.log(1e-6), math.log(0.4)], requires_grad=True)
        x = LossInputs(logp=lp, prox_logp=lp.detach(), behav_logp=lp.detach(), adv=torch.zeros(2),
                       mask=torch.ones(2), tok_w=torch.ones(2), ref_logp=ref)
        loss, st = policy_loss(x, LearnerConfig(kl_coef=1.0, kl_clamp=clamp))
        loss.backward()
        assert lp.grad is not None
        assert float(lp.grad[0]) == pytest.approx(want0, rel=1e-3, abs=1e-6)
        assert float(lp.grad[1]) == pytest.approx(1 - 0.5 / 0.4, rel=1e-4)
        k3 = 0.9 / 1e-6 - math.log(0.9 / 1e-6) - 1 + 0.5 / 0.4 - math.log(0.5 / 0.4) - 1
        assert st["kl_ref"] == pytest.approx(k3, rel=1e-4)
