"""RoPE read right from transformers-4 and transformers-5 model configs, mapped onto what
megatron-core's GPTModel expresses, and anything else refused (never silently dropped: the
learner's logprobs would disagree with the server's).

transformers 4.x (which SGLang pins) keeps `rope_theta` and `rope_scaling` as config fields;
transformers 5 folds both into `rope_parameters`. Both shapes are checked as the config.json a
model ships (the raw dict) and as loaded by the installed transformers 5.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from learner.backends.hf_megatron_convert import Arch, Rope
from learner.config import LearnerConfig
from learner.packing import TrainItem, make_microbatches

LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 8192}


def llama_json(**rope: Any) -> dict[str, Any]:
    """A Llama config.json (tiny shapes) with the given RoPE fields."""
    return {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": 512,
            "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
            "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
            "max_position_embeddings": 16384, "rms_norm_eps": 1e-5, "tie_word_embeddings": False,
            **rope}


def loaded(tmp_path: Path, cfg: dict[str, Any]) -> Any:
    """The config as transformers 5 loads it from a model directory."""
    from transformers import AutoConfig

    (tmp_path / "config.json").write_text(json.dumps(cfg))
    return AutoConfig.from_pretrained(str(tmp_path))


CASES = [
    # transformers 4.x config.json: Llama 3.1
    (llama_json(rope_theta=500000.0, rope_scaling=LLAMA3), Rope(500000.0, "llama3", 8.0)),
    # 4.x, the older "type" key
    (llama_json(rope_theta=10000.0, rope_scaling={"type": "linear", "factor": 4.0}), Rope(10000.0, "linear", 4.0)),
    # 4.x, no scaling (Qwen2/Qwen3, Llama 2)
    (llama_json(rope_theta=1000000.0, rope_scaling=None), Rope(1000000.0, "default", 1.0)),
    # transformers 5 config.json
    (llama_json(rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}), Rope(1000000.0, "default", 1.0)),
    (llama_json(rope_parameters={**LLAMA3, "rope_theta": 500000.0}), Rope(500000.0, "llama3", 8.0)),
]


@pytest.mark.parametrize("cfg,rope", CASES)
def test_rope_from_both_config_shapes(tmp_path: Path, cfg: dict[str, Any], rope: Rope) -> None:
    assert Arch.from_hf(cfg).rope == rope               # the raw config.json
    assert Arch.from_hf(loaded(tmp_path, cfg)).rope == rope  # as transformers 5 loads it


REFUSED = [
    (llama_json(rope_theta=10000.0, rope_scaling={"rope_type": "yarn", "factor": 4.0,
                                                  "original_max_position_embeddings": 4096}), "'yarn'"),
    (llama_json(rope_theta=10000.0, rope_scaling={"type": "dynamic", "factor": 2.0}), "'dynamic'"),
    (llama_json(rope_parameters={"rope_type": "longrope", "rope_theta": 10000.0, "short_factor": [1.0] * 8,
                                 "long_factor": [1.0] * 8, "original_max_position_embeddings": 4096}), "'longrope'"),
    (llama_json(rope_theta=500000.0, rope_scaling={**LLAMA3, "original_max_position_embeddings": 32768}),
     "original_max_position_embeddings"),
    (llama_json(rope_theta=500000.0, rope_scaling={**LLAMA3, "high_freq_factor": 2.0}), "high_freq_factor"),
    (llama_json(rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 1e6},
                                 "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}),
     "per layer type"),
    (llama_json(rope_theta=10000.0, partial_rotary_factor=0.5), "partial_rotary_factor"),
]


@pytest.mark.parametrize("cfg,words", REFUSED)
def test_rope_megatron_cannot_express_is_refused(tmp_path: Path, cfg: dict[str, Any], words: str) -> None:
    with pytest.raises(ValueError, match=words):
        Arch.from_hf(cfg)
    with pytest.raises(ValueError, match=words):
        Arch.from_hf(loaded(tmp_path, cfg))


# -- the mapping is the HF model's: megatron logprobs equal transformers' ---------------------

@pytest.fixture(scope="module")
def one_process():
    """The backend sets up a one-rank group and Megatron's groups; torn down after the module."""
    import torch.distributed as dist
    from megatron.core import parallel_state as ps

    try:
        yield
    finally:
        if ps.model_parallel_is_initialized():
            ps.destroy_model_parallel()
        if dist.is_initialized():
            dist.destroy_process_group()


def llama_dir(out: Path, rope: dict[str, Any]) -> Path:
    """A tiny Llama saved by transformers 5 from a transformers-4 style config.json."""
    from transformers import LlamaForCausalLM

    cfg = loaded(out, llama_json(**rope))
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if not name.endswith("norm.weight"):
                p.normal_(0.0, 0.08)
    model.save_pretrained(out)
    return out


def long_batch() -> list[TrainItem]:
    """Two samples long enough that the low RoPE frequencies turn noticeably."""
    rng = np.random.default_rng(7)
    out = []
    for n in (700, 400):
        toks = rng.integers(1, 512, size=n).astype(np.int32)
        mask = np.ones(n, dtype=np.uint8)
        out.append(TrainItem(f"s{n}", toks, mask, np.zeros(n, dtype=np.float32), 0.0, 1.0))
    return out


@pytest.mark.parametrize("rope", [
    {"rope_theta": 10000.0, "rope_scaling": {"type": "linear", "factor": 4.0}},
    {"rope_theta": 10000.0, "rope_scaling": {**LLAMA3, "factor": 32.0}},
], ids=["linear", "llama3"])
def test_scaled_rope_logprobs_match_transformers(one_process: None, tmp_path: Path, rope: dict[str, Any]) -> None:
    from learner.backends.megatron_backend import MegatronBackend
    from learner.backends.torch_backend import TorchBackend

    d = llama_dir(tmp_path, rope)
    cfg = LearnerConfig()
    mb = make_microbatches(long_batch(), 1 << 16)[0]
    mg = MegatronBackend(cfg, d)
    assert mg.arch.rope.kind != "default"
    want = TorchBackend(cfg, d).logprobs(mb, grad=False, with_entropy=False)[0]
    got = mg.logprobs(mb, grad=False, with_entropy=False)[0]
    assert float((got - want).abs().max()) <= 1e-4
    # the scaling matters on these lengths: a model built with plain RoPE would be far off
    (d / "plain").mkdir()
    plain_cfg = {**json.loads((d / "config.json").read_text()), "rope_scaling": None,
                 "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}}
    (d / "plain" / "config.json").write_text(json.dumps(plain_cfg))
    for f in d.glob("*.safetensors"):
        (d / "plain" / f.name).symlink_to(f)
    plain = MegatronBackend(cfg, d / "plain").logprobs(mb, grad=False, with_entropy=False)[0]
    assert float((plain - want).abs().max()) > 1e-2
