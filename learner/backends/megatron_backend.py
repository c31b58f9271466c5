"""The megatron backend: a megatron-core GPTModel built from an HF config (Qwen2/Qwen3/Llama),
weights converted by hf_megatron_convert, checkpoints and published tensors in HF naming.

GPU (the intended use; launched under torchrun): TransformerEngine layer spec, Megatron DDP
(grad buffers, overlapped reduce), the distributed optimizer (get_megatron_optimizer) with
OptimizerParamScheduler, get_forward_backward_func for the micro-batch schedule (pipeline
parallel when pipeline_parallel > 1), packed micro-batches as THD sequences (PackedSeqParams).
CPU (tests): the local layer spec, plain forward/backward and torch AdamW; megatron-core still
allocates on CUDA in a few spots that the tests replace (see tests/learner). The local spec's
RoPE ignores position_ids, so on CPU a packed micro-batch is run as padded rows — the same
slots in the same order, so the loss is unchanged.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from learner.backends.base import clip_and_step
from learner.backends.hf_megatron_convert import (
    Arch,
    hf_to_megatron,
    megatron_to_hf,
    shard_tp,
    unshard_tp,
)
from learner.backends.torch_backend import DTYPES, make_optimizer
from learner.config import LearnerConfig
from learner.logprobs import token_logprobs_entropy
from learner.packing import MicroBatch, _padded


def init_parallel(cfg: LearnerConfig, seed: int = 0) -> None:
    """torch.distributed (env:// under torchrun; a 1-process gloo group otherwise) + Megatron's
    tensor/pipeline groups."""
    import torch.distributed as dist
    from megatron.core import parallel_state as ps

    if not dist.is_initialized():
        cuda = torch.cuda.is_available()
        if "RANK" not in os.environ:
            os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
            os.environ.setdefault("MASTER_PORT", str(_free_port()))
            os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
        if cuda:
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group("nccl" if cuda else "gloo")
    if not ps.model_parallel_is_initialized():
        ps.initialize_model_parallel(tensor_model_parallel_size=cfg.tensor_parallel,
                                     pipeline_model_parallel_size=cfg.pipeline_parallel)
        if torch.cuda.is_available():
            from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed

            model_parallel_cuda_manual_seed(seed)


def _free_port() -> int:
    from common.services import free_port

    return free_port()


def transformer_config(a: Arch, cfg: LearnerConfig, cpu: bool) -> Any:
    from megatron.core.transformer.transformer_config import TransformerConfig

    bf16 = cfg.dtype == "bf16"
    return TransformerConfig(
        num_layers=a.num_layers, hidden_size=a.hidden, num_attention_heads=a.heads,
        num_query_groups=a.groups, kv_channels=a.head_dim, ffn_hidden_size=a.ffn,
        gated_linear_unit=True, activation_func=F.silu, add_bias_linear=False,
        add_qkv_bias=a.qkv_bias, qk_layernorm=a.qk_norm, normalization="RMSNorm",
        layernorm_epsilon=a.norm_eps, hidden_dropout=0.0, attention_dropout=0.0,
        tensor_model_parallel_size=cfg.tensor_parallel, pipeline_model_parallel_size=cfg.pipeline_parallel,
        bf16=bf16, params_dtype=DTYPES[cfg.dtype], pipeline_dtype=DTYPES[cfg.dtype],
        use_cpu_initialization=cpu, bias_dropout_fusion=not cpu, apply_rope_fusion=not cpu,
        masked_softmax_fusion=not cpu, persist_layer_norm=not cpu,
        gradient_accumulation_fusion=False, sequence_parallel=False)


def build_gpt(a: Arch, cfg: LearnerConfig, cpu: bool) -> Any:
    from megatron.core import parallel_state as ps
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import (
        get_gpt_layer_local_spec,
        get_gpt_layer_with_transformer_engine_spec,
    )

    tcfg = transformer_config(a, cfg, cpu)
    if cpu:
        spec = get_gpt_layer_local_spec(qk_layernorm=a.qk_norm, normalization="RMSNorm")
    else:
        spec = get_gpt_layer_with_transformer_engine_spec(qk_layernorm=a.qk_norm)
    model = GPTModel(
        config=tcfg, transformer_layer_spec=spec, vocab_size=padded_vocab(a, cfg),
        max_sequence_length=a.max_pos, pre_process=ps.is_pipeline_first_stage(),
        post_process=ps.is_pipeline_last_stage(), share_embeddings_and_output_weights=a.tied,
        position_embedding_type="rope", rotary_base=int(a.rope_theta))
    return model


def padded_vocab(a: Arch, cfg: LearnerConfig, divisible_by: int = 128) -> int:
    """Megatron pads the vocabulary to a multiple of divisible_by x tensor_parallel (1 rank: none)."""
    if cfg.tensor_parallel == 1:
        return a.vocab
    m = divisible_by * cfg.tensor_parallel
    return -(-a.vocab // m) * m


def load_hf_state(model_dir: str | Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    sd: dict[str, torch.Tensor] = {}
    for f in sorted(Path(model_dir).glob("*.safetensors")):
        sd.update(load_file(str(f)))
    if not sd:
        raise FileNotFoundError(f"{model_dir}: no *.safetensors")
    return sd


class MegatronBackend:
    def __init__(self, cfg: LearnerConfig, model_dir: str | Path,
                 ref_model_dir: str | Path | None = None) -> None:
        from transformers import AutoConfig

        self.cfg = cfg
        self.cpu = not torch.cuda.is_available()
        init_parallel(cfg)
        self.hf_config = AutoConfig.from_pretrained(str(model_dir))
        self.arch = Arch.from_hf(self.hf_config)
        self.te = not self.cpu
        self.model = build_gpt(self.arch, cfg, self.cpu)
        self.load_hf(load_hf_state(model_dir))
        self.model.eval()  # no dropout: proximal logprobs == the training forward's
        self.ref = None
        if cfg.kl_coef and ref_model_dir:
            self.ref = build_gpt(self.arch, cfg, self.cpu)
            self._load_into(self.ref, load_hf_state(ref_model_dir))
            self.ref.requires_grad_(False).eval()
        if self.cpu:
            self.opt, self.sched = make_optimizer(self.model.parameters(), cfg)
            self.ddp = None
        else:
            self._init_gpu_training()

    @property
    def uses_megatron_schedule(self) -> bool:
        """True on GPU: train.train_step hands the micro-batches to train_microbatches."""
        return not self.cpu

    # -- weights in HF naming ------------------------------------------------------------
    def _load_into(self, model: Any, hf_sd: dict[str, torch.Tensor]) -> None:
        from megatron.core import parallel_state as ps

        mg = hf_to_megatron(hf_sd, self.arch, te=self.te, padded_vocab=padded_vocab(self.arch, self.cfg))
        rank, size = ps.get_tensor_model_parallel_rank(), ps.get_tensor_model_parallel_world_size()
        own = model.state_dict()
        sd = {}
        for name, t in mg.items():
            local = _local_name(name, model)
            if local in own:
                sd[local] = shard_tp(name, t, rank, size).to(own[local].dtype)
        missing, unexpected = model.load_state_dict(sd, strict=False)
        missing = [m for m in missing if not m.endswith("_extra_state")]
        if missing or unexpected:
            raise ValueError(f"HF -> megatron: missing {missing}, unexpected {unexpected}")

    def load_hf(self, hf_sd: dict[str, torch.Tensor]) -> None:
        self._load_into(self._module(), hf_sd)

    def megatron_state(self) -> dict[str, torch.Tensor]:
        """Full (TP-gathered) Megatron tensors of this pipeline stage, in global layer numbering."""
        import torch.distributed as dist
        from megatron.core import parallel_state as ps

        size = ps.get_tensor_model_parallel_world_size()
        out = {}
        for name, t in self._module().state_dict().items():
            if name.endswith("_extra_state") or t is None:
                continue
            full = t.detach()
            if size > 1 and _is_tp_sharded(name):
                shards = [torch.empty_like(full) for _ in range(size)]
                dist.all_gather(shards, full.contiguous(), group=ps.get_tensor_model_parallel_group())
                full = unshard_tp(name, shards)
            out[_global_name(name, self._module())] = full
        return out

    def hf_state(self) -> dict[str, torch.Tensor]:
        mg = self.megatron_state()
        if self.arch.tied and "embedding.word_embeddings.weight" not in mg:
            raise RuntimeError("tied model split over pipeline stages: gather the embedding first")
        return megatron_to_hf(mg, self.arch, te=self.te)

    def named_tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        yield from self.hf_state().items()

    # -- forward -------------------------------------------------------------------------
    def _logits(self, model: Any, mb: MicroBatch) -> tuple[torch.Tensor, MicroBatch]:
        if self.cpu or not mb.packed:
            pmb = mb if not mb.packed else _padded(mb.items)
            mask = _padded_mask(pmb.attention_mask)
            logits = model(input_ids=pmb.input_ids, position_ids=pmb.position_ids, attention_mask=mask)
            return _gather_vocab(logits)[pmb.rows, pmb.cols], pmb
        from megatron.core.packed_seq_params import PackedSeqParams

        lens = torch.tensor([len(it.tokens) for it in mb.items], dtype=torch.int32)
        cu = torch.zeros(len(lens) + 1, dtype=torch.int32)
        cu[1:] = lens.cumsum(0)
        dev = torch.cuda.current_device()
        psp = PackedSeqParams(qkv_format="thd", cu_seqlens_q=cu.to(dev), cu_seqlens_kv=cu.to(dev),
                              max_seqlen_q=int(lens.max()), max_seqlen_kv=int(lens.max()))
        logits = model(input_ids=mb.input_ids.to(dev), position_ids=mb.position_ids.to(dev),
                       attention_mask=None, packed_seq_params=psp)
        return _gather_vocab(logits)[mb.rows.to(dev), mb.cols.to(dev)], mb

    def logprobs(self, mb: MicroBatch, *, grad: bool,
                 with_entropy: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        with torch.set_grad_enabled(grad):
            logits, pmb = self._logits(self.ddp or self.model, mb)
            lp, ent = token_logprobs_entropy(logits, pmb.targets.to(logits.device),
                                             self.cfg.rollout_temperature, with_entropy)
        return lp.cpu() if self.cpu else lp, ent

    def ref_logprobs(self, mb: MicroBatch) -> torch.Tensor | None:
        if self.ref is None:
            return None
        with torch.no_grad():
            logits, pmb = self._logits(self.ref, mb)
            return token_logprobs_entropy(logits, pmb.targets.to(logits.device),
                                          self.cfg.rollout_temperature, False)[0]

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()

    def step(self) -> dict[str, float]:
        if not self.cpu:
            return self._gpu_step()
        return clip_and_step(self.model, self.opt, self.sched, self.cfg.grad_clip)

    # -- GPU training: DDP + distributed optimizer + forward_backward_func -----------------
    def _init_gpu_training(self) -> None:
        from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
        from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
        from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler

        self.model.cuda()
        ddp_cfg = DistributedDataParallelConfig(grad_reduce_in_fp32=True, overlap_grad_reduce=True,
                                                use_distributed_optimizer=True)
        self.ddp = DistributedDataParallel(self.model.config, ddp_cfg, self.model)
        ocfg = OptimizerConfig(optimizer="adam", lr=self.cfg.lr, min_lr=self.cfg.lr,
                               weight_decay=self.cfg.weight_decay, adam_beta1=self.cfg.betas[0],
                               adam_beta2=self.cfg.betas[1], adam_eps=self.cfg.eps,
                               clip_grad=self.cfg.grad_clip, bf16=self.cfg.dtype == "bf16",
                               use_distributed_optimizer=True)
        self.opt = get_megatron_optimizer(ocfg, [self.ddp])
        self.sched = OptimizerParamScheduler(
            self.opt, init_lr=0.0 if self.cfg.warmup_steps else self.cfg.lr, max_lr=self.cfg.lr,
            min_lr=self.cfg.lr, lr_warmup_steps=self.cfg.warmup_steps,
            lr_decay_steps=max(1, self.cfg.warmup_steps + 1), lr_decay_style="constant",
            start_wd=self.cfg.weight_decay, end_wd=self.cfg.weight_decay, wd_incr_steps=1,
            wd_incr_style="constant")
        self.ddp.zero_grad_buffer()
        self.opt.zero_grad()

    def train_microbatches(self, mbs: list[MicroBatch], loss_fn) -> list[dict[str, float]]:
        """GPU: run every micro-batch through Megatron's schedule (pipeline-aware).

        loss_fn(logp, entropy, mb) -> (loss, stats) is the generic policy loss; Megatron's
        schedule divides each micro-batch loss by num_microbatches, which we undo because the
        loss is already normalised by the whole batch's token counts.
        """
        from megatron.core.pipeline_parallel import get_forward_backward_func

        n = len(mbs)
        it = iter(mbs)
        stats: list[dict[str, float]] = []

        def forward_step(data_iterator, model):
            mb = next(data_iterator)
            logits, pmb = self._logits(model, mb)

            def loss_func(_output):
                lp, ent = token_logprobs_entropy(logits, pmb.targets.to(logits.device),
                                                 self.cfg.rollout_temperature, True)
                loss, st = loss_fn(lp, ent, pmb)
                st["loss"] = float(loss.detach())
                stats.append(st)
                return loss * n, {}

            return logits, loss_func

        fb = get_forward_backward_func()
        longest = max(int(mb.input_ids.shape[-1]) for mb in mbs)
        fb(forward_step_func=forward_step, data_iterator=it, model=[self.ddp], num_microbatches=n,
           seq_length=longest, micro_batch_size=1, forward_only=False)
        return stats

    def _gpu_step(self) -> dict[str, float]:
        self.ddp.finish_grad_sync()
        lr = self.opt.param_groups[0]["lr"]
        ok, grad_norm, _ = self.opt.step()
        self.sched.step(increment=1)
        self.ddp.zero_grad_buffer()
        self.opt.zero_grad()
        return {"grad_norm": float(grad_norm or 0.0), "lr": float(lr), "skipped": float(not ok)}

    # -- checkpoints -------------------------------------------------------------------------
    def save(self, path: Path) -> None:
        import torch.distributed as dist
        from safetensors.torch import save_file

        path.mkdir(parents=True, exist_ok=True)
        hf = self.hf_state()
        if not dist.is_initialized() or dist.get_rank() == 0:
            (path / "model").mkdir(exist_ok=True)
            save_file({k: v.contiguous().cpu() for k, v in hf.items()}, str(path / "model" / "model.safetensors"))
            self.hf_config.save_pretrained(str(path / "model"))
        if self.cpu:
            torch.save({"optimizer": self.opt.state_dict(), "scheduler": self.sched.state_dict()},
                       path / "optim.pt")
        else:
            self.opt.save_parameter_state(str(path / "optim_param_state.pt"))
            if dist.get_rank() == 0:
                torch.save({"optimizer": self.opt.state_dict(), "scheduler": self.sched.state_dict()},
                           path / "optim.pt")

    def load(self, path: Path) -> None:
        self.load_hf(load_hf_state(path / "model"))
        state = torch.load(path / "optim.pt", weights_only=False)
        self.opt.load_state_dict(state["optimizer"])
        self.sched.load_state_dict(state["scheduler"])
        if not self.cpu:
            self.opt.load_parameter_state(str(path / "optim_param_state.pt"))

    def _module(self) -> Any:
        return self.model


def _padded_mask(att2d: torch.Tensor) -> torch.Tensor:
    """Megatron's convention: True = masked out. Causal within each row's real tokens."""
    n = att2d.shape[1]
    causal = torch.ones(n, n, dtype=torch.bool).tril()
    keep = causal[None] & att2d.bool()[:, None, :]
    return ~keep[:, None]


def _gather_vocab(logits: torch.Tensor) -> torch.Tensor:
    """GPTModel returns [b, s, V/tp] under tensor parallelism: gather the vocabulary."""
    from megatron.core import parallel_state as ps

    if ps.get_tensor_model_parallel_world_size() == 1:
        return logits
    from megatron.core.tensor_parallel import gather_from_tensor_model_parallel_region

    return gather_from_tensor_model_parallel_region(logits)


def _is_tp_sharded(name: str) -> bool:
    return name.endswith(("linear_qkv.weight", "linear_qkv.bias", "word_embeddings.weight",
                          "output_layer.weight", "linear_proj.weight", "linear_fc1.weight",
                          "linear_fc2.weight"))


def _layer_offset(model: Any) -> int:
    from megatron.core import parallel_state as ps

    pp = ps.get_pipeline_model_parallel_world_size()
    if pp == 1:
        return 0
    return ps.get_pipeline_model_parallel_rank() * (model.config.num_layers // pp)


def _local_name(global_name: str, model: Any) -> str:
    """decoder.layers.<global i> -> this pipeline stage's local index."""
    off = _layer_offset(model)
    if off and global_name.startswith("decoder.layers."):
        i, rest = global_name[len("decoder.layers."):].split(".", 1)
        return f"decoder.layers.{int(i) - off}.{rest}"
    return global_name


def _global_name(local_name: str, model: Any) -> str:
    off = _layer_offset(model)
    if off and local_name.startswith("decoder.layers."):
        i, rest = local_name[len("decoder.layers."):].split(".", 1)
        return f"decoder.layers.{int(i) + off}.{rest}"
    return local_name
