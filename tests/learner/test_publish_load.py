"""Loading and publishing at scale, the parts that need no process group: a tensor-parallel rank
reads only its slices of an HF checkpoint (and gets the same shard as cutting the full converted
tensor), a version is written to disk shard by shard as its tensors stream in, and the learner's
command channel refuses a model-sized answer."""

from __future__ import annotations

import json
import weakref
from pathlib import Path

import pytest
import torch
from learner_helpers import make_tiny_model

from learner.backends.hf_megatron_convert import Arch, hf_to_megatron, megatron_names, shard_tp
from learner.backends.megatron_weights import HFSource, read_tp_shard
from learner.ranks import MAX_REPLY_BYTES, Reply, ReplyTooLarge, _small
from weight_sync import checkpoints


class CountingSource(HFSource):
    """An HFSource that counts the elements it hands out (what a rank reads)."""

    def __init__(self, src: Path) -> None:
        super().__init__(src)
        self.elements = 0

    def read(self, name: str, dim: int = 0, start: int | None = None, stop: int | None = None) -> torch.Tensor:
        t = super().read(name, dim, start, stop)
        self.elements += t.numel()
        return t


def _qwen2_untied_odd_vocab(out: Path) -> Path:
    """qkv biases, an lm_head of its own and a vocabulary that tensor parallelism pads."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(1)
    Qwen2ForCausalLM(Qwen2Config(vocab_size=500, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                 num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                                 tie_word_embeddings=False)).save_pretrained(out, max_shard_size="100KB")
    return out


@pytest.mark.parametrize("kind", ["qwen3_tied", "qwen2_untied_sharded"])
@pytest.mark.parametrize("te", [False, True])
def test_each_rank_reads_only_its_slices(tmp_path: Path, kind: str, te: bool) -> None:
    from safetensors.torch import load_file

    d = (make_tiny_model(tmp_path / "m") if kind == "qwen3_tied"
         else _qwen2_untied_odd_vocab(tmp_path / "m"))
    if kind != "qwen3_tied":
        assert (d / "model.safetensors.index.json").exists()  # several files, found by the index
    hf = {k: v for f in sorted(d.glob("*.safetensors")) for k, v in load_file(f).items()}
    a = Arch.from_hf(json.loads((d / "config.json").read_text()))
    hf_elements = sum(t.numel() for t in hf.values())
    replicated = sum(t.numel() for k, t in hf.items() if k.endswith("norm.weight"))
    for size in (1, 2):
        padded = -(-a.vocab // (128 * size)) * 128 * size if size > 1 else a.vocab
        full = hf_to_megatron(hf, a, te=te, padded_vocab=padded)
        read = 0
        for rank in range(size):
            src = CountingSource(d)
            for name in megatron_names(a, te):
                got = read_tp_shard(src, name, a, te, rank, size, padded)
                assert torch.equal(got, shard_tp(name, full[name], rank, size)), (size, rank, name)
            read += src.elements
        # together the ranks read the checkpoint once, the norms once per rank: no rank reads
        # another's rows or columns, and none builds a full fused tensor
        assert read == hf_elements + (size - 1) * replicated


def test_in_memory_source_gives_the_same_shards(tmp_path: Path) -> None:
    from safetensors.torch import load_file

    d = make_tiny_model(tmp_path / "m")
    a = Arch.from_hf(json.loads((d / "config.json").read_text()))
    mem = HFSource(load_file(d / "model.safetensors"))
    disk = HFSource(d)
    for name in megatron_names(a):
        assert torch.equal(read_tp_shard(mem, name, a, False, 1, 2, 512),
                           read_tp_shard(disk, name, a, False, 1, 2, 512)), name
    with pytest.raises(KeyError, match=r"lm_head\.weight"):
        disk.read("lm_head.weight")  # a tied model has none


def test_version_is_written_shard_by_shard_as_it_streams(tmp_path: Path) -> None:
    """write_checkpoint holds the shard being filled, never the tensors of shards written."""
    from safetensors import safe_open

    shard_mb = 0.01  # 10 KiB: 4 tensors of 2.5 KiB each per shard
    alive: list[weakref.ref[torch.Tensor]] = []
    most = 0

    def stream():
        nonlocal most
        for i in range(16):
            most = max(most, sum(1 for r in alive if r() is not None))
            t = torch.full((640,), float(i)) if i % 2 else torch.full((1280,), float(i)).to(torch.bfloat16)
            alive.append(weakref.ref(t))
            yield f"t{i}", t

    m = checkpoints.write_checkpoint(tmp_path, 1, 1, stream(), None, shard_mb=shard_mb)
    assert most <= 4  # the old writer gathered all 16 before writing any
    shards = sorted(f for f in m["files"] if f.endswith(".safetensors"))
    assert len(shards) == 4 and m["tensors"] == 16
    checkpoints.verify(m)
    seen = {}
    for f in shards:
        with safe_open(str(Path(m["path"]) / f), "pt") as h:
            seen.update({k: h.get_tensor(k) for k in h.keys()})
    for i in range(16):
        assert seen[f"t{i}"].dtype == (torch.float32 if i % 2 else torch.bfloat16)
        assert torch.all(seen[f"t{i}"] == float(i))


def test_a_failed_write_closes_the_stream_in_its_thread(tmp_path: Path) -> None:
    """The learner's stream drains its collective when closed: a consumer that fails closes it."""
    closed = []

    def stream():
        try:
            yield "a", torch.ones(2)
            yield "a", torch.ones(2)  # a name twice: refused
            yield "b", torch.ones(2)
        finally:
            closed.append(True)

    with pytest.raises(checkpoints.CheckpointError, match="appears twice"):
        checkpoints.write_checkpoint(tmp_path, 1, 1, stream(), None)
    assert closed == [True]
    assert not any(checkpoints.weights_root(tmp_path).iterdir())


def test_command_channel_refuses_a_model_sized_answer() -> None:
    assert _small(Reply({"loss": 1.0})).result == {"loss": 1.0}
    with pytest.raises(ReplyTooLarge, match=r"answer of \d+ bytes .*command channel: list"):
        _small(Reply([("w", torch.zeros(MAX_REPLY_BYTES // 4 + 1))]))
