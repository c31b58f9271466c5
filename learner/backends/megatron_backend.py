"""The megatron backend: a megatron-core GPTModel built from an HF config (Qwen2/Qwen3/Llama),
weights converted by hf_megatron_convert, checkpoints and published tensors in HF naming.

Training runs Megatron's own machinery, wired as Megatron-LM's trainer wires it: the DDP wrapper
(contiguous grad buffers, bucketed reduce, overlapped with the backward of the last micro-batch
when learner.overlap_grad_reduce), get_megatron_optimizer (the distributed optimizer when
learner.use_distributed_optimizer) with OptimizerParamScheduler, and get_forward_backward_func
with `no_sync_func` (only the last micro-batch of a step reduces), `finalize_model_grads_func`
(wait for / issue the reductions once per step) and `grad_scale_func`.

GPU with TransformerEngine: TE's layer spec, packed micro-batches as THD sequences
(PackedSeqParams). Without TE (CPU, or a CUDA machine without it; megatron_env decides and logs
it once): the local layer spec with the fusions that need TE or apex off (megatron_env.
TE_ONLY_FUSIONS); on CPU (tests, over gloo) megatron_cpu's stand-ins answer megatron-core's
CUDA-only spots. The local spec's RoPE ignores position_ids, so there a packed micro-batch is run
as padded rows: the same slots in the same order, so the loss is unchanged.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

from learner.backends.base import LossFn, clip_at
from learner.backends.hf_megatron_convert import Arch
from learner.backends.megatron_cpu import maybe_cpu_standins
from learner.backends.megatron_env import check_megatron_core, use_transformer_engine
from learner.backends.megatron_head import vocab_parallel_logprobs
from learner.backends.megatron_weights import (
    SHARD_BYTES,
    HFSource,
    gather_hf,
    load_shards,
    save_hf_shards,
)
from learner.backends.torch_backend import DTYPES
from learner.config import LearnerConfig
from learner.packing import MicroBatch, _padded


def init_parallel(cfg: LearnerConfig, seed: int = 0) -> None:
    """Megatron's model-parallel groups over the default process group, which the learner has
    set up (learner.ranks); a lone process without torchrun gets a one-rank group here."""
    from megatron.core import parallel_state as ps

    if not dist.is_initialized():
        from common.services import free_port

        cuda = torch.cuda.is_available()
        dist.init_process_group("nccl" if cuda else "gloo", init_method=f"tcp://127.0.0.1:{free_port()}",
                                rank=0, world_size=1)
    tp, pp, world = cfg.tensor_parallel, cfg.pipeline_parallel, dist.get_world_size()
    if world % (tp * pp):
        raise ValueError(f"learner.tensor_parallel={tp} x learner.pipeline_parallel={pp} does not "
                         f"divide the {world} ranks of the learner")
    if ps.model_parallel_is_initialized():
        have = (ps.get_tensor_model_parallel_world_size(), ps.get_pipeline_model_parallel_world_size())
        if have != (tp, pp):
            raise RuntimeError(f"megatron's groups are already set up for tensor x pipeline = {have}, "
                               f"not learner.tensor_parallel={tp} x learner.pipeline_parallel={pp}")
        return
    ps.initialize_model_parallel(tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp)
    if torch.cuda.is_available():
        from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed

        model_parallel_cuda_manual_seed(seed)


def transformer_config(a: Arch, cfg: LearnerConfig, cpu: bool, te: bool) -> Any:
    """`te`: the TransformerEngine layer spec (megatron_env.use_transformer_engine); without it
    the fusions that need TE or apex are off, else megatron-core refuses the config."""
    from megatron.core.transformer.transformer_config import TransformerConfig

    recompute: dict[str, Any] = {}
    if cfg.recompute == "selective":
        recompute = {"recompute_granularity": "selective"}
    elif cfg.recompute == "full":
        recompute = {"recompute_granularity": "full", "recompute_method": "uniform", "recompute_num_layers": 1}
    return TransformerConfig(
        num_layers=a.num_layers, hidden_size=a.hidden, num_attention_heads=a.heads,
        num_query_groups=a.groups, kv_channels=a.head_dim, ffn_hidden_size=a.ffn,
        gated_linear_unit=True, activation_func=F.silu, add_bias_linear=False,
        add_qkv_bias=a.qkv_bias, qk_layernorm=a.qk_norm, normalization="RMSNorm",
        layernorm_epsilon=a.norm_eps, hidden_dropout=0.0, attention_dropout=0.0,
        tensor_model_parallel_size=cfg.tensor_parallel, pipeline_model_parallel_size=cfg.pipeline_parallel,
        bf16=cfg.dtype == "bf16", params_dtype=DTYPES[cfg.dtype], pipeline_dtype=DTYPES[cfg.dtype],
        # dropout 0: the training forward runs in train mode (recompute) and must give the
        # numbers the no-grad passes give
        use_cpu_initialization=cpu, bias_dropout_fusion=not cpu, apply_rope_fusion=te,
        masked_softmax_fusion=te, persist_layer_norm=te,
        gradient_accumulation_fusion=False, sequence_parallel=False,
        # micro-batches differ in length: pipeline stages exchange each activation's shape
        # first (the MoE dispatcher setting only satisfies a check; the model is dense)
        variable_seq_lengths=cfg.pipeline_parallel > 1,
        moe_token_dispatcher_type="alltoall" if cfg.pipeline_parallel > 1 else "allgather",
        **recompute)


def build_gpt(a: Arch, cfg: LearnerConfig, cpu: bool, te: bool) -> Any:
    from megatron.core import parallel_state as ps
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import (
        get_gpt_layer_local_spec,
        get_gpt_layer_with_transformer_engine_spec,
    )

    tcfg = transformer_config(a, cfg, cpu, te)
    if te:
        spec = get_gpt_layer_with_transformer_engine_spec(qk_layernorm=a.qk_norm)
    else:
        spec = get_gpt_layer_local_spec(qk_layernorm=a.qk_norm, normalization="RMSNorm")
    r = a.rope
    return GPTModel(
        config=tcfg, transformer_layer_spec=spec, vocab_size=padded_vocab(a, cfg),
        max_sequence_length=a.max_pos, pre_process=ps.is_pipeline_first_stage(),
        post_process=ps.is_pipeline_last_stage(), share_embeddings_and_output_weights=a.tied,
        position_embedding_type="rope", rotary_base=r.theta,  # a float base is used as such (annotated int)
        rope_scaling=r.kind == "llama3", rope_scaling_factor=r.factor if r.kind == "llama3" else 8.0,
        seq_len_interpolation_factor=r.factor if r.kind == "linear" else None)


def padded_vocab(a: Arch, cfg: LearnerConfig, divisible_by: int = 128) -> int:
    """Megatron pads the vocabulary to a multiple of divisible_by x tensor_parallel (1 rank: none)."""
    if cfg.tensor_parallel == 1:
        return a.vocab
    m = divisible_by * cfg.tensor_parallel
    return -(-a.vocab // m) * m


def load_hf_state(model_dir: str | Path) -> dict[str, torch.Tensor]:
    """Every tensor of an HF directory: the shards its model.safetensors.index.json names, else
    every *.safetensors (tests and tools; the backend reads its own slices, HFSource)."""
    from inference.weights import read_safetensors_dir

    return read_safetensors_dir(model_dir)


class MegatronBackend:
    def __init__(self, cfg: LearnerConfig, model_dir: str | Path,
                 ref_model_dir: str | Path | None = None, *, ddp_bucket_size: int | None = None,
                 checkpoint_shard_bytes: int = SHARD_BYTES) -> None:
        """`ddp_bucket_size` (elements): Megatron's default when None (at least 40M: one bucket
        for small models); tests set it small to reduce in several buckets.
        `checkpoint_shard_bytes`: the largest safetensors shard `save` writes (what rank 0's CPU
        holds of the model while saving)."""
        from transformers import AutoConfig

        self.cfg = cfg
        self.shard_bytes = checkpoint_shard_bytes
        check_megatron_core()  # a clear error for a megatron-core older than the floor
        self.cpu = not torch.cuda.is_available()
        self.te = use_transformer_engine(cuda=not self.cpu)  # the layer spec (and its weight names)
        self.hf_config = AutoConfig.from_pretrained(str(model_dir))
        self.arch = Arch.from_hf(self.hf_config)
        pp = cfg.pipeline_parallel
        if self.arch.num_layers % pp:
            raise ValueError(f"learner.pipeline_parallel={pp} does not divide the model's "
                             f"{self.arch.num_layers} layers")
        if pp > 1 and cfg.kl_coef and ref_model_dir:
            raise ValueError(f"learner.kl_coef={cfg.kl_coef} with learner.pipeline_parallel={pp}: "
                             "the reference model's logprobs would need a pipeline pass of their "
                             "own; use pipeline_parallel 1 or kl_coef 0")
        if cfg.max_update_kl is not None:
            raise ValueError("learner.max_update_kl: the torch backend only (Megatron's trained weights "
                             "are its optimizer's main copies, sharded by the distributed optimizer; "
                             "scaling an update back there is not built)")
        init_parallel(cfg)
        with maybe_cpu_standins():
            self.model = build_gpt(self.arch, cfg, self.cpu, self.te)
            self._load_into(self.model, model_dir)
            # dropout is 0 (transformer_config), so the mode changes no number: train mode
            # is what turns megatron-core's activation recompute on (_train_mode)
            self.model.eval()
            self.ref = None
            if cfg.kl_coef and ref_model_dir:
                self.ref = build_gpt(self.arch, cfg, self.cpu, self.te)
                self._load_into(self.ref, ref_model_dir)
                self.ref.requires_grad_(False).eval().to(DTYPES[cfg.dtype])
            self._init_training(ddp_bucket_size)

    # -- ranks -----------------------------------------------------------------------------
    @property
    def dp_rank(self) -> int:
        from megatron.core import parallel_state as ps

        return int(ps.get_data_parallel_rank())

    @property
    def dp_size(self) -> int:
        from megatron.core import parallel_state as ps

        return int(ps.get_data_parallel_world_size())

    @property
    def loss_sees_every_microbatch(self) -> bool:
        # Megatron's schedule calls the loss on the last pipeline stage only
        return self.cfg.pipeline_parallel == 1

    # -- training: DDP + Megatron optimizer + forward_backward_func -------------------------
    def _init_training(self, bucket_size: int | None) -> None:
        from megatron.core.distributed import (
            DistributedDataParallel,
            DistributedDataParallelConfig,
            finalize_model_grads,
        )
        from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
        from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler
        from megatron.core.transformer.module import Float16Module

        c = self.cfg
        # bf16: every weight in bf16 (norms included) and logits handed out in fp32, as
        # Megatron-LM's get_model wraps the model; the optimizer keeps fp32 main copies
        module = Float16Module(self.model.config, self.model) if c.dtype == "bf16" else self.model
        # gradients summed in fp32 buckets; DDP scales them by 1/dp before its SUM reduction
        # (average_in_collective off), which train_microbatches' loss scale undoes
        ddp_cfg = DistributedDataParallelConfig(
            grad_reduce_in_fp32=True, overlap_grad_reduce=c.overlap_grad_reduce,
            use_distributed_optimizer=c.use_distributed_optimizer, bucket_size=bucket_size)
        self.ddp = DistributedDataParallel(self.model.config, ddp_cfg, module)
        ocfg = OptimizerConfig(
            optimizer="adam", lr=c.lr, min_lr=c.lr, weight_decay=c.weight_decay,
            adam_beta1=c.betas[0], adam_beta2=c.betas[1], adam_eps=c.eps,
            clip_grad=c.grad_clip if c.grad_clip > 0 else float("inf"),  # inf: norm reported, no clip
            bf16=c.dtype == "bf16", params_dtype=DTYPES[c.dtype],
            use_distributed_optimizer=c.use_distributed_optimizer)
        self.opt = get_megatron_optimizer(ocfg, [self.ddp])
        warm = max(0, c.warmup_steps)
        self.sched = OptimizerParamScheduler(
            self.opt, init_lr=0.0, max_lr=c.lr, min_lr=c.lr, lr_warmup_steps=warm,
            lr_decay_steps=warm + 1, lr_decay_style="constant", start_wd=c.weight_decay,
            end_wd=c.weight_decay, wd_incr_steps=1, wd_incr_style="constant")
        # step k (from 0) trains at lr * min(1, (k + 1) / warmup), as the torch backend does
        self.sched.step(increment=1)
        # what Megatron-LM's trainer sets (setup_model_and_optimizer / train): without no_sync
        # every micro-batch would count as the last and reduce; finalize waits for (or, without
        # overlap, issues) the reduction once per step
        mcfg = self.model.config
        mcfg.grad_scale_func = self.opt.scale_loss
        mcfg.no_sync_func = self.ddp.no_sync if c.overlap_grad_reduce else None
        mcfg.finalize_model_grads_func = finalize_model_grads
        self._zero_grads()

    def _zero_grads(self) -> None:
        self.ddp.zero_grad_buffer()
        self.opt.zero_grad()

    def train_microbatches(self, mbs: list[MicroBatch], loss_fn: LossFn) -> list[dict[str, float]]:
        """Every micro-batch of this rank's shard through Megatron's schedule; the gradient
        reduction over data-parallel ranks happens once, after the last one."""
        from megatron.core.pipeline_parallel import get_forward_backward_func

        if not mbs:
            raise ValueError("train_microbatches: no micro-batch (every data-parallel rank takes "
                             "part in each step's gradient reduction with at least one)")
        # the schedule divides each loss by the number of micro-batches and DDP the gradients
        # by the number of data-parallel ranks; loss_fn's losses are already normalised by the
        # whole step, so both are undone to leave the sum
        scale = float(len(mbs) * self.dp_size)
        stats: list[dict[str, float]] = []

        def forward_step(data: Iterator[MicroBatch], model: Any) -> tuple[torch.Tensor, Any]:
            out, pmb = self._forward(model, next(data))

            def loss_func(output: torch.Tensor) -> tuple[torch.Tensor, dict[str, Any]]:
                # called on the last pipeline stage only, where `output` is the logits
                lp, ent = self._head(output, pmb, True)
                loss, st = loss_fn(lp, ent, pmb)
                st["loss"] = float(loss.detach())
                stats.append(st)
                return loss * scale, {}

            return out, loss_func

        with maybe_cpu_standins(), self._train_mode(True):
            get_forward_backward_func()(
                forward_step_func=forward_step, data_iterator=iter(mbs), model=[self.ddp],
                num_microbatches=len(mbs), seq_length=max(int(mb.input_ids.shape[-1]) for mb in mbs),
                micro_batch_size=1, forward_only=False)
        return self._from_last_stage(stats)

    @contextlib.contextmanager
    def _train_mode(self, on: bool) -> Iterator[None]:
        """The policy in train mode while a forward keeps activations for a backward, eval
        mode otherwise. megatron-core recomputes activations (learner.recompute) only in train
        mode (TransformerBlock.forward, Attention.forward check `self.training`); no-grad passes
        have nothing to recompute. Dropout is 0 either way, so both modes give the same numbers."""
        self.model.train(on)
        try:
            yield
        finally:
            self.model.eval()

    def _from_last_stage(self, obj: Any) -> Any:
        """What the last pipeline stage computed, on every stage of the pipeline."""
        from megatron.core import parallel_state as ps

        if ps.get_pipeline_model_parallel_world_size() == 1:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=ps.get_pipeline_model_parallel_last_rank(),
                                   group=ps.get_pipeline_model_parallel_group())
        return box[0]

    def params_snapshot(self) -> list[torch.Tensor]:
        raise NotImplementedError("learner.max_update_kl: the torch backend only")

    def params_blend(self, before: list[torch.Tensor], after: list[torch.Tensor], alpha: float) -> None:
        raise NotImplementedError("learner.max_update_kl: the torch backend only")

    def dp_sum(self, x: float) -> float:
        raise NotImplementedError("learner.max_update_kl: the torch backend only")

    def step(self, max_norm: float | None = None) -> dict[str, float]:
        # megatron's optimizers read config.clip_grad at each step (each of a chained one's)
        at = clip_at(self.cfg.grad_clip, max_norm)
        for opt in getattr(self.opt, "chained_optimizers", [self.opt]):
            opt.config.clip_grad = at
        with maybe_cpu_standins():
            lr = float(self.opt.param_groups[0]["lr"])
            ok, grad_norm, _ = self.opt.step()
            if not ok:  # only a loss scaler (fp16, which swarl does not use) skips steps
                raise RuntimeError("megatron optimizer skipped the step (inf/nan gradients)")
            self.sched.step(increment=1)
            self._zero_grads()
        return {"grad_norm": float(grad_norm), "lr": lr}

    # -- forward ---------------------------------------------------------------------------
    def _device(self) -> torch.device:
        return torch.device("cpu") if self.cpu else torch.device("cuda", torch.cuda.current_device())

    def _forward(self, model: Any, mb: MicroBatch) -> tuple[torch.Tensor, MicroBatch]:
        """The model's output for a micro-batch (this rank's vocabulary slice of the logits on
        the last pipeline stage, hidden states on the others) and the micro-batch it indexes (on
        the local spec a packed one runs as padded rows)."""
        dev = self._device()
        # bf16: Float16Module hands out the logits as they are, not an fp32 copy; the head
        # upcasts a chunk at a time, and the gradient is the same (the copy's backward would
        # cast it to bf16 for the output layer anyway)
        kw: dict[str, Any] = {"fp32_output": False} if model is self.ddp and self.cfg.dtype == "bf16" else {}
        if not self.te or not mb.packed:
            pmb = mb if not mb.packed else _padded(mb.items)
            assert pmb.attention_mask is not None  # padded rows carry their mask
            return model(input_ids=pmb.input_ids.to(dev), position_ids=pmb.position_ids.to(dev),
                         attention_mask=_padded_mask(pmb.attention_mask).to(dev), **kw), pmb
        from megatron.core.packed_seq_params import PackedSeqParams

        lens = torch.tensor([len(it.tokens) for it in mb.items], dtype=torch.int32)
        cu = torch.zeros(len(lens) + 1, dtype=torch.int32)
        cu[1:] = lens.cumsum(0)
        psp = PackedSeqParams(qkv_format="thd", cu_seqlens_q=cu.to(dev), cu_seqlens_kv=cu.to(dev),
                              max_seqlen_q=int(lens.max()), max_seqlen_kv=int(lens.max()))
        return model(input_ids=mb.input_ids.to(dev), position_ids=mb.position_ids.to(dev),
                     attention_mask=None, packed_seq_params=psp, **kw), mb

    def _head(self, logits: torch.Tensor, pmb: MicroBatch,
              with_entropy: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Per-slot logprobs (and entropy) from logits [b, s, V/tp] without gathering the
        vocabulary (megatron_head): the slots are picked a chunk at a time, the padded
        vocabulary never enters the softmax."""
        from megatron.core import parallel_state as ps

        dev = logits.device
        slots = pmb.rows.to(dev) * logits.shape[1] + pmb.cols.to(dev)
        group = ps.get_tensor_model_parallel_group() if ps.get_tensor_model_parallel_world_size() > 1 else None
        return vocab_parallel_logprobs(
            logits.reshape(-1, logits.shape[-1]), pmb.targets.to(dev), vocab=self.arch.vocab,
            temperature=self.cfg.rollout_temperature, with_entropy=with_entropy, slots=slots, group=group)

    def logprobs(self, mb: MicroBatch, *, grad: bool,
                 with_entropy: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Local to the data-parallel rank: its tensor- and pipeline-parallel peers call it
        together (with pipeline stages, a forward-only pass of Megatron's schedule whose result
        the last stage hands to the others; no gradient then)."""
        from megatron.core import parallel_state as ps

        if ps.get_pipeline_model_parallel_world_size() > 1:
            if grad:
                raise ValueError("logprobs(grad=True) with learner.pipeline_parallel > 1: gradients "
                                 "flow through train_microbatches")
            return self._pipelined_logprobs(mb, with_entropy)
        with torch.set_grad_enabled(grad), maybe_cpu_standins(), self._train_mode(grad):
            out, pmb = self._forward(self.model, mb)
            return self._head(out, pmb, with_entropy)

    def _pipelined_logprobs(self, mb: MicroBatch, with_entropy: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        from megatron.core.pipeline_parallel import get_forward_backward_func

        got: list[tuple[torch.Tensor, torch.Tensor | None]] = []

        def forward_step(data: Iterator[MicroBatch], model: Any) -> tuple[torch.Tensor, Any]:
            out, pmb = self._forward(model, next(data))

            def keep(output: torch.Tensor) -> tuple[torch.Tensor, dict[str, Any]]:
                lp, ent = self._head(output, pmb, with_entropy)
                got.append((lp.cpu(), None if ent is None else ent.cpu()))
                return lp.sum() * 0, {}

            return out, keep

        with torch.no_grad(), maybe_cpu_standins():
            get_forward_backward_func()(
                forward_step_func=forward_step, data_iterator=iter([mb]), model=[self.ddp],
                num_microbatches=1, seq_length=int(mb.input_ids.shape[-1]), micro_batch_size=1,
                forward_only=True)
        lp, ent = self._from_last_stage(got[0] if got else None)
        return lp, ent

    def ref_logprobs(self, mb: MicroBatch) -> torch.Tensor | None:
        if self.ref is None:
            return None
        with torch.no_grad(), maybe_cpu_standins():
            out, pmb = self._forward(self.ref, mb)
            return self._head(out, pmb, False)[0]

    # -- weights in HF naming --------------------------------------------------------------
    def _load_into(self, model: Any, hf: str | Path | dict[str, torch.Tensor]) -> None:
        """Every rank reads its shards of its pipeline stage from an HF directory (only those
        slices, megatron_weights.HFSource) or from HF tensors in memory."""
        load_shards(model, HFSource(hf), self.arch, self.te, padded_vocab(self.arch, self.cfg))

    def load_hf(self, hf: str | Path | dict[str, torch.Tensor]) -> None:
        """The policy's weights from an HF directory or HF tensors (each rank takes its shards)."""
        with maybe_cpu_standins():
            self._load_into(self.model, hf)
            self.opt.reload_model_params()  # fp32 main copies (bf16 training) follow the weights

    def publish_tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        """COLLECTIVE. One Megatron tensor at a time to global rank 0 (megatron_weights.gather_hf),
        converted to HF there and handed out as CPU tensors; other ranks yield nothing."""
        yield from gather_hf(self.model, self.arch, self.te)

    def hf_state(self) -> dict[str, torch.Tensor]:
        """COLLECTIVE: the whole model in HF naming on global rank 0 (empty elsewhere)."""
        return dict(self.publish_tensors())

    # -- checkpoints -------------------------------------------------------------------------
    def _optim_file(self, path: Path) -> Path:
        """This rank's optimizer file: one per model-parallel rank, and with the distributed
        optimizer one per data-parallel rank too (each holds a different shard)."""
        from megatron.core import parallel_state as ps

        dp = self.dp_rank if self.cfg.use_distributed_optimizer else 0
        tp, pp = ps.get_tensor_model_parallel_rank(), ps.get_pipeline_model_parallel_rank()
        return path / "optim" / f"tp{tp}_pp{pp}_dp{dp}.pt"

    def _layout(self) -> dict[str, int]:
        from megatron.core import parallel_state as ps

        return {"tensor_parallel": ps.get_tensor_model_parallel_world_size(),
                "pipeline_parallel": ps.get_pipeline_model_parallel_world_size(),
                "data_parallel": self.dp_size if self.cfg.use_distributed_optimizer else 1}

    def _main_params(self) -> list[torch.Tensor]:
        """The distributed optimizer's fp32 shards this rank updates."""
        return [p for g in self.opt.optimizer.param_groups for p in g["params"]]

    def save_hf(self, out: Path) -> None:
        """COLLECTIVE: the model as an HF directory written by rank 0, sharded as it streams in
        (megatron_weights.save_hf_shards): rank 0 holds one shard, never the model."""
        if dist.get_rank() == 0:
            save_hf_shards(self.publish_tensors(), out, self.shard_bytes)
            self.hf_config.save_pretrained(str(out))
        else:
            for _ in self.publish_tensors():
                pass

    def save(self, path: Path) -> None:
        """Rank 0: the model as an HF directory (path/model, `save_hf`). Every rank whose
        optimizer state is its own: that state and the scheduler's in path/optim/ — with the
        distributed optimizer its shard of the fp32 weights and Adam moments (written where it
        lives, no gathering), else data-parallel index 0 of each model-parallel rank."""
        path.mkdir(parents=True, exist_ok=True)
        self.save_hf(path / "model")
        state: dict[str, Any] = {"layout": self._layout(), "scheduler": self.sched.state_dict()}
        with maybe_cpu_standins():
            if self.cfg.use_distributed_optimizer:
                state["inner"] = self.opt.optimizer.state_dict()
                state["main"] = [p.detach().clone() for p in self._main_params()]
            else:
                state["megatron"] = self.opt.state_dict()
        if self.cfg.use_distributed_optimizer or self.dp_rank == 0:
            f = self._optim_file(path)
            f.parent.mkdir(exist_ok=True)
            torch.save(state, f)
        dist.barrier()  # every file is on disk before any rank goes on (e.g. to load it)

    def load(self, path: Path) -> None:
        f = self._optim_file(path)
        state = torch.load(f, weights_only=False)
        if state["layout"] != self._layout():
            raise ValueError(f"{f}: written by ranks laid out as {state['layout']}, this learner runs "
                             f"{self._layout()}; the optimizer state does not reshard")
        self.load_hf(path / "model")
        # no_grad: with fp32 weights the distributed optimizer's shards are views of them
        with torch.no_grad(), maybe_cpu_standins():
            if self.cfg.use_distributed_optimizer:
                self.opt.optimizer.load_state_dict(state["inner"])
                for p, saved in zip(self._main_params(), state["main"], strict=True):
                    p.copy_(saved)
            else:
                self.opt.load_state_dict(state["megatron"])
            self.sched.load_state_dict(state["scheduler"])
            self._zero_grads()


def _padded_mask(att2d: torch.Tensor) -> torch.Tensor:
    """Megatron's convention: True = masked out. Causal within each row's real tokens."""
    n = att2d.shape[1]
    causal = torch.ones(n, n, dtype=torch.bool).tril()
    keep = causal[None] & att2d.bool()[:, None, :]
    return ~keep[:, None]

