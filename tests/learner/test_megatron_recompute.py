"""Activation recomputation as the megatron backend really runs it: the bytes autograd keeps for
the backward during the training forward (train_microbatches), counted tensor by tensor with
saved_tensors_hooks, per transformer layer, against swarl.plan's formulas.

Per layer = (what a 3-layer model keeps - what the same shape with 1 layer keeps) / 2, so the
embedding, the final norm, the mask, the RoPE table and the logits the logprob head saves cancel.
Parameters are not activations and are left out. Counting stops when the loss function is
called: the backward's recomputation saves tensors too.

On CPU the backend runs megatron-core's local layer spec, not TransformerEngine's, which
swarl.plan sizes. The local spec keeps everything the plan counts (A, layer_activation_bytes)
except the flash-attention LSE, plus what its unfused modules keep on top, listed in
LOCAL_SPEC_EXTRAS: the difference is exact, so a change of either side shows.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from learner.config import LearnerConfig
from learner.packing import TrainItem, make_microbatches
from swarl.plan import ModelShape, layer_activation_bytes

# a Qwen3 shape with grouped query attention; fp32 on CPU
H, HEADS, KV, D, FFN, VOCAB = 96, 6, 2, 16, 192, 256
TOKENS = 48
B = 4


def local_spec_extras(s: int) -> int:
    """Bytes per token per layer the local spec keeps beyond the TE spec (plan's A less the LSE)."""
    return (2 * H * B            # the unfused RMSNorms' normalized input, before the weight
            + 3 * HEADS * D * B  # q, k, v laid out for torch.bmm, k and v repeated per query head
            + FFN * B            # the gate, copied out of fc1's output before silu
            + HEADS * s * B      # the softmax probabilities (no flash attention)
            + 4 * D * B          # RoPE's cos and sin, for q and for k
            - 4 * HEADS)         # no LSE: the plan's flash-attention statistic


@pytest.fixture(scope="module")
def megatron_cpu():
    import torch.distributed as dist
    from megatron.core import parallel_state as ps

    try:
        yield
    finally:
        if ps.model_parallel_is_initialized():
            ps.destroy_model_parallel()
        if dist.is_initialized():
            dist.destroy_process_group()


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[int, Path]:
    from transformers import Qwen3Config, Qwen3ForCausalLM

    out = {}
    for layers in (1, 3):
        d = tmp_path_factory.mktemp(f"recompute-{layers}")
        torch.manual_seed(0)
        Qwen3ForCausalLM(Qwen3Config(
            vocab_size=VOCAB, hidden_size=H, intermediate_size=FFN, num_hidden_layers=layers,
            num_attention_heads=HEADS, num_key_value_heads=KV, head_dim=D,
            max_position_embeddings=512)).save_pretrained(d)
        out[layers] = d
    return out


def stored_bytes(model_dir: Path, recompute: str) -> int:
    """Bytes of the distinct storages autograd saves during one training forward."""
    from learner.backends.megatron_backend import MegatronBackend

    be = MegatronBackend(LearnerConfig(backend="megatron", recompute=recompute,  # type: ignore[arg-type]
                                       max_tokens_per_microbatch=TOKENS), model_dir)
    params = {p.untyped_storage().data_ptr() for p in be.ddp.parameters()}
    seen: dict[int, int] = {}
    forward_done = False

    def pack(t: torch.Tensor) -> torch.Tensor:
        st = t.untyped_storage()
        if not forward_done and st.data_ptr() not in params:
            seen[st.data_ptr()] = st.nbytes()
        return t

    def loss_fn(lp: torch.Tensor, ent: Any, mb: Any) -> tuple[torch.Tensor, dict[str, float]]:
        nonlocal forward_done
        forward_done = True  # the model's forward is over; the head and the backward follow
        return lp.sum(), {}

    rng = np.random.default_rng(0)
    item = TrainItem("s", rng.integers(0, VOCAB, TOKENS).astype(np.int32), np.ones(TOKENS, np.uint8),
                     np.zeros(TOKENS, np.float32), adv=1.0, tok_w=1.0)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        be.train_microbatches(make_microbatches([item], TOKENS), loss_fn)
    assert forward_done
    return sum(seen.values())


def per_layer_per_token(models: dict[int, Path], recompute: str) -> float:
    return (stored_bytes(models[3], recompute) - stored_bytes(models[1], recompute)) / 2 / TOKENS


@pytest.fixture(scope="module")
def measured(megatron_cpu, models) -> dict[str, float]:
    return {rc: per_layer_per_token(models, rc) for rc in ("none", "selective", "full")}


def shape() -> ModelShape:
    return ModelShape(name="tiny", source="test", layers=1, hidden=H, heads=HEADS, kv_heads=KV,
                      head_dim=D, ffn=FFN, vocab=VOCAB, tied=False, qk_norm=True)


def test_full_recompute_keeps_only_each_layers_input(measured) -> None:
    """recompute: full (uniform, one layer per checkpoint) keeps h x b bytes per token per layer:
    the plan's stored term. In eval mode megatron-core never recomputes and this was ~28x more."""
    assert measured["full"] == H * B


def test_no_recompute_keeps_the_plans_layer(measured) -> None:
    assert measured["none"] == layer_activation_bytes(shape(), 1, B) + local_spec_extras(TOKENS)


def test_stored_ratio_none_to_full_is_the_plans(measured) -> None:
    """The plan's ratio of what a layer keeps without and with full recompute, A / (h b), is what
    the backend keeps (the local spec's extras added to A, as above), within 1%."""
    plan_ratio = (layer_activation_bytes(shape(), 1, B) + local_spec_extras(TOKENS)) / (H * B)
    assert measured["none"] / measured["full"] == pytest.approx(plan_ratio, rel=0.01)
    assert measured["none"] / measured["full"] > 20


def test_selective_recompute_drops_the_attention_core(measured) -> None:
    """selective recomputes core attention only: on the local spec its softmax probabilities (a s b
    per token) and the q, k, v copies go; the rest of the layer is kept."""
    assert measured["selective"] <= measured["none"] - HEADS * TOKENS * B
    assert measured["selective"] > measured["full"] * 10
