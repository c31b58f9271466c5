"""swarl's own HF <-> Megatron-core weight conversion for Qwen2, Qwen3 and Llama.

Megatron-core (GPTModel) names, local spec (`te=False`) / TransformerEngine spec (`te=True`):
  embedding.word_embeddings.weight              <- model.embed_tokens.weight
  decoder.layers.i.input_layernorm.weight       <- model.layers.i.input_layernorm.weight
      (te: decoder.layers.i.self_attention.linear_qkv.layer_norm_weight)
  decoder.layers.i.self_attention.linear_qkv.weight/.bias
      <- q_proj, k_proj, v_proj fused per query group: for each of the num_query_groups groups,
         its (heads / groups) query heads, then its key head, then its value head
  decoder.layers.i.self_attention.linear_proj.weight  <- o_proj.weight
  decoder.layers.i.self_attention.{q,k}_layernorm.weight <- self_attn.{q,k}_norm.weight (Qwen3)
  decoder.layers.i.pre_mlp_layernorm.weight     <- post_attention_layernorm.weight
      (te: decoder.layers.i.mlp.linear_fc1.layer_norm_weight)
  decoder.layers.i.mlp.linear_fc1.weight        <- [gate_proj; up_proj] (gated SiLU)
  decoder.layers.i.mlp.linear_fc2.weight        <- down_proj.weight
  decoder.final_layernorm.weight                <- model.norm.weight
  output_layer.weight                           <- lm_head.weight (untied models only)
The same layout conventions as Megatron-LM's and Megatron-Bridge's Qwen/Llama converters; the
conversion is a pure permutation (bit-exact both ways). Tensor-parallel shards are cut from the
full tensors by `shard_tp` (column-parallel: qkv by group, fc1 per half; row-parallel: proj, fc2;
vocab-parallel: embedding and output layer).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

SUPPORTED = ("qwen2", "qwen3", "llama")


# RoPE variants megatron-core's GPTModel expresses: plain (rotary_base), linear position
# interpolation (seq_len_interpolation_factor) and Llama-3.x scaling (rope_scaling with
# rope_scaling_factor; RotaryEmbedding fixes low_freq_factor 1, high_freq_factor 4 and an
# original context of 8192 positions)
ROPE_TYPES = ("default", "linear", "llama3")
_LLAMA3_FIXED = {"low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}


@dataclass(frozen=True)
class Rope:
    theta: float = 10000.0
    kind: str = "default"  # one of ROPE_TYPES
    factor: float = 1.0


def _field(hf: Any, key: str) -> Any:
    """A config field from a transformers config object or a raw config.json dict."""
    return hf.get(key) if isinstance(hf, Mapping) else getattr(hf, key, None)


def rope_from_hf(hf: Any) -> Rope:
    """RoPE from transformers-5's `rope_parameters` or transformers-4's `rope_theta` +
    `rope_scaling` (config objects or config.json dicts); a variant GPTModel cannot express is
    refused, never dropped (the learner's logprobs would silently differ from the server's)."""
    params = _field(hf, "rope_parameters")
    if params is not None and not isinstance(params, Mapping):
        raise ValueError(f"rope_parameters {params!r}: expected a dict")
    per_layer = [k for k, v in (params or {}).items() if isinstance(v, Mapping)]
    if per_layer:
        raise ValueError(f"rope_parameters per layer type ({', '.join(per_layer)}): the megatron "
                         "backend builds one RoPE for every layer")
    if not params:  # transformers 4.x: theta at the top level, scaling beside it
        params = {**(_field(hf, "rope_scaling") or {}), "rope_theta": _field(hf, "rope_theta")}
    kind = params.get("rope_type") or params.get("type") or "default"
    theta = float(params.get("rope_theta") or _field(hf, "rope_theta") or 10000.0)
    partial = params.get("partial_rotary_factor", _field(hf, "partial_rotary_factor"))
    if partial not in (None, 1, 1.0):
        raise ValueError(f"partial_rotary_factor {partial}: the megatron backend rotates whole heads")
    if kind not in ROPE_TYPES:
        raise ValueError(f"rope_type {kind!r}: megatron-core's GPTModel expresses "
                         f"{', '.join(ROPE_TYPES)} RoPE only; this model cannot be trained by the "
                         "megatron backend (use learner.backend=torch)")
    factor = float(params.get("factor") or 1.0)
    if kind == "llama3":
        wrong = {k: params.get(k) for k, v in _LLAMA3_FIXED.items() if float(params.get(k, v)) != v}
        if wrong:
            raise ValueError(f"rope_type 'llama3' with {wrong}: megatron-core's RotaryEmbedding "
                             f"fixes {_LLAMA3_FIXED}")
    if kind == "linear" and factor == 1.0:
        kind = "default"
    return Rope(theta=theta, kind=kind, factor=factor)


@dataclass(frozen=True)
class Arch:
    """The shape facts the conversion needs, read from an HF config (object or config.json dict)."""

    model_type: str
    num_layers: int
    hidden: int
    heads: int
    groups: int
    head_dim: int
    ffn: int
    vocab: int
    tied: bool
    qkv_bias: bool
    qk_norm: bool
    rope: Rope
    norm_eps: float
    max_pos: int

    @classmethod
    def from_hf(cls, hf: Any) -> Arch:
        mt = _field(hf, "model_type")
        if mt not in SUPPORTED:
            raise ValueError(f"model_type {mt!r}: the megatron backend converts {', '.join(SUPPORTED)}")
        heads = int(_field(hf, "num_attention_heads"))
        hidden = int(_field(hf, "hidden_size"))
        return cls(
            model_type=mt, num_layers=int(_field(hf, "num_hidden_layers")), hidden=hidden, heads=heads,
            groups=int(_field(hf, "num_key_value_heads") or heads),
            head_dim=int(_field(hf, "head_dim") or hidden // heads),
            ffn=int(_field(hf, "intermediate_size")), vocab=int(_field(hf, "vocab_size")),
            tied=bool(_field(hf, "tie_word_embeddings")),
            qkv_bias=mt == "qwen2" or bool(_field(hf, "attention_bias")),
            qk_norm=mt == "qwen3", rope=rope_from_hf(hf), norm_eps=float(_field(hf, "rms_norm_eps")),
            max_pos=int(_field(hf, "max_position_embeddings")))


def layer_names(te: bool, i: int) -> dict[str, str]:
    p = f"decoder.layers.{i}."
    return {
        "in_norm": p + ("self_attention.linear_qkv.layer_norm_weight" if te else "input_layernorm.weight"),
        "qkv": p + "self_attention.linear_qkv.weight",
        "qkv_bias": p + "self_attention.linear_qkv.bias",
        "proj": p + "self_attention.linear_proj.weight",
        "q_norm": p + "self_attention.q_layernorm.weight",
        "k_norm": p + "self_attention.k_layernorm.weight",
        "mlp_norm": p + ("mlp.linear_fc1.layer_norm_weight" if te else "pre_mlp_layernorm.weight"),
        "fc1": p + "mlp.linear_fc1.weight",
        "fc2": p + "mlp.linear_fc2.weight",
    }


def fuse_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, a: Arch) -> torch.Tensor:
    """[heads*d, ...], [groups*d, ...] x2 -> Megatron's per-group [q heads of group; k; v]."""
    rest = q.shape[1:]
    per = a.heads // a.groups
    qg = q.reshape(a.groups, per * a.head_dim, *rest)
    kg = k.reshape(a.groups, a.head_dim, *rest)
    vg = v.reshape(a.groups, a.head_dim, *rest)
    return torch.cat([qg, kg, vg], dim=1).reshape(-1, *rest)


