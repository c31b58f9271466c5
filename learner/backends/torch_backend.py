"""The torch backend: a transformers causal LM trained with torch AdamW (the CPU default).

Under torchrun every rank holds the whole model, wrapped in torch's DistributedDataParallel
(gloo on CPU, NCCL on GPUs): each rank trains its shard of the step, gradients are reduced once
per step (no_sync on every micro-batch but the last), so every rank takes the same optimizer
step and the replicas stay equal; rank 0 saves and publishes them."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from learner.backends.base import LossFn, accumulate, clip_and_step
from learner.config import LearnerConfig
from learner.logprobs import token_logprobs_entropy
from learner.packing import MicroBatch

if TYPE_CHECKING:
    from transformers import PreTrainedModel

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def load_hf_model(model_dir: str | Path, dtype: torch.dtype) -> PreTrainedModel:
    from transformers import AutoModelForCausalLM

    from learner.varlen_attention import register

    # swarl_varlen: per-sample attention for packed rows, SDPA otherwise; eval() turns dropout
    # off so the recomputed proximal logprobs equal those of the forward that trains
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=dtype,
                                                 attn_implementation=register())
    return model.eval()


def make_optimizer(params, cfg: LearnerConfig) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler]:
    opt = torch.optim.AdamW(params, lr=cfg.lr, betas=cfg.betas, eps=cfg.eps,
                            weight_decay=cfg.weight_decay)
    warm = max(0, cfg.warmup_steps)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda step: min(1.0, (step + 1) / warm) if warm else 1.0)
    return opt, sched


class TorchBackend:
    def __init__(self, cfg: LearnerConfig, model_dir: str | Path,
                 ref_model_dir: str | Path | None = None) -> None:
        self.cfg = cfg
        self.dtype = DTYPES[cfg.dtype]
        self.model = load_hf_model(model_dir, self.dtype)
        self.ref = None
        if cfg.kl_coef and ref_model_dir:
            self.ref = load_hf_model(ref_model_dir, self.dtype)
            self.ref.requires_grad_(False)
        self.opt, self.sched = make_optimizer(self.model.parameters(), cfg)
        self.ddp: Any = None
        self._rank, self._world = 0, 1
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            from torch.nn.parallel import DistributedDataParallel

            self._rank, self._world = dist.get_rank(), dist.get_world_size()
            # replicas start from rank 0's parameters (DDP broadcasts them here)
            self.ddp = DistributedDataParallel(self.model, gradient_as_bucket_view=True)

    @property
    def dp_rank(self) -> int:
        return self._rank

    @property
    def dp_size(self) -> int:
        return self._world

    @property
    def loss_sees_every_microbatch(self) -> bool:
        return True

    def _logits(self, model: Any, mb: MicroBatch) -> torch.Tensor:
        kw: dict[str, Any] = {}
        if mb.packed and self.cfg.attention == "varlen":
            cu = mb.cu_seqlens
            assert cu is not None
            longest = int((cu[1:] - cu[:-1]).max())
            kw = {"cu_seq_lens_q": cu, "cu_seq_lens_k": cu, "max_length_q": longest,
                  "max_length_k": longest}
            mask = None
        else:
            mask = mb.block_mask() if mb.packed else mb.attention_mask
        if mb.input_ids.shape[0] == 1:
            # one row (packed): the model's head runs at the slots only (transformers'
            # logits_to_keep takes positions), not over the vocabulary at every prompt token
            out = model(input_ids=mb.input_ids, position_ids=mb.position_ids, attention_mask=mask,
                        use_cache=False, logits_to_keep=mb.cols, **kw)
            return out.logits[0]
        out = model(input_ids=mb.input_ids, position_ids=mb.position_ids, attention_mask=mask,
                    use_cache=False, **kw)
        return out.logits[mb.rows, mb.cols]

    def logprobs(self, mb: MicroBatch, *, grad: bool,
                 with_entropy: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        with torch.set_grad_enabled(grad):
            logits = self._logits(self.model, mb)
            return token_logprobs_entropy(logits, mb.targets, self.cfg.rollout_temperature,
                                          with_entropy)

    def ref_logprobs(self, mb: MicroBatch) -> torch.Tensor | None:
        if self.ref is None:
            return None
        with torch.no_grad():
            logits = self._logits(self.ref, mb)
            return token_logprobs_entropy(logits, mb.targets, self.cfg.rollout_temperature, False)[0]

    def train_microbatches(self, mbs: list[MicroBatch], loss_fn: LossFn) -> list[dict[str, float]]:
        def forward(mb: MicroBatch) -> tuple[torch.Tensor, torch.Tensor | None]:
            logits = self._logits(self.ddp or self.model, mb)
            return token_logprobs_entropy(logits, mb.targets, self.cfg.rollout_temperature, True)

        # DDP averages over ranks: scaling by their number makes the reduced gradient the sum
        return accumulate(mbs, loss_fn, forward, self._no_sync, scale=float(self._world))

    def _no_sync(self) -> AbstractContextManager[None]:
        return self.ddp.no_sync() if self.ddp is not None else nullcontext()

    def step(self, max_norm: float | None = None) -> dict[str, float]:
        return clip_and_step(self.model, self.opt, self.sched, self.cfg.grad_clip, max_norm)

    def params_snapshot(self) -> list[torch.Tensor]:
        return [p.detach().clone() for p in self.model.parameters()]

    def params_blend(self, before: list[torch.Tensor], after: list[torch.Tensor], alpha: float) -> None:
        with torch.no_grad():
            for p, b, a in zip(self.model.parameters(), before, after, strict=True):
                p.copy_(torch.lerp(b, a, alpha))

    def dp_sum(self, x: float) -> float:
        if self.ddp is None:
            return x
        t = torch.tensor([x], dtype=torch.float64)
        dist.all_reduce(t)
        return float(t.item())

    def named_tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        """This rank's replica in HF naming (a tied lm_head is listed once, as the embedding)."""
        for name, p in self.model.named_parameters():
            yield name, p.detach()

    def publish_tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        # every replica is equal: rank 0 hands out its own, no gathering
        if self._rank == 0:
            yield from self.named_tensors()

    def save(self, path: Path) -> None:
        if self._rank != 0:
            return  # equal replicas: rank 0 writes model and optimizer alone
        path.mkdir(parents=True, exist_ok=True)
        self.model.save_pretrained(str(path / "model"))
        torch.save({"optimizer": self.opt.state_dict(), "scheduler": self.sched.state_dict()},
                   path / "optim.pt")

    def load(self, path: Path) -> None:
        from safetensors.torch import load_file

        # a file at a time into the model: what is held beside it is one shard, not a copy of it
        loaded: set[str] = set()
        unexpected: list[str] = []
        for f in sorted((path / "model").glob("*.safetensors")):
            sd = load_file(str(f))
            loaded.update(sd)
            unexpected += self.model.load_state_dict(sd, strict=False).unexpected_keys
            del sd
        tied = {"lm_head.weight"} if getattr(self.model.config, "tie_word_embeddings", False) else set()
        missing = set(self.model.state_dict()) - loaded - tied
        if missing or unexpected:
            raise ValueError(f"checkpoint {path}: missing {sorted(missing)}, "
                             f"unexpected {sorted(unexpected)}")
        state = torch.load(path / "optim.pt", weights_only=False)
        self.opt.load_state_dict(state["optimizer"])
        self.sched.load_state_dict(state["scheduler"])
