"""`swarl config plan`: what a GPU recipe holds on each GPU, worked out on paper.

Learner (megatron backend, one rank of TP x PP x DP): bf16 weights; fp32 gradient buffers
(grad_reduce_in_fp32); fp32 main weights and Adam moments, sharded over the data-parallel
ranks by the distributed optimizer; activations of the longest micro-batch under the configured
recompute; and the logprob head, which works on each rank's slice of the vocabulary
(learner/backends/megatron_head.py), so it shrinks with tensor parallelism. Inference (SGLang, tensor parallel T): weights / T
and the KV pool --mem-fraction-static leaves, in tokens and in whole episodes.

Every number is bytes per GPU; docs/gpu.md derives each formula and shows both recipes.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from pydantic import BaseModel, Field

from actors.config import ActorConfig
from common.settings import Section
from learner.config import LearnerConfig

GIB = 1024**3


class ClusterConfig(Section):
    """The GPUs a recipe runs on: what `swarl config plan` checks the recipe against."""

    gpu_memory_gib: float = Field(
        80.0, gt=0, description="Memory of one GPU in GiB as the driver reports it "
        "(nvidia-smi: H100 80GB 81559 MiB = 79.6 GiB, A100 80GB 81920 MiB = 80 GiB).")
    gpus_per_node: int = Field(8, ge=1, description="GPUs per node (torchrun --nproc-per-node).")
    learner_nodes: int = Field(
        1, ge=1, description="Nodes the learner runs on (torchrun --nnodes); its world size is "
        "learner_nodes x gpus_per_node = tensor_parallel x pipeline_parallel x data parallel.")
    learner_reserve_gib: float = Field(
        4.0, ge=0, description="Kept free on each learner GPU for what the plan does not count "
        "term by term: CUDA context, NCCL buffers, cuBLAS/TransformerEngine workspaces, allocator "
        "fragmentation.")
    inference_servers: int = Field(1, ge=1, description="SGLang servers (launch-sglang) the actors use.")
    inference_tp_size: int = Field(1, ge=1, description="--tp-size of each SGLang server: GPUs per server.")
    inference_mem_fraction: float = Field(
        0.85, gt=0, le=1, description="--mem-fraction of each SGLang server (its --mem-fraction-static): "
        "weights + KV pool take this share of GPU memory, the rest is left for activations and "
        "CUDA graphs.")
    inference_reserve_gib: float = Field(
        2.0, ge=0, description="Used on each inference GPU before SGLang sizes its KV pool "
        "(CUDA context, NCCL, the weight-update group).")
    prm_servers: int = Field(0, ge=0, description="SGLang servers of the PRM judge (launch-sglang "
                             "--role prm), on nodes of their own; 0: no judge GPUs in this recipe.")
    prm_model: str | None = Field(None, description="The judge's model: a directory with config.json "
                                  "or a known name (qwen3-4b, qwen3-8b, qwen3-32b).")
    prm_tp_size: int = Field(1, ge=1, description="--tp-size of each judge server.")
    prm_mem_fraction: float = Field(0.85, gt=0, le=1, description="--mem-fraction of each judge server.")


class PlanError(ValueError):
    """The recipe cannot be planned at all (unknown model, impossible parallel layout)."""


# -- the model's shape -----------------------------------------------------------------------

class ModelShape(BaseModel):
    """The numbers of an HF config.json that memory depends on."""

    name: str
    source: str = Field(description="where the numbers came from")
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    vocab: int
    tied: bool
    qkv_bias: bool = False
    qk_norm: bool = False

    @classmethod
    def from_hf(cls, hf: dict[str, object], name: str, source: str) -> ModelShape:
        def num(key: str, default: int | None = None) -> int:
            value = hf.get(key)
            if value is None and default is not None:
                return default
            if not isinstance(value, int) or value < 1:
                raise PlanError(f"{source}: {key} is {value!r}, expected a positive integer")
            return value

        heads, hidden = num("num_attention_heads"), num("hidden_size")
        model_type = str(hf.get("model_type", ""))
        return cls(
            name=name, source=source, layers=num("num_hidden_layers"), hidden=hidden, heads=heads,
            kv_heads=num("num_key_value_heads", heads), head_dim=num("head_dim", hidden // heads),
            ffn=num("intermediate_size"), vocab=num("vocab_size"),
            tied=bool(hf.get("tie_word_embeddings", False)),
            qkv_bias=model_type == "qwen2" or bool(hf.get("attention_bias", False)),
            qk_norm=model_type == "qwen3")

    def params(self) -> int:
        """Parameters of the whole model (no vocabulary padding)."""
        return sum(_stage_params(self, 1, 1, first=True, last=True, vocab=self.vocab).values())


# Published config.json values, so a recipe can be planned on a machine without the weights
# (the plan reads <model>/config.json whenever it exists; these match those files).
KNOWN_MODELS: dict[str, dict[str, object]] = {
    "qwen3-4b": dict(model_type="qwen3", num_hidden_layers=36, hidden_size=2560,
                     num_attention_heads=32, num_key_value_heads=8, head_dim=128,
                     intermediate_size=9728, vocab_size=151936, tie_word_embeddings=True),
    "qwen3-8b": dict(model_type="qwen3", num_hidden_layers=36, hidden_size=4096,
                     num_attention_heads=32, num_key_value_heads=8, head_dim=128,
                     intermediate_size=12288, vocab_size=151936, tie_word_embeddings=False),
    "qwen3-32b": dict(model_type="qwen3", num_hidden_layers=64, hidden_size=5120,
                      num_attention_heads=64, num_key_value_heads=8, head_dim=128,
                      intermediate_size=25600, vocab_size=151936, tie_word_embeddings=False),
}


def model_shape(model: str) -> ModelShape:
    """<model>/config.json when it exists, else the known-model table by directory name."""
    path = Path(model)
    cfg = path / "config.json"
    if cfg.is_file():
        return ModelShape.from_hf(json.loads(cfg.read_text()), path.name, str(cfg))
    known = KNOWN_MODELS.get(path.name.lower())
    if known is None:
        raise PlanError(f"{cfg} does not exist and {path.name!r} is not a known model "
                        f"({', '.join(sorted(KNOWN_MODELS))}): put the model's config.json there")
    return ModelShape.from_hf(known, path.name, "published config.json values (swarl.plan.KNOWN_MODELS)")


# -- learner ---------------------------------------------------------------------------------

# The logprob head (learner/backends/megatron_head.py) on a rank's slice of the padded vocabulary,
# V_p / TP logits per token: at its peak the logits in the model's dtype and their gradient,
# HEAD_BYTES x dtype bytes per token per slice entry; with kl_coef the reference model's logits
# are live beside the policy's during its forward: HEAD_BYTES_KL. entropy_coef costs nothing
# more (its gradient is recomputed a chunk at a time). On top: the output layer's weight
# gradient before it is added to the fp32 grad buffer (V_p / TP x hidden in the dtype), and the
# fp32 temporaries of one chunk, HEAD_CHUNK_BYTES per logit of a chunk of HEAD_CHUNK_ELEMENTS
# (megatron_head.CHUNK_ELEMENTS). Measured with the learner's own train_step on two gloo ranks
# (tests/learner/megatron_head_memory.py: peak allocated bytes, difference of two vocabularies):
# 4.00-4.04 B at bf16 and 8.10-8.16 at fp32 per token per slice entry, of which hidden x dtype
# bytes / tokens = 0.06 and 0.13 are that weight gradient; 6.0 and 12.0 with kl_coef; a chunk
# 3-7 B per logit.
HEAD_BYTES = 2
HEAD_BYTES_KL = 3
HEAD_CHUNK_ELEMENTS = 1 << 24
HEAD_CHUNK_BYTES = 8


def megatron_padded_vocab(vocab: int, tp: int) -> int:
    """The megatron backend's vocabulary: a multiple of 128 x TP (one rank: unpadded)."""
    if tp == 1:
        return vocab
    m = 128 * tp
    return -(-vocab // m) * m


def _stage_params(m: ModelShape, tp: int, pp: int, *, first: bool, last: bool,
                  vocab: int) -> dict[str, int]:
    """Parameters one tensor-parallel rank of one pipeline stage holds, by part."""
    qkv = (m.heads + 2 * m.kv_heads) * m.head_dim
    layer = (m.hidden * qkv + (qkv if m.qkv_bias else 0)     # linear_qkv, column parallel
             + m.heads * m.head_dim * m.hidden               # linear_proj, row parallel
             + 3 * m.hidden * m.ffn) // tp                   # fc1 (gate, up) + fc2
    layer += 2 * m.hidden + (2 * m.head_dim if m.qk_norm else 0)  # norms: on every TP rank
    embedding = vocab * m.hidden // tp
    out = {"layers": m.layers // pp * layer}
    if first:
        out["embedding"] = embedding
    if last:
        out["final_norm"] = m.hidden
        if not m.tied or not first:  # a tied model's last stage keeps its own copy
            out["output_layer"] = embedding
    return out


def layer_activation_bytes(m: ModelShape, tp: int, dtype_bytes: int) -> int:
    """Bytes per token autograd keeps for one transformer layer (TE spec, flash attention, no
    sequence parallelism, no dropout); docs/gpu.md lists them one by one.
    tests/learner/test_megatron_recompute.py measures the backend's training forward against it
    (and full recompute's h x b per layer) on the local spec."""
    b = dtype_bytes
    q, kv, d = m.heads // tp, m.kv_heads // tp, m.head_dim
    norms_io = 4 * m.hidden * b           # input and output of the two RMSNorms (every TP rank)
    qkv = (q + 2 * kv) * d * b            # fused QKV output (k's norm and v keep it)
    q_regroup = q * d * b                 # query reshaped out of its groups: a copy
    rope = (q + kv) * d * b               # rotated q, k, saved by attention
    attn_out = q * d * b                  # attention output: attention's and linear_proj's input
    mlp = 4 * m.ffn // tp * b             # fc1 output (gate, up), silu(gate), product (fc2 input)
    fp32_stats = 4 * q + (4 * (q + kv) if m.qk_norm else 0) + 2 * 4  # softmax LSE, norm rstd
    return norms_io + qkv + q_regroup + rope + attn_out + mlp + fp32_stats


class LearnerPlan(BaseModel):
    world: int
    tp: int
    pp: int
    dp: int
    stage: str = Field(description="the pipeline stage the numbers are of: the fullest one")
    microbatch_tokens: int
    padded_vocab: int
    head_bytes: int = Field(description="bytes per token per entry of this GPU's vocabulary slice "
                            "(padded_vocab / tp) at the head's peak")
    head: int = Field(description="the logprob head at its peak: logits and their gradient, the "
                      "output layer's weight gradient, one chunk's temporaries")
    params: int = Field(description="parameters on one GPU")
    weights: int
    grads: int
    optimizer: int
    reference: int = Field(description="reference model weights (kl_coef > 0)")
    activations: int = Field(description="what autograd keeps for the whole micro-batch")
    working: int = Field(description="the peak on top: the logprob head or one layer's backward")
    working_is_head: bool
    total: int
    reserve: int
    gpu_memory: int
    margin: int
    fits: bool


def learner_plan(m: ModelShape, lc: LearnerConfig, cluster: ClusterConfig,
                 max_sample_tokens: int) -> LearnerPlan:
    tp, pp = lc.tensor_parallel, lc.pipeline_parallel
    world = cluster.learner_nodes * cluster.gpus_per_node
    if world % (tp * pp):
        raise PlanError(f"the learner's {world} GPUs ({cluster.learner_nodes} nodes x "
                        f"{cluster.gpus_per_node}) are not a multiple of tensor_parallel x "
                        f"pipeline_parallel = {tp} x {pp}")
    if m.heads % tp or m.kv_heads % tp or m.ffn % tp:
        raise PlanError(f"learner.tensor_parallel={tp} does not divide {m.name}'s {m.heads} heads, "
                        f"{m.kv_heads} kv heads and ffn {m.ffn}")
    if m.layers % pp:
        raise PlanError(f"learner.pipeline_parallel={pp} does not divide {m.name}'s {m.layers} layers")
    dp = world // (tp * pp)
    b = 2 if lc.dtype == "bf16" else 4
    vocab = megatron_padded_vocab(m.vocab, tp)
    # A sample longer than the budget gets a micro-batch of its own (learner.packing).
    tokens = max(lc.max_tokens_per_microbatch, max_sample_tokens)
    per_layer = layer_activation_bytes(m, tp, b)
    if lc.recompute == "selective":  # flash attention keeps no score matrix: only the LSE goes
        per_layer -= 4 * (m.heads // tp)
    stored_layer, layer_work = per_layer, per_layer
    # megatron-core recomputes in train mode, which the backend's training forward runs in
    if lc.recompute == "full":  # only each layer's input is kept; backward re-runs one layer
        stored_layer, layer_work = m.hidden * b, 2 * per_layer
    head_bytes = (HEAD_BYTES_KL if lc.kl_coef else HEAD_BYTES) * b
    head = (tokens * vocab // tp * head_bytes + vocab // tp * m.hidden * b
            + HEAD_CHUNK_ELEMENTS * HEAD_CHUNK_BYTES)

    reserve, memory = int(cluster.learner_reserve_gib * GIB), int(cluster.gpu_memory_gib * GIB)

    def stage(name: str, first: bool, last: bool) -> LearnerPlan:
        params = sum(_stage_params(m, tp, pp, first=first, last=last, vocab=vocab).values())
        in_flight = pp if first else 1  # 1F1B: the first stage holds pp micro-batches
        acts = in_flight * tokens * (m.layers // pp) * stored_layer
        if last:
            acts += tokens * 2 * m.hidden * b  # the final norm's input and output
        work = max(tokens * layer_work, head if last else 0)
        main = 4 if b == 2 else 0  # fp32 main weights beside bf16 ones
        optimizer = params * (main + 8) // (dp if lc.use_distributed_optimizer else 1)
        reference = params * b if lc.kl_coef else 0
        total = params * (b + 4) + optimizer + reference + acts + work
        return LearnerPlan(
            world=world, tp=tp, pp=pp, dp=dp, stage=name, microbatch_tokens=tokens,
            padded_vocab=vocab, head_bytes=head_bytes, head=head, params=params, weights=params * b, grads=params * 4,
            optimizer=optimizer, reference=reference, activations=acts, working=work,
            working_is_head=last and head >= tokens * layer_work, total=total, reserve=reserve,
            gpu_memory=memory, margin=memory - reserve - total, fits=total + reserve <= memory)

    if pp == 1:
        return stage("only", True, True)
    return max(stage("first", True, False), stage("last", False, True), key=lambda p: p.total)


# -- inference -------------------------------------------------------------------------------

class InferencePlan(BaseModel):
    servers: int
    tp: int
    mem_fraction: float
    params: int = Field(description="parameters on one GPU")
    weights: int
    kv_heads_per_gpu: int
    kv_bytes_per_token: int = Field(description="per GPU")
    kv_room: int = Field(description="per GPU: mem_fraction x memory - weights - reserve")
    kv_tokens: int = Field(description="per server")
    context_len: int
    episodes_per_server: int
    episodes: int = Field(description="all servers, every episode at full context")
    concurrent_episodes: int = Field(description="episodes the pool runs at once")
    left_for_activations: int = Field(description="per GPU: (1 - mem_fraction) x memory")
    reserve: int
    gpu_memory: int
    fits: bool


def inference_plan(m: ModelShape, cluster: ClusterConfig, context_len: int,
                   concurrent: int, role: str = "policy") -> InferencePlan:
    """One pool of SGLang servers: the policy's (cluster.inference_*) or the judge's (cluster.prm_*)."""
    prm = role == "prm"
    t = cluster.prm_tp_size if prm else cluster.inference_tp_size
    servers = cluster.prm_servers if prm else cluster.inference_servers
    mem_fraction = cluster.prm_mem_fraction if prm else cluster.inference_mem_fraction
    if m.heads % t or not (m.kv_heads % t == 0 or t % m.kv_heads == 0):
        key = "prm_tp_size" if prm else "inference_tp_size"
        raise PlanError(f"cluster.{key}={t}: SGLang needs it to divide {m.name}'s "
                        f"{m.heads} heads, and to divide or be a multiple of its {m.kv_heads} kv heads")
    kv = max(1, m.kv_heads // t)  # beyond the kv heads, each GPU keeps a replica of one
    q_out = m.heads // t * m.head_dim
    layer = (m.hidden * (q_out + 2 * kv * m.head_dim) + q_out * m.hidden  # q, k, v, o
             + 3 * m.hidden * m.ffn // t + 2 * m.hidden                    # mlp, norms
             + (2 * m.head_dim if m.qk_norm else 0))
    params = (m.layers * layer + m.vocab * m.hidden // t * (1 if m.tied else 2) + m.hidden)
    weights = 2 * params
    kv_per_token = 2 * m.layers * kv * m.head_dim * 2  # K and V, bf16
    memory = int(cluster.gpu_memory_gib * GIB)
    reserve = int(cluster.inference_reserve_gib * GIB)
    room = int(mem_fraction * memory) - weights - reserve
    tokens = max(0, room) // kv_per_token
    per_server = tokens // context_len
    return InferencePlan(
        servers=servers, tp=t, mem_fraction=mem_fraction,
        params=params, weights=weights, kv_heads_per_gpu=kv, kv_bytes_per_token=kv_per_token,
        kv_room=room, kv_tokens=tokens, context_len=context_len, episodes_per_server=per_server,
        episodes=per_server * servers, concurrent_episodes=concurrent,
        left_for_activations=memory - int(mem_fraction * memory),
        reserve=reserve, gpu_memory=memory, fits=per_server >= 1)


# A judge request: the issue, the earlier steps, the step's answer and output, the template, then
# the votes' answer. Characters count as 3 per token (code and logs tokenize denser than prose).
JUDGE_TEMPLATE_TOKENS = 512
CHARS_PER_TOKEN = 3


def judge_context_len(actor: ActorConfig) -> int:
    """Tokens of one judge request at its largest (prompt within the prm budgets + max_tokens)."""
    p = actor.prm
    return (p.problem_chars // CHARS_PER_TOKEN + p.history_tokens + actor.sampling.max_new_tokens
            + p.output_chars // CHARS_PER_TOKEN + JUDGE_TEMPLATE_TOKENS + p.max_tokens)


# -- the whole recipe ------------------------------------------------------------------------

class Plan(BaseModel):
    model: ModelShape
    model_params: int
    learner: LearnerPlan
    inference: InferencePlan
    inference_model: ModelShape | None = Field(None, description="when it differs from the learner's")
    prm: InferencePlan | None = Field(None, description="the PRM judge's servers (cluster.prm_servers)")
    prm_model: ModelShape | None = None
    gpus: int
    nodes: int
    problems: list[str]

    @property
    def fits(self) -> bool:
        return not self.problems


def make_plan(learner: LearnerConfig, actor: ActorConfig, cluster: ClusterConfig,
              concurrent_episodes: int, inference_model: str | None = None) -> Plan:
    """The plan of a recipe; `problems` names each thing that does not fit and by how much."""
    if learner.backend != "megatron":
        raise PlanError(f"learner.backend is {learner.backend!r}: the plan sizes the megatron "
                        "learner on GPUs")
    if not learner.model_dir:
        raise PlanError("learner.model_dir is not set: the plan needs the model's shape")
    m = model_shape(learner.model_dir)
    im = m if not inference_model or inference_model == learner.model_dir else model_shape(inference_model)
    lp = learner_plan(m, learner, cluster, actor.max_context_len)
    ip = inference_plan(im, cluster, actor.max_context_len, concurrent_episodes)
    problems = []
    if not lp.fits:
        problems.append(
            f"learner: {gib(lp.total)} GiB per GPU + {gib(lp.reserve)} GiB reserve is "
            f"{gib(-lp.margin)} GiB more than the {gib(lp.gpu_memory)} GiB of a GPU")
    if not ip.fits:
        short = ip.context_len * ip.kv_bytes_per_token - max(0, ip.kv_room)
        problems.append(
            f"inference: the KV pool of {gib(max(0, ip.kv_room))} GiB per GPU holds "
            f"{ip.kv_tokens} tokens, fewer than one episode of {ip.context_len}: "
            f"{gib(short)} GiB short per GPU")
    pp = pm = None
    if cluster.prm_servers:
        if not cluster.prm_model:
            raise PlanError("cluster.prm_model is not set: the plan needs the judge's shape "
                            "(cluster.prm_servers > 0)")
        pm = model_shape(cluster.prm_model)
        # every running episode may have one step out with the judge: m votes each
        pp = inference_plan(pm, cluster, judge_context_len(actor), concurrent_episodes * actor.prm.m, "prm")
        if not pp.fits:
            problems.append(
                f"PRM judge: the KV pool of {gib(max(0, pp.kv_room))} GiB per GPU holds "
                f"{pp.kv_tokens} tokens, fewer than one judge request of {pp.context_len}")
    infer_gpus = cluster.inference_servers * cluster.inference_tp_size
    prm_gpus = cluster.prm_servers * cluster.prm_tp_size
    return Plan(model=m, model_params=m.params(), learner=lp, inference=ip,
                inference_model=None if im is m else im, prm=pp, prm_model=pm,
                gpus=lp.world + infer_gpus + prm_gpus,
                # the judge's GPUs are nodes of their own (the seed's strict non-colocation)
                nodes=cluster.learner_nodes + math.ceil(infer_gpus / cluster.gpus_per_node)
                + math.ceil(prm_gpus / cluster.gpus_per_node),
                problems=problems)


def gib(n: int | float) -> str:
    return f"{n / GIB:.1f}"


def render(plan: Plan, cluster: ClusterConfig, lc: LearnerConfig) -> str:
    """The plan as a table a person reads."""
    m, lp, ip = plan.model, plan.learner, plan.inference
    infer_gpus = ip.servers * ip.tp
    rows = [
        f"model      {m.name}: {plan.model_params / 1e9:.2f} B params, {m.layers} layers, hidden "
        f"{m.hidden}, {m.heads} heads / {m.kv_heads} kv heads x {m.head_dim}, ffn {m.ffn}, vocab "
        f"{m.vocab}{', tied' if m.tied else ''}",
        f"           (from {m.source})",
        f"GPUs       {plan.gpus} on {plan.nodes} nodes of {cluster.gpus_per_node}, "
        f"{cluster.gpu_memory_gib:g} GiB each: learner {lp.world} (TP {lp.tp} x PP {lp.pp} x DP "
        f"{lp.dp}), inference {infer_gpus} ({ip.servers} SGLang server{'s' * (ip.servers > 1)} "
        f"x TP {ip.tp})" + (f", PRM judge {plan.prm.servers * plan.prm.tp} ({plan.prm.servers} x TP "
                            f"{plan.prm.tp})" if plan.prm else ""),
        "",
        f"learner, per GPU{f' ({lp.stage} pipeline stage)' if lp.pp > 1 else ''}: micro-batch "
        f"of {lp.microbatch_tokens} tokens, recompute {lc.recompute}, "
        f"{'distributed optimizer over ' + str(lp.dp) + ' DP ranks' if lc.use_distributed_optimizer else 'optimizer not sharded'}",
    ]
    opt_what = "fp32 main weights + Adam m, v" if lc.dtype == "bf16" else "Adam m, v"
    opt_div = f" / DP {lp.dp}" if lc.use_distributed_optimizer else ""
    layers = ("each layer's input (full recompute)" if lc.recompute == "full"
              else "every layer's activations") + ", the final norm"
    head_rest = lp.head - lp.head_bytes * lp.microbatch_tokens * (lp.padded_vocab // lp.tp)
    work = (f"logprob head: {lp.head_bytes} B x {lp.microbatch_tokens} x {lp.padded_vocab // lp.tp} logits "
            f"+ {gib(head_rest)} GiB" if lp.working_is_head else
            f"backward of one layer (the logprob head: {gib(lp.head)} GiB)" if lp.head
            else "backward of one layer")
    lines = [
        ("weights", f"{lc.dtype}, {lp.params / 1e9:.2f} B params on this GPU", lp.weights),
        ("grads", "fp32 grad buffer", lp.grads),
        ("optimizer", opt_what + opt_div, lp.optimizer),
    ]
    if lp.reference:
        lines.append(("reference", f"{lc.dtype} weights (kl_coef)", lp.reference))
    lines += [
        ("activations", layers, lp.activations),
        ("peak", work, lp.working),
        ("total", "", lp.total),
        ("reserve", "CUDA context, NCCL, workspaces, fragmentation", lp.reserve),
        ("GPU", "", lp.gpu_memory),
        ("margin", "fits" if lp.fits else "DOES NOT FIT", lp.margin),
    ]
    rows += [f"  {k:<12} {what:<58} {gib(v):>7} GiB" for k, what, v in lines]
    im = plan.inference_model or m
    rows += [
        "",
        f"inference, per GPU of each SGLang server{f' ({im.name})' if plan.inference_model else ''}: "
        f"--tp-size {ip.tp}, --mem-fraction {ip.mem_fraction:g}",
        f"  {'weights':<12} {f'bf16, {ip.params / 1e9:.2f} B params on this GPU':<58} {gib(ip.weights):>7} GiB",
        f"  {'KV room':<12} {f'{ip.mem_fraction:g} x GPU - weights - {gib(ip.reserve)} GiB reserve':<58} "
        f"{gib(ip.kv_room):>7} GiB",
        f"  {'KV / token':<12} 2 x {im.layers} layers x {ip.kv_heads_per_gpu} kv heads x "
        f"{im.head_dim} x 2 B = {ip.kv_bytes_per_token} B",
        f"  {'KV tokens':<12} {ip.kv_tokens:,} per server = {ip.episodes_per_server} episodes at "
        f"{ip.context_len} tokens; {ip.servers} servers: {ip.episodes} "
        f"(the pool runs {ip.concurrent_episodes} at once)",
        f"  {'left':<12} {'(1 - mem fraction) x GPU: activations, CUDA graphs':<58} "
        f"{gib(ip.left_for_activations):>7} GiB",
        "",
    ]
    if plan.prm is not None and plan.prm_model is not None:
        pp, pm = plan.prm, plan.prm_model
        rows += [
            f"PRM judge, per GPU of each SGLang server ({pm.name}): --tp-size {pp.tp}, "
            f"--mem-fraction {pp.mem_fraction:g}, a request of at most {pp.context_len} tokens",
            f"  {'weights':<12} {f'bf16, {pp.params / 1e9:.2f} B params on this GPU':<58} {gib(pp.weights):>7} GiB",
            f"  {'KV room':<12} {f'{pp.mem_fraction:g} x GPU - weights - {gib(pp.reserve)} GiB reserve':<58} "
            f"{gib(pp.kv_room):>7} GiB",
            f"  {'KV tokens':<12} {pp.kv_tokens:,} per server = {pp.episodes_per_server} requests; "
            f"{pp.servers} servers: {pp.episodes} (up to {pp.concurrent_episodes} votes in flight)",
            "",
        ]
    if ip.fits and ip.episodes < ip.concurrent_episodes:
        rows.append(f"note: {ip.concurrent_episodes} concurrent episodes at full context need "
                    f"more KV than {ip.episodes}; SGLang queues the rest (most episodes are shorter)")
    rows += [f"DOES NOT FIT: {p}" for p in plan.problems] or ["fits"]
    return "\n".join(rows) + "\n"