def split_qkv(qkv: torch.Tensor, a: Arch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    rest = qkv.shape[1:]
    per = a.heads // a.groups
    g = qkv.reshape(a.groups, (per + 2) * a.head_dim, *rest)
    q, k, v = torch.split(g, [per * a.head_dim, a.head_dim, a.head_dim], dim=1)
    return (q.reshape(-1, *rest).contiguous(), k.reshape(-1, *rest).contiguous(),
            v.reshape(-1, *rest).contiguous())


def hf_to_megatron(hf_sd: dict[str, torch.Tensor], a: Arch, te: bool = False,
                   padded_vocab: int | None = None) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    emb = hf_sd["model.embed_tokens.weight"]
    out["embedding.word_embeddings.weight"] = _pad_vocab(emb, padded_vocab)
    for i in range(a.num_layers):
        h = f"model.layers.{i}."
        n = layer_names(te, i)
        out[n["in_norm"]] = hf_sd[h + "input_layernorm.weight"]
        out[n["qkv"]] = fuse_qkv(hf_sd[h + "self_attn.q_proj.weight"], hf_sd[h + "self_attn.k_proj.weight"],
                                 hf_sd[h + "self_attn.v_proj.weight"], a)
        if a.qkv_bias:
            out[n["qkv_bias"]] = fuse_qkv(hf_sd[h + "self_attn.q_proj.bias"], hf_sd[h + "self_attn.k_proj.bias"],
                                          hf_sd[h + "self_attn.v_proj.bias"], a)
        out[n["proj"]] = hf_sd[h + "self_attn.o_proj.weight"]
        if a.qk_norm:
            out[n["q_norm"]] = hf_sd[h + "self_attn.q_norm.weight"]
            out[n["k_norm"]] = hf_sd[h + "self_attn.k_norm.weight"]
        out[n["mlp_norm"]] = hf_sd[h + "post_attention_layernorm.weight"]
        out[n["fc1"]] = torch.cat([hf_sd[h + "mlp.gate_proj.weight"], hf_sd[h + "mlp.up_proj.weight"]], 0)
        out[n["fc2"]] = hf_sd[h + "mlp.down_proj.weight"]
    out["decoder.final_layernorm.weight"] = hf_sd["model.norm.weight"]
    if not a.tied:
        out["output_layer.weight"] = _pad_vocab(hf_sd["lm_head.weight"], padded_vocab)
    return out


def megatron_names(a: Arch, te: bool = False) -> list[str]:
    """Every Megatron tensor of the model (global layer numbering), in HF order."""
    names = ["embedding.word_embeddings.weight"]
    for i in range(a.num_layers):
        n = layer_names(te, i)
        keys = ["in_norm", "qkv", *(["qkv_bias"] if a.qkv_bias else []), "proj",
                *(["q_norm", "k_norm"] if a.qk_norm else []), "mlp_norm", "fc1", "fc2"]
        names += [n[k] for k in keys]
    names.append("decoder.final_layernorm.weight")
    if not a.tied:
        names.append("output_layer.weight")
    return names


def megatron_tensor_to_hf(name: str, t: torch.Tensor, a: Arch,
                          te: bool = False) -> list[tuple[str, torch.Tensor]]:
    """One full Megatron tensor -> its HF tensors (fused qkv and fc1 split; vocab padding cut),
    so that weights can be converted one tensor at a time."""
    if name == "embedding.word_embeddings.weight":
        return [("model.embed_tokens.weight", t[: a.vocab])]
    if name == "output_layer.weight":
        return [("lm_head.weight", t[: a.vocab])]
    if name == "decoder.final_layernorm.weight":
        return [("model.norm.weight", t)]
    i = int(name.split(".")[2])
    h = f"model.layers.{i}."
    role = {v: k for k, v in layer_names(te, i).items()}.get(name)
    if role in ("qkv", "qkv_bias"):
        kind = "weight" if role == "qkv" else "bias"
        q, k, v = split_qkv(t, a)
        return [(f"{h}self_attn.q_proj.{kind}", q), (f"{h}self_attn.k_proj.{kind}", k),
                (f"{h}self_attn.v_proj.{kind}", v)]
    if role == "fc1":
        gate, up = torch.chunk(t, 2, dim=0)
        return [(h + "mlp.gate_proj.weight", gate.contiguous()), (h + "mlp.up_proj.weight", up.contiguous())]
    single = {"in_norm": "input_layernorm.weight", "proj": "self_attn.o_proj.weight",
              "q_norm": "self_attn.q_norm.weight", "k_norm": "self_attn.k_norm.weight",
              "mlp_norm": "post_attention_layernorm.weight", "fc2": "mlp.down_proj.weight"}
    if role not in single:
        raise KeyError(f"{name}: not a Megatron tensor of a {a.model_type} model")
    return [(h + single[role], t)]


def megatron_to_hf(mg_sd: dict[str, torch.Tensor], a: Arch, te: bool = False) -> dict[str, torch.Tensor]:
    """Inverse of hf_to_megatron (vocab padding removed); a tied model gets no lm_head entry."""
    return {k: v for name in megatron_names(a, te) for k, v in megatron_tensor_to_hf(name, mg_sd[name], a, te)}


def _pad_vocab(t: torch.Tensor, padded: int | None) -> torch.Tensor:
    if padded is None or padded == t.shape[0]:
        return t
    pad = torch.zeros(padded - t.shape[0], *t.shape[1:], dtype=t.dtype)
    return torch.cat([t, pad], 0)


def shard_tp(name: str, t: torch.Tensor, rank: int, size: int) -> torch.Tensor:
    """This tensor-parallel rank's shard of a full Megatron tensor."""
    if size == 1:
        return t
    if name.endswith("linear_fc1.weight"):  # column-parallel, gate and up split separately
        gate, up = torch.chunk(t, 2, dim=0)
        return torch.cat([torch.chunk(gate, size, 0)[rank], torch.chunk(up, size, 0)[rank]], 0)
    if name.endswith(("linear_qkv.weight", "linear_qkv.bias", "word_embeddings.weight",
                      "output_layer.weight")):
        return torch.chunk(t, size, dim=0)[rank].contiguous()  # whole query groups per rank
    if name.endswith(("linear_proj.weight", "linear_fc2.weight")):
        return torch.chunk(t, size, dim=1)[rank].contiguous()  # row-parallel
    return t  # norms are replicated


def unshard_tp(name: str, shards: list[torch.Tensor]) -> torch.Tensor:
    """Inverse of shard_tp over all ranks' shards (in rank order)."""
    if len(shards) == 1:
        return shards[0]
    if name.endswith("linear_fc1.weight"):
        halves = [torch.chunk(s, 2, dim=0) for s in shards]
        return torch.cat([torch.cat([h[0] for h in halves], 0), torch.cat([h[1] for h in halves], 0)], 0)
    if name.endswith(("linear_qkv.weight", "linear_qkv.bias", "word_embeddings.weight",
                      "output_layer.weight")):
        return torch.cat(shards, 0)
    if name.endswith(("linear_proj.weight", "linear_fc2.weight")):
        return torch.cat(shards, 1)
    return shards[0]
