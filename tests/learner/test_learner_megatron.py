"""The megatron backend on CPU: HF -> Megatron -> HF is bit-exact, and on the same weights and
batch the per-token logprobs, loss and gradients (mapped back to HF names) match the torch
backend. megatron-core's CUDA-only spots are answered by learner.backends.megatron_cpu (the
backend opens it itself when CUDA is absent); these tests run one process, the multi-rank ones
are in test_megatron_ranks.py.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from learner_helpers import make_tiny_model

from learner.backends.hf_megatron_convert import (
    Arch,
    hf_to_megatron,
    megatron_to_hf,
    shard_tp,
    unshard_tp,
)
from learner.backends.megatron_backend import load_hf_state
from learner.backends.torch_backend import TorchBackend
from learner.config import LearnerConfig
from learner.packing import TrainItem, make_microbatches
from learner.train import train_step


@pytest.fixture(scope="module")
def megatron_cpu():
    """One process: the backend sets up a one-rank group and Megatron's groups; torn down here
    so other test modules start without them."""
    import torch.distributed as dist
    from megatron.core import parallel_state as ps

    try:
        yield
    finally:
        if ps.model_parallel_is_initialized():
            ps.destroy_model_parallel()
        if dist.is_initialized():
            dist.destroy_process_group()


def hf_config(model_dir):
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(str(model_dir))


@pytest.mark.parametrize("arch,tied", [("qwen3", True), ("qwen3", False), ("llama", False)])
def test_conversion_is_bit_exact(tmp_path, arch: str, tied: bool) -> None:
    d = make_tiny_model(tmp_path, tied=tied, arch=arch)
    a = Arch.from_hf(hf_config(d))
    hf = load_hf_state(d)
    mg = hf_to_megatron(hf, a)
    assert mg["decoder.layers.0.self_attention.linear_qkv.weight"].shape == (
        (a.heads + 2 * a.groups) * a.head_dim, a.hidden)
    assert ("output_layer.weight" in mg) == (not tied)
    back = megatron_to_hf(mg, a)
    assert back.keys() == hf.keys()
    for k in hf:
        assert torch.equal(back[k], hf[k]), k


def test_qkv_layout_groups_query_heads_with_their_kv_head() -> None:
    from types import SimpleNamespace

    a = Arch.from_hf(SimpleNamespace(model_type="qwen2", num_hidden_layers=1, hidden_size=4,
                                     num_attention_heads=4, num_key_value_heads=2, head_dim=1,
                                     intermediate_size=8, vocab_size=10, tie_word_embeddings=True,
                                     rms_norm_eps=1e-6, max_position_embeddings=16, rope_parameters={}))
    assert a.qkv_bias and not a.qk_norm
    q = torch.tensor([[0.0], [1.0], [2.0], [3.0]])   # heads 0..3
    k = torch.tensor([[10.0], [11.0]])               # kv heads 0, 1
    v = torch.tensor([[20.0], [21.0]])
    from learner.backends.hf_megatron_convert import fuse_qkv

    # group 0 = query heads 0,1 + k0 + v0; group 1 = query heads 2,3 + k1 + v1
    assert fuse_qkv(q, k, v, a)[:, 0].tolist() == [0, 1, 10, 20, 2, 3, 11, 21]


def test_tensor_parallel_shards_round_trip(small_model_dir) -> None:
    a = Arch.from_hf(hf_config(small_model_dir))
    mg = hf_to_megatron(load_hf_state(small_model_dir), a)
    for name, t in mg.items():
        shards = [shard_tp(name, t, r, 2) for r in range(2)]
        assert torch.equal(unshard_tp(name, shards), t), name
    fc1 = [shard_tp("decoder.layers.0.mlp.linear_fc1.weight",
                    mg["decoder.layers.0.mlp.linear_fc1.weight"], r, 2) for r in range(2)]
    gate = mg["decoder.layers.0.mlp.linear_fc1.weight"][: a.ffn]
    assert torch.equal(fc1[1][: a.ffn // 2], gate[a.ffn // 2:])  # each rank: its half of gate, then of up


def batch(seed: int = 0) -> list[TrainItem]:
    rng = np.random.default_rng(seed)
    out = []
    for i, n in enumerate([9, 17, 30, 5]):
        toks = rng.integers(1, 512, size=n).astype(np.int32)
        mask = np.zeros(n, dtype=np.uint8)
        mask[3:] = 1
        out.append(TrainItem(f"s{i}", toks, mask, np.where(mask == 1, -6.2, 0.0).astype(np.float32),
                             adv=[0.7, -0.4, 0.2, -0.5][i], tok_w=1.0 / 49))
    return out


@pytest.mark.parametrize("tied", [True, False])
def test_megatron_matches_torch_backend(megatron_cpu, small_model_dir, untied_model_dir, tied: bool) -> None:
    from learner.backends.megatron_backend import MegatronBackend

    d = small_model_dir if tied else untied_model_dir
    cfg = LearnerConfig(lr=1e-3, grad_clip=0.0, max_tokens_per_microbatch=40)
    mg = MegatronBackend(cfg, d)
    tb = TorchBackend(cfg, d)
    # the model went in and comes out bit-exact
    hf = load_hf_state(d)
    out = mg.hf_state()
    assert out.keys() == hf.keys()
    for k in hf:
        assert torch.equal(out[k], hf[k]), k
    # same per-token logprobs on a packed micro-batch
    mb = make_microbatches(batch(), 10_000)[0]
    lp_m, ent_m = mg.logprobs(mb, grad=False, with_entropy=True)
    lp_t, ent_t = tb.logprobs(mb, grad=False, with_entropy=True)
    torch.testing.assert_close(lp_m, lp_t, atol=1e-4, rtol=0)
    torch.testing.assert_close(ent_m, ent_t, atol=1e-4, rtol=0)
    # same loss and gradients (mapped back to HF names), over several micro-batches
    grads = {}
    for name, be in (("megatron", mg), ("torch", tb)):
        orig = be.step

        def step(max_norm=None, *, be=be, name=name, orig=orig):
            if name == "megatron":
                # after the schedule (and its finalize) the step's gradient is in Megatron's
                # grad buffer, param.main_grad
                g = {n: p.main_grad.clone() for n, p in be.model.named_parameters()}
                grads[name] = megatron_to_hf(g, be.arch)
            else:
                grads[name] = {n: p.grad.clone() for n, p in be.model.named_parameters()}
            return orig(max_norm)

        be.step = step
    m_m = train_step(mg, batch(), cfg)
    m_t = train_step(tb, batch(), cfg)
    assert m_m["microbatches"] > 1
    assert m_m["loss"] == pytest.approx(m_t["loss"], abs=1e-5)
    assert grads["megatron"].keys() == grads["torch"].keys()
    for k in grads["torch"]:
        torch.testing.assert_close(grads["megatron"][k], grads["torch"][k], atol=1e-5, rtol=1e-3)
    # and after the same AdamW step the weights agree
    after_m, after_t = mg.hf_state(), dict(tb.publish_tensors())
    for k in after_t:
        torch.testing.assert_close(after_m[k], after_t[k], atol=1e-5, rtol=1e-4)


def test_megatron_checkpoint_round_trip(megatron_cpu, small_model_dir, tmp_path) -> None:
    from learner.backends.megatron_backend import MegatronBackend

    cfg = LearnerConfig(lr=1e-3)
    a = MegatronBackend(cfg, small_model_dir)
    train_step(a, batch(), cfg)
    a.save(tmp_path / "ck")
    b = MegatronBackend(cfg, small_model_dir)
    b.load(tmp_path / "ck")
    # the saved model is an HF checkpoint the torch backend (and inference servers) load
    t = TorchBackend(cfg, tmp_path / "ck" / "model")
    for (k, v), (k2, v2) in zip(sorted(a.hf_state().items()), sorted(t.publish_tensors()), strict=True):
        assert k == k2 and torch.equal(v, v2)
    train_step(a, batch(1), cfg)
    train_step(b, batch(1), cfg)
    for k, v in a.hf_state().items():
        assert torch.equal(v, b.hf_state()[k]), k


@pytest.mark.parametrize("fields,words", [
    ({"pipeline_parallel": 2}, "learner.pipeline_parallel=2 does not divide the 1 ranks"),
    ({"pipeline_parallel": 3}, "learner.pipeline_parallel=3 does not divide the model's 2 layers"),
    ({"pipeline_parallel": 2, "kl_coef": 0.1}, "learner.kl_coef=0.1 with learner.pipeline_parallel=2"),
])
def test_layouts_that_cannot_run_are_refused_by_name(megatron_cpu, small_model_dir, fields, words) -> None:
    from learner.backends.megatron_backend import MegatronBackend

    with pytest.raises(ValueError, match=words):
        MegatronBackend(LearnerConfig(**fields), small_model_dir, small_model_dir)



def test_learning_rate_warms_up_like_the_torch_backend(megatron_cpu, small_model_dir) -> None:
    from learner.backends.megatron_backend import MegatronBackend

    cfg = LearnerConfig(lr=1e-3, warmup_steps=3, max_tokens_per_microbatch=40)
    lrs = {}
    for name, be in (("megatron", MegatronBackend(cfg, small_model_dir)), ("torch", TorchBackend(cfg, small_model_dir))):
        lrs[name] = [train_step(be, batch(s), cfg)["lr"] for s in range(4)]
    assert lrs["megatron"] == pytest.approx(lrs["torch"])
    assert lrs["torch"] == pytest.approx([1e-3 / 3, 2e-3 / 3, 1e-3, 1e-3])


@pytest.mark.parametrize("fields", [{"dtype": "bf16"}, {"dtype": "bf16", "use_distributed_optimizer": False},
                                    {"recompute": "selective"}, {"recompute": "full"}])
def test_precisions_and_recompute_train(megatron_cpu, small_model_dir, fields) -> None:
    """bf16 weights with fp32 main copies (distributed optimizer or not) and activation
    recomputation: a step runs on CPU and gives the fp32 step's gradient norm (bf16: roughly)."""
    from learner.backends.megatron_backend import MegatronBackend

    cfg = LearnerConfig(lr=1e-3, max_tokens_per_microbatch=40, **fields)
    be = MegatronBackend(cfg, small_model_dir)
    before = be.hf_state()
    st = train_step(be, batch(), cfg)
    ref = train_step(MegatronBackend(LearnerConfig(lr=1e-3, max_tokens_per_microbatch=40), small_model_dir), batch(), cfg)
    tol = 2e-2 if cfg.dtype == "bf16" else 1e-6
    assert st["grad_norm"] == pytest.approx(ref["grad_norm"], rel=tol)
    after = be.hf_state()
    assert all(t.dtype == (torch.bfloat16 if cfg.dtype == "bf16" else torch.float32) for t in after.values())
    assert any(not torch.equal(after[k], before[k]) for k in before)
