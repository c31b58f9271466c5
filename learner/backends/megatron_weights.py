"""A Megatron GPTModel's weights in HF naming, across its ranks: every rank loads its own
tensor-parallel shard of its own pipeline stage from full HF tensors, and publishing brings the
model to global rank 0 one Megatron tensor at a time (tensor-parallel shards gathered on the
stage that holds the tensor, then sent from that stage to rank 0), never the whole model at once;
checkpoints are written from that stream in bounded shards (`save_hf_shards`).

Global Megatron names (hf_megatron_convert.megatron_names) number layers over the whole model;
a pipeline stage's module numbers its own layers from 0 (`offset` is its first global layer).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from learner.backends.hf_megatron_convert import (
    Arch,
    megatron_names,
    megatron_tensor_to_hf,
    shard_tp,
    unshard_tp,
)

_LAYERS = "decoder.layers."
TP_SHARDED = ("linear_qkv.weight", "linear_qkv.bias", "word_embeddings.weight", "output_layer.weight",
              "linear_proj.weight", "linear_fc1.weight", "linear_fc2.weight")


def layer_offset(model: Any) -> int:
    """Global index of this pipeline stage's first layer (megatron-core's own layout)."""
    from megatron.core.transformer.transformer_layer import get_transformer_layer_offset

    return int(get_transformer_layer_offset(model.config))


def local_name(global_name: str, offset: int) -> str:
    if offset and global_name.startswith(_LAYERS):
        i, rest = global_name[len(_LAYERS):].split(".", 1)
        return f"{_LAYERS}{int(i) - offset}.{rest}"
    return global_name


def stage_of(global_name: str, a: Arch, pp: int) -> int:
    """The pipeline stage that holds a Megatron tensor (layers split evenly, as Megatron does)."""
    if global_name.startswith("embedding."):
        return 0
    if global_name.startswith(_LAYERS):
        return int(global_name[len(_LAYERS):].split(".", 1)[0]) // (a.num_layers // pp)
    return pp - 1  # final norm, output layer


def load_shards(model: Any, mg: dict[str, torch.Tensor], a: Arch) -> None:
    """Copy this rank's tensor-parallel shards of its stage's tensors from the full Megatron
    tensors `mg` (global names). A tied model's last stage keeps its own copy of the embedding
    as output layer (Megatron keeps the two equal by reducing their gradients together)."""
    from megatron.core import parallel_state as ps

    rank, size = ps.get_tensor_model_parallel_rank(), ps.get_tensor_model_parallel_world_size()
    own = model.state_dict()
    off = layer_offset(model)
    sd = {}
    for name, t in mg.items():
        local = local_name(name, off)
        if local in own:
            sd[local] = shard_tp(name, t, rank, size).to(own[local].dtype)
    if a.tied and "output_layer.weight" in own and "embedding.word_embeddings.weight" not in own:
        sd["output_layer.weight"] = shard_tp("output_layer.weight", mg["embedding.word_embeddings.weight"],
                                             rank, size).to(own["output_layer.weight"].dtype)
    missing, unexpected = model.load_state_dict(sd, strict=False)
    missing = [m for m in missing if not m.endswith("_extra_state")]
    if missing or unexpected:
        raise ValueError(f"HF -> megatron: missing {missing}, unexpected {unexpected}")


def gather_hf(model: Any, a: Arch, te: bool) -> Iterator[tuple[str, torch.Tensor]]:
    """COLLECTIVE over every rank of the learner: HF-named CPU tensors on global rank 0 (nothing
    elsewhere). Only data-parallel index 0 takes part (replicas hold the same weights); for each
    tensor its stage's tensor-parallel ranks gather the shards on their first rank, which sends
    the full tensor to rank 0 unless it is rank 0."""
    from megatron.core import parallel_state as ps

    if ps.get_data_parallel_rank() != 0:
        return
    tp_group, tp_size = ps.get_tensor_model_parallel_group(), ps.get_tensor_model_parallel_world_size()
    pp_group, pp_size = ps.get_pipeline_model_parallel_group(), ps.get_pipeline_model_parallel_world_size()
    stage, tp_rank = ps.get_pipeline_model_parallel_rank(), ps.get_tensor_model_parallel_rank()
    leader = dist.get_rank() == 0
    own = model.state_dict(keep_vars=True)
    off = layer_offset(model)
    dev = next(model.parameters()).device
    for name in megatron_names(a, te):
        owner = stage_of(name, a, pp_size)
        full: torch.Tensor | None = None
        fresh = False  # a tensor of its own (not a view of a live parameter)
        if stage == owner:
            full = own[local_name(name, off)].detach()
            if tp_size > 1 and name.endswith(TP_SHARDED):
                shards = [torch.empty_like(full) for _ in range(tp_size)] if tp_rank == 0 else None
                dist.gather(full.contiguous(), shards, dst=dist.get_global_rank(tp_group, 0), group=tp_group)
                full, fresh = (unshard_tp(name, shards) if shards is not None else None), True
                del shards  # only the full tensor lives on while it is handed out
            if owner != 0 and full is not None:  # this stage's first tensor-parallel rank
                dims = [*full.shape, -1][:2]  # Megatron's tensors have 1 or 2 dimensions
                dist.send(torch.tensor(dims, device=dev), dist.get_global_rank(pp_group, 0), group=pp_group)
                dist.send(full.contiguous(), dist.get_global_rank(pp_group, 0), group=pp_group)
                full = None
        elif leader:
            src = dist.get_global_rank(pp_group, owner)
            shape = torch.zeros(2, dtype=torch.long, device=dev)
            dist.recv(shape, src, group=pp_group)
            full = torch.empty(tuple(d for d in shape.tolist() if d >= 0), dtype=next(model.parameters()).dtype,
                               device=dev)
            dist.recv(full, src, group=pp_group)
            fresh = True
        if leader and full is not None:
            # to the CPU before converting (no further device memory), copied unless already
            # fresh: the weights at publish time, whatever training does next
            full = full.to("cpu", copy=not fresh)
            yield from megatron_tensor_to_hf(name, full, a, te)
        del full


SHARD_BYTES = 5 * 10**9  # transformers' save_pretrained default (max_shard_size="5GB")
INDEX = "model.safetensors.index.json"


def save_hf_shards(tensors: Iterable[tuple[str, torch.Tensor]], out: Path,
                   max_shard_bytes: int = SHARD_BYTES) -> list[str]:
    """Write HF-named CPU tensors, as they arrive one at a time, as an HF checkpoint: shards of
    at most `max_shard_bytes` (a larger tensor gets a shard alone) named as transformers names
    them, plus model.safetensors.index.json; a single shard is model.safetensors without an
    index. Only the shard being filled is held, so a whole model never is. Returns the files."""
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    for old in [*out.glob("model*.safetensors"), out / INDEX]:  # a previous save's, sharded otherwise
        old.unlink(missing_ok=True)
    parts: list[list[str]] = []
    shard: dict[str, torch.Tensor] = {}
    size = total = 0

    def flush() -> None:
        # the final names need the number of shards, known only at the end
        save_file(shard, str(out / f"part-{len(parts)}.tmp"), metadata={"format": "pt"})
        parts.append(list(shard))
        shard.clear()

    for name, t in tensors:
        n = t.numel() * t.element_size()
        if shard and size + n > max_shard_bytes:
            flush()
            size = 0
        # a compact tensor of its own: a view (q, k, v of one fused tensor) would keep its base
        # alive and share storage, which safetensors refuses
        shard[name] = t if t.is_contiguous() and t.untyped_storage().nbytes() == n else t.clone(
            memory_format=torch.contiguous_format)
        size, total = size + n, total + n
    if shard:
        flush()
    if not parts:
        raise ValueError(f"{out}: no tensors to write")
    files = (["model.safetensors"] if len(parts) == 1 else
             [f"model-{i + 1:05d}-of-{len(parts):05d}.safetensors" for i in range(len(parts))])
    for i, f in enumerate(files):
        (out / f"part-{i}.tmp").rename(out / f)
    if len(parts) > 1:
        weight_map = {name: f for f, names in zip(files, parts, strict=True) for name in names}
        (out / INDEX).write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2))
        files.append(INDEX)
    return files
