"""What the megatron backend takes from the machine (learner.backends.megatron_env): the layer spec
(TransformerEngine's, or the local one with the TE-only fusions off, logged once) and the
megatron-core version floor. This machine has no CUDA and no TransformerEngine."""

from __future__ import annotations

import logging

import pytest
from learner_helpers import make_tiny_model

from learner.backends import megatron_env
from learner.backends.hf_megatron_convert import Arch
from learner.backends.megatron_backend import transformer_config
from learner.config import LearnerConfig


@pytest.fixture
def arch(tmp_path) -> Arch:
    from transformers import AutoConfig

    return Arch.from_hf(AutoConfig.from_pretrained(str(make_tiny_model(tmp_path / "m"))))


class Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def test_cuda_without_te_gets_the_local_spec_logged_once(monkeypatch) -> None:
    assert megatron_env.transformer_engine() == (None, "not installed")
    monkeypatch.setattr(megatron_env, "_logged_local_spec", False)
    handler = Records()
    logger = logging.getLogger("swarl.learner")
    logger.addHandler(handler)
    try:
        assert megatron_env.use_transformer_engine(cuda=True) is False
        assert megatron_env.use_transformer_engine(cuda=True) is False
        assert megatron_env.use_transformer_engine(cuda=False) is False
    finally:
        logger.removeHandler(handler)
    said = [r for r in handler.records if r.getMessage() == "megatron_local_spec"]
    assert len(said) == 1
    fields = said[0].fields  # type: ignore[attr-defined]
    assert "apply_rope_fusion" in fields["fusions_off"] and fields["transformer_engine"] == "not installed"


def test_local_spec_config_has_the_te_only_fusions_off(arch) -> None:
    """On CUDA without TE the config megatron-core accepts; the TE one it refuses here (RoPE
    fusion is TE's kernel), which is what a CUDA machine without TE ran into."""
    cfg = LearnerConfig(backend="megatron")
    local = transformer_config(arch, cfg, cpu=False, te=False)
    assert not any(getattr(local, f) for f in megatron_env.TE_ONLY_FUSIONS)
    assert local.bias_dropout_fusion  # torch's own jit: kept on CUDA
    assert local.hidden_dropout == local.attention_dropout == 0.0
    with pytest.raises(Exception, match="apply_rope_fusion"):
        transformer_config(arch, cfg, cpu=False, te=True)


def test_megatron_core_floor_is_named() -> None:
    assert megatron_env.megatron_core_problem("0.16.1") is None
    assert megatron_env.megatron_core_problem("0.15.0") is None
    old = megatron_env.megatron_core_problem("0.14.0")
    assert old and "0.14.0" in old and "0.15.0" in old and "fp32_output" in old
    assert "not installed" in (megatron_env.megatron_core_problem(None) or "")
    assert megatron_env.check_megatron_core() == "0.16.1"  # the pin, installed here


def test_backend_refuses_an_old_megatron_core_at_build_time(monkeypatch, small_model_dir) -> None:
    from learner.backends.megatron_backend import MegatronBackend

    real = megatron_env.dist_version
    monkeypatch.setattr(megatron_env, "dist_version",
                        lambda name: "0.14.0" if name == "megatron-core" else real(name))
    with pytest.raises(RuntimeError, match=r"megatron-core 0\.14\.0 is older than 0\.15\.0"):
        MegatronBackend(LearnerConfig(backend="megatron"), small_model_dir)


def test_te_range_is_megatron_cores() -> None:
    assert megatron_env.te_version_problem("2.11.0") is None
    assert "outside" in (megatron_env.te_version_problem("2.12.0") or "")
    assert "outside" in (megatron_env.te_version_problem("2.8.0") or "")
