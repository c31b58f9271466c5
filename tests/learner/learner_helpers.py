"""Helpers shared by the learner tests (a tiny model, samples, a test publisher)."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import torch

from broker.wire import Sample

VOCAB = 512


def make_tiny_model(out: Path, tied: bool = True, seed: int = 0, arch: str = "qwen3") -> Path:
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

    common = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                  max_position_embeddings=2048, tie_word_embeddings=tied, rms_norm_eps=1e-6)
    torch.manual_seed(seed)
    if arch == "llama":
        model = LlamaForCausalLM(LlamaConfig(**common))
    else:
        model = Qwen3ForCausalLM(Qwen3Config(**common))
    with torch.no_grad():  # larger-than-default weights so logits are not all ~equal
        gen = torch.Generator().manual_seed(seed)
        for name, p in model.named_parameters():
            if not name.endswith("norm.weight"):
                p.copy_(torch.randn(p.shape, generator=gen) * 0.08)
    model.save_pretrained(out)
    return out


def make_sample(group_id: str, sample_index: int, *, reward: float = 0.0, version: int = 0,
                length: int = 12, prompt_len: int = 5, step_index: int = 0, steps_total: int = 1,
                episode_id: str | None = None, sample_id: str | None = None, masked: bool = False,
                seed: int | None = None, logprob: float = -2.0,
                metrics: dict[str, float] | None = None) -> Sample:
    rng = np.random.default_rng(seed if seed is not None else abs(hash((group_id, sample_index, step_index))) % 2**32)
    tokens = rng.integers(1, VOCAB, size=length).astype(np.int32)
    mask = np.zeros(length, dtype=np.uint8)
    mask[prompt_len:] = 1
    lp = np.where(mask == 1, logprob, 0.0).astype(np.float32)
    return Sample(tokens=tokens, loss_mask=mask, rollout_logprobs=lp, prompt_len=prompt_len,
                  reward=reward, group_id=group_id, sample_index=sample_index, instance_id="inst",
                  policy_version=version, sample_id=sample_id or f"{group_id}/{sample_index}/{step_index}",
                  episode_id=episode_id or f"{group_id}/{sample_index}", step_index=step_index,
                  steps_total=steps_total, masked=masked, metrics=metrics or {})


def true_logprobs(model_dir: Path, samples: list[Sample]) -> None:
    """Set each sample's rollout_logprobs to the model's own (a perfectly on-policy rollout)."""
    from learner.backends.torch_backend import load_hf_model

    model = load_hf_model(model_dir, torch.float32)
    with torch.no_grad():
        for s in samples:
            logits = model(input_ids=torch.from_numpy(s.tokens.astype(np.int64))[None]).logits[0]
            lp = torch.log_softmax(logits[:-1].float(), -1).gather(
                -1, torch.from_numpy(s.tokens[1:].astype(np.int64))[:, None])[:, 0]
            out = np.zeros(len(s.tokens), dtype=np.float32)
            out[1:] = lp.numpy()
            s.rollout_logprobs = np.where(s.loss_mask == 1, out, 0.0).astype(np.float32)


class DirPublisher:
    """Test publisher: saves safetensors under a dir and records the version in the registry."""

    def __init__(self, redis: Any, keys: Any, out: Path) -> None:
        from broker.registry import PolicyRegistry

        self.registry = PolicyRegistry(redis, keys)
        self.out = out
        self.published: list[int] = []

    async def publish(self, version: int, step: int, named_tensors) -> dict[str, Any]:
        from safetensors.torch import save_file

        d = self.out / f"v{version}"
        d.mkdir(parents=True, exist_ok=True)
        save_file({n: t.contiguous().clone() for n, t in named_tensors()}, str(d / "model.safetensors"))
        manifest = {"path": str(d), "format": "safetensors", "step": step, "id": uuid.uuid4().hex}
        (d / "manifest.json").write_text(json.dumps(manifest))
        await self.registry.publish(version, manifest)
        self.published.append(version)
        return manifest

    async def close(self, finish_rollout: bool = False) -> None:
        pass
