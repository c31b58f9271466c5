"""`swarl config plan`: the shipped GPU recipes fit their GPUs, a layout that cannot fit is
refused with its reason, and each term equals a hand computation on a small model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from actors.config import ActorConfig
from learner.config import LearnerConfig
from swarl.cli import app
from swarl.plan import (
    HEAD_CHUNK_BYTES,
    HEAD_CHUNK_ELEMENTS,
    ClusterConfig,
    PlanError,
    inference_plan,
    learner_plan,
    make_plan,
    megatron_padded_vocab,
    model_shape,
)

GPU = Path(__file__).resolve().parents[2] / "configs" / "gpu"
GIB = 1024**3


def plan(*args: str):
    return CliRunner().invoke(app, ["config", "plan", *args])


@pytest.mark.parametrize("name", ["qwen3-8b.yaml", "qwen3-32b.yaml", "qwen3-8b-prm.yaml"])
def test_shipped_recipes_fit(name):
    res = plan("--config", str(GPU / name))
    assert res.exit_code == 0, res.output
    assert res.stdout.rstrip().endswith("fits")
    for term in ("weights", "grads", "optimizer", "activations", "peak", "margin", "KV tokens"):
        assert term in res.stdout
    data = json.loads(plan("--config", str(GPU / name), "--json").stdout)
    assert data["fits"] and data["problems"] == []
    assert data["learner"]["margin"] > 0
    assert data["inference"]["episodes"] >= data["inference"]["concurrent_episodes"]


def test_prm_judges_are_planned_on_nodes_of_their_own():
    data = json.loads(plan("--config", str(GPU / "qwen3-8b-prm.yaml"), "--json").stdout)
    assert (data["gpus"], data["nodes"]) == (40, 5)  # the seed's 5-node PRM layout
    assert data["prm_model"]["name"] == "Qwen3-4B" and data["prm"]["servers"] == 8
    assert data["prm"]["concurrent_episodes"] == 128 * 3  # m votes per running episode
    # a 32B judge on one GPU each leaves no KV room for a judge request, and says so
    res = plan("--config", str(GPU / "qwen3-8b-prm.yaml"), "--set", "cluster.prm_model=/models/Qwen3-32B",
               "--set", "cluster.prm_mem_fraction=0.8")
    assert res.exit_code == 1 and "PRM judge" in res.output
    res = plan("--config", str(GPU / "qwen3-8b-prm.yaml"), "--set", "cluster.prm_model=null")
    assert res.exit_code == 2 and "cluster.prm_model" in res.output


def test_old_32b_layout_does_not_fit():
    """The 32B recipe as it first shipped: one node, TP 8 x DP 1, no recompute."""
    res = plan("--config", str(GPU / "qwen3-32b.yaml"), "--set", "cluster.learner_nodes=1",
               "--set", "learner.recompute=none")
    assert res.exit_code == 1
    assert "does not fit: learner:" in res.stderr and "more than the 79.6 GiB of a GPU" in res.stderr
    data = json.loads(plan("--config", str(GPU / "qwen3-32b.yaml"), "--json", "--set",
                           "cluster.learner_nodes=1", "--set", "learner.recompute=none").stdout)
    lp = data["learner"]
    assert not data["fits"] and (lp["tp"], lp["dp"]) == (8, 1)
    # 18 bytes per parameter before any activation: ~74 GB of an 80 GB GPU
    assert lp["weights"] + lp["grads"] + lp["optimizer"] == 18 * lp["params"]
    assert 73e9 < 18 * lp["params"] < 75e9


def test_inference_that_cannot_hold_one_episode_is_named():
    res = plan("--config", str(GPU / "qwen3-32b.yaml"), "--set", "cluster.inference_tp_size=1",
               "--set", "cluster.inference_mem_fraction=0.8")
    assert res.exit_code == 1
    assert "does not fit: inference:" in res.stderr and "fewer than one episode of 16384" in res.stderr


def test_cannot_plan_is_exit_2_naming_the_cause(tmp_path):
    res = plan("--config", str(GPU / "qwen3-8b.yaml"), "--set", f"learner.model_dir={tmp_path}/Mystery-7B")
    assert res.exit_code == 2 and "Mystery-7B" in res.stderr and "config.json" in res.stderr
    res = plan("--config", str(GPU / "qwen3-8b.yaml"), "--set", "cluster.learner_nodes=1",
               "--set", "cluster.gpus_per_node=6", "--set", "learner.tensor_parallel=4")
    assert res.exit_code == 2 and "not a multiple of tensor_parallel" in res.stderr
    res = plan("--config", str(GPU / "qwen3-8b.yaml"), "--set", "learner.backend=torch")
    assert res.exit_code == 2 and "megatron" in res.stderr


# -- a small model by hand ----------------------------------------------------------------------

SMALL = {"model_type": "qwen3", "num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
         "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 128, "vocab_size": 1000,
         "tie_word_embeddings": False}


@pytest.fixture
def small(tmp_path):
    d = tmp_path / "Small"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(SMALL))
    return model_shape(str(d))


def test_learner_terms_by_hand(small):
    lc = LearnerConfig(backend="megatron", dtype="bf16", tensor_parallel=2, recompute="none",
                       max_tokens_per_microbatch=64)
    cluster = ClusterConfig(gpus_per_node=4, learner_nodes=1, gpu_memory_gib=1.0, learner_reserve_gib=0.0)
    lp = learner_plan(small, lc, cluster, max_sample_tokens=100)
    assert (lp.world, lp.tp, lp.dp) == (4, 2, 2)
    assert lp.padded_vocab == 1024               # a multiple of 128 x TP 2
    assert lp.microbatch_tokens == 100           # the longest sample beats the 64-token budget
    # parameters on one TP rank: matrices / 2, norms whole
    qkv = 64 * (4 + 2 + 2) * 16                   # 8192
    proj = 4 * 16 * 64                            # 4096
    mlp = 3 * 64 * 128                            # 24576
    layer = (qkv + proj + mlp) // 2 + 2 * 64 + 2 * 16   # 18592
    params = 2 * layer + 2 * (1024 * 64 // 2) + 64      # layers, embedding + output, final norm
    assert lp.params == params == 102784
    assert lp.weights == 2 * params and lp.grads == 4 * params
    assert lp.optimizer == 12 * params // 2      # fp32 main + Adam m, v over DP 2
    # one layer, bytes per token, TP 2 (2 query heads, 1 kv head of 16)
    per_layer = (4 * 64 * 2                      # the two norms' inputs and outputs
                 + (2 + 2 * 1) * 16 * 2          # fused qkv output
                 + 2 * 16 * 2                    # query regrouped (a copy)
                 + (2 + 1) * 16 * 2              # rotated q, k
                 + 2 * 16 * 2                    # attention output
                 + 4 * 128 // 2 * 2              # fc1 out, silu, product
                 + 4 * 2 + 4 * 3 + 8)            # LSE, q/k norm rstd, norm rstd (fp32)
    assert per_layer == 1404
    assert lp.activations == 100 * (2 * per_layer + 2 * 64 * 2)
    # the head on this rank's 512 logits of 1024: bf16 logits and their gradient per token, the
    # output layer's bf16 weight gradient, one chunk's fp32 temporaries
    head = 100 * 512 * 2 * 2 + 512 * 64 * 2 + HEAD_CHUNK_ELEMENTS * HEAD_CHUNK_BYTES
    assert lp.head_bytes == 4 and lp.head == head
    assert lp.working == head and lp.working_is_head
    assert lp.total == 2 * params + 4 * params + 6 * params + 100 * (2 * 1404 + 256) + head
    assert lp.total == 2_973_408 - 1_433_600 + head
    assert lp.margin == GIB - lp.total and lp.fits

    full = learner_plan(small, lc.model_copy(update={"recompute": "full"}), cluster, 100)
    assert full.activations == 100 * (2 * 64 * 2 + 2 * 64 * 2)   # layer inputs + final norm
    assert full.working == max(100 * 2 * per_layer, head)
    not_sharded = learner_plan(small, lc.model_copy(update={"use_distributed_optimizer": False}), cluster, 100)
    assert not_sharded.optimizer == 12 * params
    # the entropy's gradient is recomputed a chunk at a time: no more memory
    entropy = learner_plan(small, lc.model_copy(update={"entropy_coef": 0.01}), cluster, 100)
    assert entropy.head == head
    # the reference model's logits beside the policy's
    kl = learner_plan(small, lc.model_copy(update={"kl_coef": 0.01}), cluster, 100)
    assert kl.head_bytes == 6 and kl.head == head + 100 * 512 * 2 and kl.reference == 2 * params
    # fp32: every byte of the logits doubles
    fp32 = learner_plan(small, lc.model_copy(update={"dtype": "fp32"}), cluster, 100)
    assert fp32.head == 100 * 512 * 8 + 512 * 64 * 4 + HEAD_CHUNK_ELEMENTS * HEAD_CHUNK_BYTES


def test_head_chunk_is_the_backends():
    from learner.backends.megatron_head import CHUNK_ELEMENTS

    assert HEAD_CHUNK_ELEMENTS == CHUNK_ELEMENTS


def test_inference_terms_by_hand(small):
    cluster = ClusterConfig(gpu_memory_gib=1.0, inference_servers=3, inference_tp_size=2,
                            inference_mem_fraction=0.5, inference_reserve_gib=0.25)
    ip = inference_plan(small, cluster, context_len=1000, concurrent=10)
    layer = 64 * (2 * 16 + 2 * 1 * 16) + 2 * 16 * 64 + 3 * 64 * 128 // 2 + 2 * 64 + 2 * 16
    assert ip.params == 2 * layer + 2 * (1000 * 64 // 2) + 64 == 101248
    assert ip.weights == 2 * 101248
    assert ip.kv_bytes_per_token == 2 * 2 * 1 * 16 * 2   # K and V, 2 layers, 1 kv head, bf16
    assert ip.kv_room == GIB // 2 - 2 * 101248 - GIB // 4
    assert ip.kv_tokens == ip.kv_room // 128
    assert ip.episodes == 3 * (ip.kv_tokens // 1000)
    # past the kv heads, each GPU keeps one replica
    assert inference_plan(small, cluster.model_copy(update={"inference_tp_size": 4}), 1000, 10).kv_heads_per_gpu == 1


def test_known_models_match_published_sizes():
    assert round(model_shape("/models/Qwen3-8B").params() / 1e9, 2) == 8.19
    assert round(model_shape("/models/Qwen3-32B").params() / 1e9, 2) == 32.76


def test_config_json_wins_over_the_table(tmp_path):
    d = tmp_path / "Qwen3-8B"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({**SMALL, "num_hidden_layers": 3}))
    assert model_shape(str(d)).layers == 3
    (d / "config.json").write_text(json.dumps({**SMALL, "hidden_size": "wide"}))
    with pytest.raises(PlanError, match="hidden_size"):
        model_shape(str(d))


def test_padded_vocab_is_the_backends():
    from learner.backends.megatron_backend import padded_vocab

    qwen = model_shape("/models/Qwen3-8B")
    for tp in (1, 2, 4, 8):
        arch = type("A", (), {"vocab": qwen.vocab})()
        assert megatron_padded_vocab(qwen.vocab, tp) == padded_vocab(
            arch, LearnerConfig(tensor_parallel=tp))  # type: ignore[arg-type]


def test_make_plan_refuses_other_backends():
    with pytest.raises(PlanError, match="megatron"):
        make_plan(LearnerConfig(), ActorConfig(), ClusterConfig(), 1)


@pytest.mark.parametrize("name", ["qwen3-8b.yaml", "qwen3-32b.yaml", "qwen3-8b-prm.yaml"])
def test_docs_show_the_plans_current_output(name):
    """docs/gpu.md pastes each recipe's plan; it must be what the command prints today."""
    doc = (GPU.parents[1] / "docs" / "gpu.md").read_text()
    marker = f"$ swarl config plan --config configs/gpu/{name}\n"
    assert marker in doc
    pasted = doc.split(marker, 1)[1].split("```", 1)[0]
    assert pasted == plan("--config", str(GPU / name)).stdout
