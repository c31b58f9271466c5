"""Start-up rules of `swarl learner` and the bf16 path."""

from __future__ import annotations

import math

import pytest
from learner_helpers import make_sample

from broker.replay import Entry
from learner import checkpoint
from learner.assembly import Assembler
from learner.backends.torch_backend import TorchBackend
from learner.checkpoint import LearnerState
from learner.config import LearnerConfig
from learner.service import ResumeError, run_learner
from learner.train import batch_items, train_step
from swarl.wiring import learner_runtime


async def test_refuses_to_restart_a_run_without_resume(cfg, small_model_dir) -> None:
    cfg.learner.model_dir = str(small_model_dir)
    checkpoint.save(cfg.run.dir, TorchBackend(cfg.learner, small_model_dir), LearnerState(step=1))
    with pytest.raises(ResumeError, match="--resume"):
        await run_learner(learner_runtime(cfg), resume=False)


async def test_model_dir_is_required(cfg, tmp_path) -> None:
    cfg.learner.model_dir = str(tmp_path / "nothing")
    with pytest.raises(ResumeError, match=r"config\.json"):
        await run_learner(learner_runtime(cfg), resume=False)


def test_bf16_step(small_model_dir) -> None:
    cfg = LearnerConfig(dtype="bf16", lr=1e-3)
    backend = TorchBackend(cfg, small_model_dir)
    asm = Assembler(n_per_group=2, batch_size=2, max_staleness=0, group_timeout_s=60)
    asm.add([Entry(f"1-{i}", make_sample("g", i, reward=float(i), length=20)) for i in range(2)])
    items, _ = batch_items(asm.take_batch(0), cfg)
    m = train_step(backend, items, cfg)
    assert math.isfinite(m["loss"]) and m["grad_norm"] > 0
    assert next(iter(backend.named_tensors()))[1].dtype.is_floating_point
