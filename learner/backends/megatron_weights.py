"""A Megatron GPTModel's weights in HF naming, across its ranks: every rank loads its own
tensor-parallel shard of its own pipeline stage, reading only those rows or columns of the HF
checkpoint (`HFSource`: safetensors get_slice; a fused qkv or fc1 shard is built from the slices
of q/k/v or gate/up it needs), and publishing brings the model to global rank 0 a Megatron
tensor at a time (tensor-parallel shards gathered on the stage that holds the tensor, then sent
from that stage to rank 0 in buckets), never the whole model at once; checkpoints are written
from that stream in bounded shards (`save_hf_shards`).

Global Megatron names (hf_megatron_convert.megatron_names) number layers over the whole model;
a pipeline stage's module numbers its own layers from 0 (`offset` is its first global layer).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from learner.backends.hf_megatron_convert import (
    Arch,
    fuse_qkv,
    layer_names,
    megatron_names,
    megatron_tensor_to_hf,
    unshard_tp,
)

_LAYERS = "decoder.layers."
SHARD_BYTES = 5 * 10**9  # transformers' save_pretrained default (max_shard_size="5GB")
BUCKET_BYTES = 64 << 20  # a pipeline stage's tensors per message to rank 0 when publishing
INDEX = "model.safetensors.index.json"
# tensor-parallel shards joined by rows (torch.cat(shards, 0), hf_megatron_convert.unshard_tp)
_ROWS_SHARDED = ("linear_qkv.weight", "linear_qkv.bias", "word_embeddings.weight", "output_layer.weight")
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


class HFSource:
    """An HF checkpoint's tensors, read a slice at a time: a directory of safetensors (each read
    opens the file that holds the tensor, takes the rows or columns asked for with
    safe_open(...).get_slice and closes it, so neither the file's other tensors nor the rest of
    this one are read or stay mapped), or tensors already in memory."""

    def __init__(self, src: str | Path | Mapping[str, torch.Tensor]) -> None:
        self.mem: Mapping[str, torch.Tensor] | None = None
        self.where: dict[str, Path] = {}
        if isinstance(src, Mapping):
            self.mem = src
            return
        from safetensors import safe_open

        d = Path(src)
        index = d / INDEX
        if index.exists():
            self.where = {n: d / f for n, f in json.loads(index.read_text())["weight_map"].items()}
        else:
            for f in sorted(d.glob("*.safetensors")):
                with safe_open(str(f), "pt") as h:
                    self.where.update(dict.fromkeys(h.keys(), f))
        if not self.where:
            raise ValueError(f"{d}: no safetensors weights (model.safetensors or {INDEX})")

    def read(self, name: str, dim: int = 0, start: int | None = None, stop: int | None = None) -> torch.Tensor:
        """Tensor `name`, or its [start, stop) range along `dim` (0 or 1)."""
        if self.mem is not None:
            if name not in self.mem:
                raise KeyError(f"HF tensor {name!r} missing")
            t = self.mem[name]
            return t if start is None or stop is None else t.narrow(dim, start, stop - start)
        from safetensors import safe_open

        if name not in self.where:
            raise KeyError(f"HF tensor {name!r} missing from the checkpoint")
        with safe_open(str(self.where[name]), "pt") as h:
            sl = h.get_slice(name)
            if start is None:
                return sl[:]
            return sl[start:stop] if dim == 0 else sl[:, start:stop]


def _range(n: int, rank: int, size: int, what: str) -> tuple[int, int]:
    if n % size:
        raise ValueError(f"{what} ({n}) is not divisible by learner.tensor_parallel={size}")
    per = n // size
    return rank * per, (rank + 1) * per


def read_tp_shard(src: HFSource, name: str, a: Arch, te: bool, rank: int, size: int,
                  padded_vocab: int) -> torch.Tensor:
    """This tensor-parallel rank's shard of Megatron tensor `name` (global numbering), read from
    the HF checkpoint's slices; the same tensor as shard_tp(name, full, rank, size) of the full
    converted one (hf_megatron_convert), never building that."""
    if name in ("embedding.word_embeddings.weight", "output_layer.weight"):
        hf = "model.embed_tokens.weight" if name.startswith("embedding") or a.tied else "lm_head.weight"
        lo, hi = _range(padded_vocab, rank, size, "the padded vocabulary")
        real = src.read(hf, 0, lo, min(hi, a.vocab)) if lo < a.vocab else None
        if real is not None and real.shape[0] == hi - lo:
            return real
        cols = a.hidden if real is None else real.shape[1]
        pad = torch.zeros(hi - lo - (0 if real is None else real.shape[0]), cols,
                          dtype=torch.float32 if real is None else real.dtype)
        return pad if real is None else torch.cat([real, pad], 0)
    if name == "decoder.final_layernorm.weight":
        return src.read("model.norm.weight")
    i = int(name.split(".")[2])
    h = f"model.layers.{i}."
    role = {v: k for k, v in layer_names(te, i).items()}.get(name)
    if role in ("qkv", "qkv_bias"):
        kind = "weight" if role == "qkv" else "bias"
        g0, g1 = _range(a.groups, rank, size, "num_key_value_heads")
        per, d = a.heads // a.groups, a.head_dim
        q = src.read(f"{h}self_attn.q_proj.{kind}", 0, g0 * per * d, g1 * per * d)
        k = src.read(f"{h}self_attn.k_proj.{kind}", 0, g0 * d, g1 * d)
        v = src.read(f"{h}self_attn.v_proj.{kind}", 0, g0 * d, g1 * d)
        return fuse_qkv(q, k, v, dataclasses.replace(a, heads=(g1 - g0) * per, groups=g1 - g0))
    if role == "fc1":  # column-parallel, gate and up each cut
        lo, hi = _range(a.ffn, rank, size, "intermediate_size")
        return torch.cat([src.read(h + "mlp.gate_proj.weight", 0, lo, hi),
                          src.read(h + "mlp.up_proj.weight", 0, lo, hi)], 0)
    if role == "proj":  # row-parallel
        lo, hi = _range(a.heads * a.head_dim, rank, size, "num_attention_heads x head_dim")
        return src.read(h + "self_attn.o_proj.weight", 1, lo, hi)
    if role == "fc2":
        lo, hi = _range(a.ffn, rank, size, "intermediate_size")
        return src.read(h + "mlp.down_proj.weight", 1, lo, hi)
    single = {"in_norm": "input_layernorm.weight", "q_norm": "self_attn.q_norm.weight",
              "k_norm": "self_attn.k_norm.weight", "mlp_norm": "post_attention_layernorm.weight"}
    if role not in single:
        raise KeyError(f"{name}: not a Megatron tensor of a {a.model_type} model")
    return src.read(h + single[role])


def load_shards(model: Any, src: HFSource, a: Arch, te: bool, padded_vocab: int) -> None:
    """Copy this rank's tensor-parallel shards of its stage's tensors into `model`, one tensor
    at a time, each read from the checkpoint's slices (`read_tp_shard`): a rank reads about its
    own share of the checkpoint and holds one shard beside the model. A tied model's last stage
    keeps its own copy of the embedding as output layer (Megatron keeps the two equal by
    reducing their gradients together)."""
    from megatron.core import parallel_state as ps

    rank, size = ps.get_tensor_model_parallel_rank(), ps.get_tensor_model_parallel_world_size()
    own = model.state_dict(keep_vars=True)
    off = layer_offset(model)
    names = megatron_names(a, te)
    if a.tied and "output_layer.weight" in own and "embedding.word_embeddings.weight" not in own:
        names.append("output_layer.weight")
    done = set()
    with torch.no_grad():
        for name in names:
            local = local_name(name, off)
            if local not in own:
                continue
            t = read_tp_shard(src, name, a, te, rank, size, padded_vocab)
            if t.shape != own[local].shape:
                raise ValueError(f"HF -> megatron: {name} shard {tuple(t.shape)}, the model's is "
                                 f"{tuple(own[local].shape)}")
            own[local].copy_(t)
            done.add(local)
            del t
    missing = [k for k in own if k not in done and not k.endswith("_extra_state")]
    if missing:
        raise ValueError(f"HF -> megatron: missing {missing}")


def gather_hf(model: Any, a: Arch, te: bool,
              bucket_bytes: int = BUCKET_BYTES) -> Iterator[tuple[str, torch.Tensor]]:
    """COLLECTIVE over every rank of the learner: HF-named CPU tensors on global rank 0 (nothing
    elsewhere). Only data-parallel index 0 takes part (replicas hold the same weights); for each
    tensor its stage's tensor-parallel ranks gather the shards on their first rank. Rank 0's own
    stage hands its tensors out as they are gathered; every other stage's first rank sends its
    full tensors to rank 0 in buckets (`_Bucket`) of about `bucket_bytes`, so rank 0 holds one
    bucket (or one tensor larger than that) of another stage at a time."""
    from megatron.core import parallel_state as ps

    if ps.get_data_parallel_rank() != 0:
        return
    tp_group, tp_size = ps.get_tensor_model_parallel_group(), ps.get_tensor_model_parallel_world_size()
    pp_group, pp_size = ps.get_pipeline_model_parallel_group(), ps.get_pipeline_model_parallel_world_size()
    stage, tp_rank = ps.get_pipeline_model_parallel_rank(), ps.get_tensor_model_parallel_rank()
    leader = dist.get_rank() == 0
    own = model.state_dict(keep_vars=True)
    off = layer_offset(model)
    param = next(model.parameters())
    names = megatron_names(a, te)
    last_of_stage = {stage_of(n, a, pp_size): n for n in names}
    outgoing = _Bucket(dist.get_global_rank(pp_group, 0), pp_group, param)
    incoming: dict[int, list[torch.Tensor]] = {}
    for name in names:
        owner = stage_of(name, a, pp_size)
        full: torch.Tensor | None = None
        fresh = False  # a tensor of its own (not a view of a live parameter)
        if stage == owner:
            full = own[local_name(name, off)].detach()
            if tp_size > 1 and name.endswith(TP_SHARDED):
                whole, shards = None, None
                if tp_rank == 0 and name.endswith(_ROWS_SHARDED):
                    # shards stacked by rows are the full tensor's row blocks: gathered in place,
                    # with no second copy to join them
                    whole = torch.empty(full.shape[0] * tp_size, *full.shape[1:], dtype=full.dtype,
                                        device=full.device)
                    shards = list(whole.chunk(tp_size))
                elif tp_rank == 0:
                    shards = [torch.empty_like(full) for _ in range(tp_size)]
                dist.gather(full.contiguous(), shards, dst=dist.get_global_rank(tp_group, 0), group=tp_group)
                if whole is None and shards is not None:
                    whole = unshard_tp(name, shards)
                full, fresh = whole, True
                del shards, whole  # only the full tensor lives on while it is handed out
            if owner != 0 and full is not None:  # this stage's first tensor-parallel rank
                outgoing.add(full)
                if outgoing.nbytes >= bucket_bytes or name == last_of_stage[owner]:
                    outgoing.send()
                full = None
        elif leader:
            queue = incoming.setdefault(owner, [])
            if not queue:
                queue += _Bucket.receive(dist.get_global_rank(pp_group, owner), pp_group, param)
            full, fresh = queue.pop(0), True
        if leader and full is not None:
            # to the CPU before converting (no further device memory), copied unless already
            # fresh: the weights at publish time, whatever training does next
            full = full.to("cpu", copy=not fresh)
            yield from megatron_tensor_to_hf(name, full, a, te)
        del full


class _Bucket:
    """Full tensors of a pipeline stage on their way to rank 0, several per message (as slime
    buckets its weight updates): one header (the count), the shapes, then every tensor's data
    back to back in one flat tensor."""

    def __init__(self, dst: int, group: Any, like: torch.Tensor) -> None:
        self.dst, self.group, self.device, self.dtype = dst, group, like.device, like.dtype
        self.tensors: list[torch.Tensor] = []
        self.nbytes = 0

    def add(self, t: torch.Tensor) -> None:
        if t.dtype != self.dtype:  # the receiver reads the flat data as the model's dtype
            raise ValueError(f"publishing: a {t.dtype} tensor in a {self.dtype} model")
        self.tensors.append(t)
        self.nbytes += t.numel() * t.element_size()

    def send(self) -> None:
        dims = [d for t in self.tensors for d in [*t.shape, -1][:2]]  # 1 or 2 dimensions each
        dist.send(torch.tensor([len(self.tensors)], device=self.device), self.dst, group=self.group)
        dist.send(torch.tensor(dims, device=self.device), self.dst, group=self.group)
        flat = torch.cat([t.reshape(-1) for t in self.tensors])
        self.tensors, self.nbytes = [], 0
        dist.send(flat, self.dst, group=self.group)

    @staticmethod
    def receive(src: int, group: Any, like: torch.Tensor) -> list[torch.Tensor]:
        """One bucket from `src`: its tensors, views of one CPU tensor."""
        n = torch.zeros(1, dtype=torch.long, device=like.device)
        dist.recv(n, src, group=group)
        dims = torch.zeros(2 * int(n), dtype=torch.long, device=like.device)
        dist.recv(dims, src, group=group)
        shapes = [tuple(d for d in pair if d >= 0) for pair in dims.view(-1, 2).tolist()]
        sizes = [int(torch.Size(s).numel()) for s in shapes]
        flat = torch.empty(sum(sizes), dtype=like.dtype, device=like.device)
        dist.recv(flat, src, group=group)
        flat = flat.to("cpu")  # one copy off the device for the whole bucket
        return [part.view(s) for part, s in zip(flat.split(sizes), shapes, strict=True)]


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
        if size >= max_shard_bytes:  # full: written now, not held while the next is gathered
            flush()
            size = 0
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
