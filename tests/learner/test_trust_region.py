"""learner.max_update_kl: an update that moves the policy past the bound is scaled back into it
(TRPO's backtracking), one within it is kept whole; over the whole batch (the default scope) the
step ends within the bound on every minibatch together, where the per-minibatch scope leaves the
other minibatches unwatched; Megatron refuses the setting by name instead of ignoring it."""

from __future__ import annotations

import math

import pytest
from test_learner_train import many_groups_batch

from learner.backends.torch_backend import TorchBackend
from learner.config import LearnerConfig
from learner.train import batch_items, finish_stats, train_step


def _step(model_dir, bound: float | None, tries: int = 6, scope: str = "batch", epochs: int = 1,
          ) -> tuple[float, dict[str, float], list[dict]]:
    """One learner step (2 updates an epoch, a large lr so they move far) from the same weights:
    how far the parameters moved, the step's statistics, each update's."""
    cfg = LearnerConfig(lr=3e-2, minibatches=2, epochs=epochs, max_update_kl=bound, max_update_kl_tries=tries,
                        max_update_kl_scope=scope)
    items, _ = batch_items(many_groups_batch(model_dir), cfg)
    backend = TorchBackend(cfg, model_dir)
    before = {n: t.clone() for n, t in backend.named_tensors()}
    per: list[dict] = []
    m = finish_stats(train_step(backend, items, cfg, per_update=per))
    moved = math.sqrt(sum(float(((t - before[n]) ** 2).sum()) for n, t in backend.named_tensors()))
    return moved, m, per


def test_an_update_past_the_bound_is_scaled_back_into_it(small_model_dir) -> None:
    # each update on its own minibatch (the scope whose updates do not see each other's)
    free_moved, free, per_free = _step(small_model_dir, 1e9, scope="minibatch")  # measured, never binding
    kls = [u["update_kl_region"] for u in per_free]
    assert free["update_backtracked"] == 0 and free["update_alpha_min"] == 1.0
    assert min(kls) > 0
    bound = max(kls) / 8
    moved, m, per = _step(small_model_dir, bound, scope="minibatch")
    assert m["update_backtracked"] >= 1, per
    assert all(u["update_kl_region"] <= bound for u in per), (bound, per)
    assert 0.0 < m["update_alpha_min"] < 1.0  # scaled, not undone
    assert 0 < moved < free_moved
    # the first update's gradient is the same: the region acts on the update, not the gradient
    assert per[0]["grad_norm"] == pytest.approx(per_free[0]["grad_norm"], rel=1e-4)


def test_an_update_that_cannot_be_brought_within_is_undone(small_model_dir) -> None:
    """A bound no halving reaches: every update is undone and the weights stay as they were."""
    moved, m, per = _step(small_model_dir, 1e-30, tries=2)
    assert m["update_alpha_min"] == 0.0 and m["update_backtracked"] == 2
    assert moved == 0.0
    assert all(u["update_kl_region"] == 0.0 for u in per)


def test_the_batch_scope_bounds_what_the_step_moved_every_minibatch(small_model_dir) -> None:
    """Measured on its own minibatch, each update is scaled back there (or undone), and the step
    can still end far past the bound over the batch (the updates move each other's minibatches);
    measured over the batch, the step's update KL (the batch at the final parameters) is within it."""
    _, free, _ = _step(small_model_dir, 1e9, epochs=2)
    bound = free["update_kl"] / 8
    _, own, _ = _step(small_model_dir, bound, scope="minibatch", epochs=2)
    assert own["update_backtracked"] >= 1
    assert own["update_kl"] > bound, (bound, own["update_kl"])  # the hole the batch scope closes
    _, whole, per_whole = _step(small_model_dir, bound, scope="batch", epochs=2)
    assert whole["update_backtracked"] >= 1
    assert all(u["update_kl_region"] <= bound for u in per_whole), (bound, per_whole)
    assert whole["update_kl"] == pytest.approx(per_whole[-1]["update_kl_region"])
    assert whole["update_kl"] <= bound


def test_off_by_default_and_megatron_refuses_it(small_model_dir) -> None:
    assert LearnerConfig().max_update_kl is None
    _, m, _ = _step(small_model_dir, None)
    assert "update_backtracked" not in m
    pytest.importorskip("megatron.core")
    from learner.backends.megatron_backend import MegatronBackend

    with pytest.raises(ValueError, match="max_update_kl: the torch backend only"):
        MegatronBackend(LearnerConfig(backend="megatron", max_update_kl=0.01), small_model_dir)
