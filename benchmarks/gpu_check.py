"""The GPU check: swarl's Megatron learner end to end on one CUDA device, in under 8 minutes.

    python3 benchmarks/gpu_check.py [--out FILE]              # CUDA, bf16, a ~0.6B Qwen3 shape
    python3 benchmarks/gpu_check.py --device cpu --tiny       # CPU, the tiny model (make test)
    python3 benchmarks/gpu_check.py --wheels DIR              # download the wheels to carry
    python3 benchmarks/gpu_check.py --record-from FILE        # a run's JSON into RESULTS.md

What the GPU machine's image has was probed (DEVICE_IMAGE; docs/gpu.md "The device image"):
torch, transformers and their requirements, but not pydantic, redis or megatron-core. Those
travel as wheels (WHEELS, at this environment's versions, cp312 manylinux; under 60 MB):
`make gpu-wheels` downloads them into .gpu-wheels/ (ignored by git: the device call carries it).
On the GPU machine, from the checkout, with no index (each wheel named, none of its requirements
fetched: torch and numpy are the image's own):

    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .gpu-wheels/*.whl
    PYTHONPATH=/tmp/site python3 benchmarks/gpu_check.py --out $OUT/gpu_check.json

Before anything else the check imports every module it needs (IMPORTS): one missing prints the
JSON line naming it (`missing`) and exits 1, no traceback. Without a C compiler or Python.h,
torch.compile cannot build (megatron-core's bias-dropout-add fusion goes through it on CUDA): it
is turned off (TORCHDYNAMO_DISABLE=1, the fusion runs unfused) and the line says so (`compiler`).

The model is random (Qwen3-0.6B's published shape, or inference.tiny_model's with --tiny), written
locally as an HF checkpoint: nothing comes from a hub. docs/gpu.md "The GPU check" explains every
figure and pass criterion.

The checks, in order, each phase under its own time limit and the whole under --deadline-s:
- hf_logprobs: the backend's token logprobs against transformers' on the same weights (fp32
  reference; in bf16 the tolerance is set by transformers' own bf16-vs-fp32 gap);
- train: optimizer steps through learner.train.train_step (loss and grad norm finite, the
  published weights changed);
- throughput: learner tokens/s and MFU (FORMULA below) over the timed steps;
- recompute_memory: peak memory of a train step with `recompute: none` and `full` (CUDA:
  torch.cuda.max_memory_allocated; CPU: torch.profiler's allocator events); full must be lower;
- publish_engine: the trained weights published (publish_tensors -> weight_sync's checkpoint,
  verified), loaded into swarl's inference engine (as /update_weights_from_disk does), bit-equal
  there, and a generation's logprobs against the learner's on the same tokens;
- weight_sync_nccl (CUDA): rank 0 of weight_sync's update group over NCCL, in a subprocess of its
  own (`--nccl-probe`; each stage's progress on stderr), its groups' bound 10 s: a one-rank bucket
  counts once its kernels completed; with a peer that never joins (a server that refused or
  died) the lazy set-up inside the first broadcast waits, giving the group up does not block,
  rank 0's thread ends within the bound (TORCH_NCCL_NONBLOCKING_TIMEOUT, which abort() cannot
  cut short), the abort and destroy after it end and leave no group; then a new group works.

Progress goes to stderr; stdout gets ONE JSON line with every figure and `ok` per check. Exit 0
when every check passed, 1 when one failed (or the deadline passed), 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import math
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]  # swarl's packages, uninstalled

H100_BF16_DENSE_FLOPS = 989e12  # H100 SXM, bf16 dense tensor-core peak (no sparsity)
FORMULA = ("model FLOPs per step = 6*N*T + 6*L*a*d*sum(n_i^2): N = parameters a token multiplies "
           "(layers + output layer, not the embedding lookup), T = real tokens, causal attention "
           "QK^T and AV over each sample of n_i tokens (half of PaLM's 12*L*a*d*n per token); "
           "recompute not counted (MFU, not HFU); MFU = FLOPs / step time / 989e12")

# Qwen3-0.6B's published config.json shape; the weights are random
QWEN3_0_6B: dict[str, Any] = {
    "vocab_size": 151936, "hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 28,
    "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128,
    "max_position_embeddings": 40960, "tie_word_embeddings": True, "rope_theta": 1_000_000.0,
    "rms_norm_eps": 1e-6,
}

# What a run trains and measures: (samples per step, tokens per sample, micro-batch budget,
# timed steps, probe samples, probe length, generated tokens).
SIZES = {
    "full": {"samples": 16, "length": 1024, "budget": 8192, "steps": 4, "probes": 4, "probe_len": 512,
             "gen": 16},
    "tiny": {"samples": 8, "length": 64, "budget": 256, "steps": 2, "probes": 3, "probe_len": 48, "gen": 8},
}
# Each phase's time limit in seconds (the whole run is bounded by --deadline-s as well).
# The first forwards on CUDA also compile megatron-core's fused bias-dropout-add (torch.compile).
LIMITS = {"model": 90, "reference": 90, "build": 150, "hf_logprobs": 120, "train": 240, "weight_sync_nccl": 100,
          "recompute_memory": 90, "publish_engine": 150, "recompute_full": 180}
CHECKS = ("hf_logprobs", "train", "throughput", "recompute_memory", "publish_engine", "weight_sync_nccl")

# The GPU machine's image, probed 2026-11-27 (Python 3.12.3, torch 2.11.0+cu130, transformers
# 5.17.0; gcc and Python.h present): the distributions the check relies on it for. Absent there:
# pydantic, pydantic-settings, redis, megatron-core, TransformerEngine, sglang.
DEVICE_IMAGE = ("torch", "transformers", "tokenizers", "safetensors", "huggingface_hub", "numpy", "PyYAML",
                "regex", "packaging", "tqdm", "msgpack", "filelock", "typing_extensions")
# The wheels the image lacks, at this environment's versions: megatron-core, pydantic and its parts
# (the learner's and the engine's configs), redis and PyJWT (learner.train imports the broker's
# replay and wire modules), and typing-extensions (this pydantic needs a newer one than an image
# may hold; torch takes any recent one).
WHEELS = ("megatron-core", "pydantic", "pydantic-core", "pydantic-settings", "python-dotenv",
          "typing-inspection", "annotated-types", "typing-extensions", "redis", "PyJWT")
# Every module the check imports, with the distribution that brings it: checked before anything runs.
IMPORTS = {"torch": "torch", "numpy": "numpy", "yaml": "PyYAML", "packaging": "packaging", "regex": "regex",
           "tqdm": "tqdm", "safetensors": "safetensors", "tokenizers": "tokenizers",
           "huggingface_hub": "huggingface_hub", "transformers": "transformers", "msgpack": "msgpack",
           "typing_extensions": "typing-extensions", "pydantic": "pydantic",
           "pydantic_settings": "pydantic-settings", "dotenv": "python-dotenv", "redis": "redis", "jwt": "PyJWT",
           "megatron.core": "megatron-core"}
WHEEL_PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_24_x86_64",
                   "manylinux_2_17_x86_64", "manylinux2014_x86_64", "manylinux1_x86_64")
WHEELS_MAX_BYTES = 60 << 20
WHEELS_DIR = ".gpu-wheels"
INSTALL = ("python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site "
           "{dir}/*.whl && export PYTHONPATH=/tmp/site")

_T0 = time.monotonic()


def progress(msg: str) -> None:
    print(f"[gpu_check {time.monotonic() - _T0:6.1f}s] {msg}", file=sys.stderr, flush=True)


class PhaseTimeout(Exception):
    """A phase ran past its limit."""


@contextlib.contextmanager
def time_limit(seconds: float, what: str) -> Iterator[None]:
    """SIGALRM interrupts Python code; a hang inside one C call is the deadline thread's."""
    def fire(_signum: int, _frame: Any) -> None:
        raise PhaseTimeout(f"{what}: over its {seconds:.0f} s limit")

    old = signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


class Report:
    """Every figure of the run; `line()` is the JSON line printed once at the end (or at the
    deadline, by the watchdog thread: every change and the line itself are made under one lock)."""

    def __init__(self, info: dict[str, Any], stdout: Any) -> None:
        self.info = info
        self.stdout = stdout  # the real standard output: everything else printed goes to stderr
        self.checks: dict[str, dict[str, Any]] = {}
        self.phase_s: dict[str, float] = {}
        self.error: str | None = None  # what stopped the run before its checks were done
        self.lock = threading.RLock()
        self.done = False  # the line is printed

    def note(self, **info: Any) -> None:
        with self.lock:
            self.info.update(info)

    def check(self, name: str, ok: bool, **figures: Any) -> None:
        with self.lock:
            self.checks[name] = {"ok": bool(ok), **figures}
        progress(f"check {name}: {'ok' if ok else 'FAILED'} {json.dumps(figures, default=str)[:400]}")

    def fail(self, name: str, error: str) -> None:
        with self.lock:
            self.checks[name] = {**self.checks.get(name, {}), "ok": False, "error": error}

    def stop(self, error: str) -> None:
        """The run ends here: every check not done yet fails with `error`."""
        with self.lock:
            self.error = error
            for c in CHECKS:
                self.checks.setdefault(c, {"ok": False, "error": f"not run: {error}"})

    def phase(self, name: str, fn: Callable[[], Any], *, fails: tuple[str, ...]) -> Any:
        """Run `fn` under LIMITS[name]; an exception fails the checks in `fails` (and returns None)."""
        progress(f"{name} ...")
        t = time.monotonic()
        try:
            with time_limit(LIMITS[name], name):
                return fn()
        except Exception as e:
            traceback.print_exc(file=sys.stderr)
            for c in fails:
                self.fail(c, f"{name}: {type(e).__name__}: {e}"[:2000])
            return None
        finally:
            with self.lock:
                self.phase_s[name] = round(time.monotonic() - t, 2)

    @property
    def ok(self) -> bool:
        return self.error is None and all(self.checks.get(c, {}).get("ok", False) for c in CHECKS)

    def line(self) -> str:
        with self.lock:
            checks = {c: self.checks.get(c, {"ok": False, "error": "not run"}) for c in CHECKS}
            return json.dumps({"check": "gpu_check", **self.info, "ok": self.ok, "error": self.error,
                               "wall_s": round(time.monotonic() - _T0, 1), "phase_s": self.phase_s,
                               "checks": checks}, default=_jsonable, sort_keys=True)

    def emit(self, out: str | None) -> bool:
        """Print the line once (main thread or watchdog, whichever is first)."""
        with self.lock:
            if self.done:
                return False
            self.done = True
            line = self.line()
            print(line, file=self.stdout, flush=True)
            if out:
                Path(out).write_text(line + "\n")
            return True


def _jsonable(v: Any) -> Any:
    return float(v) if hasattr(v, "__float__") else str(v)


def _r(x: float, n: int = 6) -> float | None:
    if isinstance(x, int):
        return x
    return None if x is None or not math.isfinite(x) else round(float(x), n)


# -- the model ------------------------------------------------------------------------------
def write_model(out: Path, tiny: bool, device: str) -> dict[str, Any]:
    """An HF checkpoint with random weights: inference.tiny_model's (tokenizer included), or
    Qwen3-0.6B's shape in bf16 with the tiny tokenizer (ids past its vocabulary are never decoded)."""
    import torch

    from inference.tiny_model import DEFAULT_SIZE, init_tiny

    init_tiny(out, seed=0)
    size = DEFAULT_SIZE if tiny else QWEN3_0_6B
    if not tiny:
        from transformers import Qwen3Config, Qwen3ForCausalLM

        ids = json.loads((out / "config.json").read_text())
        config = Qwen3Config(**size, bos_token_id=ids["bos_token_id"], eos_token_id=ids["eos_token_id"],
                             pad_token_id=ids["pad_token_id"])
        torch.manual_seed(0)
        with torch.device(device):
            model = Qwen3ForCausalLM(config)  # transformers' init: normal(0, 0.02), norms 1
        model.to(torch.bfloat16).save_pretrained(out)
        (out / "swarl_tiny.json").unlink(missing_ok=True)
        del model
        _free()
    return {"shape": "inference.tiny_model" if tiny else "Qwen3-0.6B (random weights)", **size}


def arch_counts(model_dir: Path) -> dict[str, int]:
    from transformers import AutoConfig

    from learner.backends.hf_megatron_convert import Arch

    a = Arch.from_hf(AutoConfig.from_pretrained(str(model_dir)))
    layer = a.hidden * (a.heads + 2 * a.groups) * a.head_dim + a.heads * a.head_dim * a.hidden \
        + 3 * a.hidden * a.ffn + 2 * a.hidden + 2 * a.head_dim * a.qk_norm
    embed = a.vocab * a.hidden
    return {"params": a.num_layers * layer + embed * (1 if a.tied else 2) + a.hidden,
            "matmul_params": a.num_layers * (layer - 2 * a.hidden - 2 * a.head_dim * a.qk_norm) + embed,
            "layers": a.num_layers, "heads": a.heads, "head_dim": a.head_dim, "vocab": a.vocab}


def model_flops(counts: dict[str, int], lengths: list[int]) -> float:
    """FORMULA, for one optimizer step over samples of these lengths."""
    attn = 6 * counts["layers"] * counts["heads"] * counts["head_dim"] * sum(n * n for n in lengths)
    return 6.0 * counts["matmul_params"] * sum(lengths) + attn


# -- data -----------------------------------------------------------------------------------
def sequences(n: int, length: int, vocab: int, seed: int) -> list[Any]:
    import numpy as np

    rng = np.random.default_rng(seed)
    return [rng.integers(0, vocab, length).astype(np.int32) for _ in range(n)]


def train_items(n: int, length: int, vocab: int, seed: int) -> list[Any]:
    """`n` samples of random tokens; the last 3/4 of each trained, advantages +-1."""
    import numpy as np

    from learner.losses import token_weights
    from learner.packing import TrainItem

    out = []
    for i, toks in enumerate(sequences(n, length, vocab, seed)):
        mask = np.zeros(length, dtype=np.uint8)
        mask[length // 4:] = 1
        behav = np.where(mask == 1, -math.log(vocab), 0.0).astype(np.float32)
        out.append(TrainItem(f"s{seed}-{i}", toks, mask, behav, adv=1.0 if i % 2 else -1.0))
    for it, w in zip(out, token_weights([int(it.loss_mask[1:].sum()) for it in out], "token"), strict=True):
        it.tok_w = w
    return out


# -- logprobs -------------------------------------------------------------------------------
def hf_logprobs(model_dir: Path, seqs: list[Any], device: str, dtypes: list[str]) -> dict[str, list[Any]]:
    """transformers' per-token logprobs of each sequence (slots 1..n-1), per dtype; the weights
    are loaded in fp32 and cast, so bf16 sees the values the learner's bf16 copy holds."""
    import torch
    from transformers import AutoModelForCausalLM

    from inference.logprobs import token_logprobs

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32,
                                                 attn_implementation="sdpa").to(device).eval()
    out: dict[str, list[Any]] = {}
    with torch.no_grad():
        for name in dtypes:
            model.to(torch.float32 if name == "fp32" else torch.bfloat16)
            out[name] = []
            for s in seqs:
                ids = torch.from_numpy(s).long().to(device)
                logits = model(input_ids=ids[None]).logits[0, :-1]
                out[name].append(token_logprobs(logits, ids[1:], 1.0).float().cpu())
    del model
    _free()
    return out


def learner_logprobs(be: Any, seqs: list[Any]) -> list[Any]:
    """The backend's per-token logprobs of each sequence, one micro-batch per sequence."""
    import numpy as np
    import torch

    from learner.packing import TrainItem, make_microbatches

    out = []
    for i, s in enumerate(seqs):
        n = len(s)
        it = TrainItem(f"probe{i}", s.astype(np.int32), np.ones(n, dtype=np.uint8), np.zeros(n, dtype=np.float32), 0.0)
        (mb,) = make_microbatches([it], n, packed=be.cfg.packing)
        with torch.no_grad():
            lp, _ = be.logprobs(mb, grad=False, with_entropy=False)
        out.append(lp.detach().float().cpu())
    return out


def gap(got: list[Any], ref: list[Any]) -> dict[str, float]:
    import torch

    d = (torch.cat(got) - torch.cat(ref)).abs()
    return {"max_abs_diff": float(d.max()), "mean_abs_diff": float(d.mean()), "tokens": int(d.numel())}


def tolerance(dtype: str, noise: dict[str, float] | None) -> dict[str, float]:
    """fp32: fixed. bf16: three times transformers' own bf16-vs-fp32 gap on the same tokens plus
    a floor: the two bf16 paths round differently (Megatron's norms and RoPE run in bf16), while
    a wrong conversion is off by the logprobs' spread, ~1 nat on these models."""
    if dtype == "fp32":
        return {"mean": 1e-4, "max": 2e-3}
    n = noise or {"mean_abs_diff": 0.05, "max_abs_diff": 0.5}
    return {"mean": 3 * n["mean_abs_diff"] + 0.02, "max": 3 * n["max_abs_diff"] + 0.2}


def within(g: dict[str, float], tol: dict[str, float]) -> bool:
    return g["mean_abs_diff"] <= tol["mean"] and g["max_abs_diff"] <= tol["max"]


# -- memory ---------------------------------------------------------------------------------
def peak_bytes(fn: Callable[[], Any], cuda: bool) -> dict[str, int]:
    """The bytes `fn` allocates beyond what was allocated before it, at their peak. CUDA:
    torch.cuda.max_memory_allocated; CPU: torch.profiler's allocator events summed in order."""
    import torch

    if cuda:
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        fn()
        torch.cuda.synchronize()
        top = torch.cuda.max_memory_allocated()
        return {"peak_bytes": int(top - base), "max_memory_allocated": int(top), "allocated_before": int(base)}
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        prof.export_chrome_trace(f.name)  # every allocator event with its signed size
        events = json.loads(Path(f.name).read_text())["traceEvents"]
    live = top = 0
    for ev in sorted((e for e in events if e.get("name") == "[memory]"), key=lambda e: e["ts"]):
        live += int(ev["args"]["Bytes"])
        top = max(top, live)
    return {"peak_bytes": int(top)}


def _free() -> None:
    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


# -- the run --------------------------------------------------------------------------------
def learner_fields(args: argparse.Namespace) -> dict[str, Any]:
    """The learner settings of every backend the run builds (recompute aside), --set applied;
    a setting LearnerConfig refuses is a SystemExit(2) naming it."""
    from pydantic import ValidationError

    from common.settings import parse_scalar
    from learner.config import LearnerConfig

    size = SIZES["tiny" if args.tiny else "full"]
    fields: dict[str, Any] = {
        "backend": "megatron", "dtype": args.dtype, "lr": 1e-3, "grad_clip": 1.0,
        "max_tokens_per_microbatch": size["budget"], "rollout_temperature": 1.0}
    for s in args.sets:
        k, sep, v = s.partition("=")
        if not sep or not k:
            _usage(f"--set {s!r}: expected key=value (a learner setting, e.g. packing=false)")
        fields[k] = parse_scalar(v)
    try:
        LearnerConfig.model_validate(fields)
    except ValidationError as e:
        _usage(f"--set: {e}")
    return fields


def _usage(msg: str) -> None:
    print(f"gpu_check: {msg}", file=sys.stderr)
    raise SystemExit(2)


class Check:
    """The phases, sharing what earlier ones made (the model, the backend, the trained weights)."""

    def __init__(self, args: argparse.Namespace, report: Report, work: Path) -> None:
        import torch

        self.args, self.report, self.work = args, report, work
        self.cuda = args.device == "cuda"
        self.dev = "cuda" if self.cuda else "cpu"
        self.size = SIZES["tiny" if args.tiny else "full"]
        self.model_dir = work / "model"
        self.torch = torch
        self.fields = learner_fields(args)
        self.noise: dict[str, float] | None = None
        self.be: Any = None
        self.trained: dict[str, Any] | None = None
        self.untrained_exact = False
        self.mem: dict[str, dict[str, Any]] = {}

    def backend(self, recompute: str) -> Any:
        from learner.backends.megatron_backend import MegatronBackend
        from learner.config import LearnerConfig

        cfg = LearnerConfig.model_validate({**self.fields, "recompute": recompute})
        return MegatronBackend(cfg, self.model_dir)

    def run(self) -> None:
        rep = self.report
        info = rep.phase("model", lambda: write_model(self.model_dir, self.args.tiny, self.dev), fails=CHECKS)
        if info is None:
            return
        self.counts = arch_counts(self.model_dir)
        rep.note(model={**info, "params": self.counts["params"], "matmul_params": self.counts["matmul_params"]},
                 learner={k: v for k, v in self.fields.items() if k != "backend"})
        vocab = self.counts["vocab"]
        self.probes = sequences(self.size["probes"], self.size["probe_len"], vocab, seed=1)
        dtypes = ["fp32"] + (["bf16"] if self.args.dtype == "bf16" else [])
        ref = rep.phase("reference", lambda: hf_logprobs(self.model_dir, self.probes, self.dev, dtypes),
                        fails=("hf_logprobs",))
        self.be = rep.phase("build", lambda: self.backend("none"), fails=CHECKS)
        if self.be is None:
            return
        # TE's spec runs packed rows as THD sequences; the local spec runs them as padded rows
        rep.note(layer_spec="transformer_engine" if self.be.te else "local")
        if ref is not None:
            rep.phase("hf_logprobs", lambda: self.hf_check(ref), fails=("hf_logprobs",))
        rep.phase("train", self.train, fails=("train", "throughput"))
        if self.trained is not None:  # before any further step: the learner's weights are the published ones
            rep.phase("publish_engine", self.publish_engine, fails=("publish_engine",))
        else:
            rep.fail("publish_engine", "not run: training failed")
        rep.phase("recompute_memory", lambda: self.memory("none"), fails=("recompute_memory",))
        self.be = None
        _free()
        rep.phase("recompute_full", self.recompute_full, fails=("recompute_memory",))
        rep.phase("weight_sync_nccl", self.nccl, fails=("weight_sync_nccl",))

    def nccl(self) -> None:
        if not self.cuda:
            self.report.check("weight_sync_nccl", True, skipped="NCCL needs CUDA")
            return
        found = run_nccl_probe(LIMITS["weight_sync_nccl"] - 10)
        self.report.check("weight_sync_nccl", bool(found.pop("ok", False)), **found)

    def hf_check(self, ref: dict[str, list[Any]]) -> None:
        got = learner_logprobs(self.be, self.probes)
        g = gap(got, ref["fp32"])
        if "bf16" in ref:
            self.noise = gap(ref["bf16"], ref["fp32"])
        tol = tolerance(self.args.dtype, self.noise)
        self.report.check("hf_logprobs", within(g, tol), **{k: _r(v) for k, v in g.items()},
                          tolerance={k: _r(v) for k, v in tol.items()},
                          hf_bf16_vs_fp32={k: _r(v) for k, v in (self.noise or {}).items()} or None,
                          reference="transformers fp32 on the same weights")

    def train(self) -> None:
        from learner.train import train_step

        torch, be, s = self.torch, self.be, self.size
        t = time.monotonic()
        before = dict(be.publish_tensors())
        publish_s = time.monotonic() - t
        disk = _read_dir(self.model_dir)
        self.untrained_exact = sorted(before) == sorted(disk) and all(
            torch.equal(before[n], disk[n].to(before[n].dtype)) for n in before)
        stats = []
        for k in range(s["steps"] + 1):  # step 0 warms up (allocator, kernels, Adam state)
            items = train_items(s["samples"], s["length"], self.counts["vocab"], seed=100 + k)
            st = train_step(be, items, be.cfg)
            if self.cuda:
                torch.cuda.synchronize()
            stats.append(st)
            progress(f"step {k}: loss {st['loss']:.4f} grad_norm {st['grad_norm']:.4f} "
                     f"{st['step_time_s']:.3f} s {st['tokens_per_s']:.0f} tokens/s")
        self.trained = dict(be.publish_tensors())
        changed = [n for n, v in self.trained.items() if v.dim() >= 2 and not torch.equal(v, before[n])]
        mats = [n for n, v in self.trained.items() if v.dim() >= 2]
        finite = all(math.isfinite(st["loss"]) and math.isfinite(st["grad_norm"]) for st in stats)
        self.report.check("train", finite and len(changed) >= 0.9 * len(mats), steps=len(stats),
                          loss=[_r(st["loss"]) for st in stats], grad_norm=[_r(st["grad_norm"]) for st in stats],
                          matrices_changed=f"{len(changed)}/{len(mats)}", microbatches=int(stats[-1]["microbatches"]),
                          publish_s=_r(publish_s, 3))
        timed = stats[1:]
        sec = statistics.median(st["step_time_s"] for st in timed)
        tokens = int(timed[0]["tokens"])
        flops = model_flops(self.counts, [s["length"]] * s["samples"])
        peak = H100_BF16_DENSE_FLOPS if self.cuda and self.args.dtype == "bf16" else None
        self.report.check("throughput", tokens / sec > 0, tokens_per_step=tokens, step_s=_r(sec, 4),
                          tokens_per_s=_r(tokens / sec, 1), model_tflops_per_s=_r(flops / sec / 1e12, 3),
                          mfu=_r(flops / sec / peak, 4) if peak else None, peak_flops=peak,
                          recompute="none", formula=FORMULA)

    def memory(self, recompute: str) -> None:
        from learner.train import train_step

        be, s = self.be, self.size
        n = max(1, s["budget"] // s["length"])  # one micro-batch at the token budget
        items = train_items(n, s["length"], self.counts["vocab"], seed=7)
        if recompute != "none":
            train_step(be, items, be.cfg)  # warm-up: Adam state, buffers (done by `train` for none)
        t = time.monotonic()
        m = peak_bytes(lambda: train_step(be, items, be.cfg), self.cuda)
        m["step_s"] = _r(time.monotonic() - t, 4)
        m["tokens"] = n * s["length"]
        self.mem[recompute] = m
        progress(f"memory recompute={recompute}: {m}")

    def recompute_full(self) -> None:
        self.be = self.backend("full")
        try:
            self.memory("full")
        finally:
            self.be = None
            _free()
        none, full = self.mem.get("none"), self.mem.get("full")
        if none is None:
            self.report.fail("recompute_memory", "no `recompute: none` figure to compare with")
            return
        ratio = full["peak_bytes"] / none["peak_bytes"] if none["peak_bytes"] else float("nan")
        self.report.check("recompute_memory", ratio < 1.0, none=none, full=full, full_over_none=_r(ratio, 4),
                          measured_by="torch.cuda.max_memory_allocated" if self.cuda
                          else "torch.profiler CPU allocator events",
                          tokens_per_s_full=_r(full["tokens"] / full["step_s"], 1) if full["step_s"] else None)

    def publish_engine(self) -> None:
        import numpy as np

        from inference.engine import Engine, GenRequest
        from inference.sampling import SamplingParams
        from inference.weights import load_into, named_weights, read_safetensors_dir
        from weight_sync.checkpoints import verify, write_checkpoint

        torch, trained = self.torch, self.trained
        assert trained is not None
        t = time.monotonic()
        # the learner's path: publish_tensors streamed into the checkpoint writer; the engine's
        # weights are then compared with the publish `train` kept in memory
        manifest = write_checkpoint(self.work / "run", version=1, step=self.size["steps"] + 1,
                                    named_tensors=self.be.publish_tensors(), base_model_dir=self.model_dir)
        path = verify(manifest, 1)
        write_s = time.monotonic() - t
        engine = Engine(self.model_dir, weight_version="0", seed=0,  # the untrained weights
                        device=self.args.device)
        engine.start()
        try:
            t = time.monotonic()
            tensors = read_safetensors_dir(path)
            engine.call(lambda: load_into(engine.model, tensors)).result(timeout=120)
            engine.weight_version = "1"
            load_s = time.monotonic() - t
            live = named_weights(engine.model)
            missing = sorted(set(live) - set(trained))
            unequal = [n for n in live if n in trained and not torch.equal(
                live[n], trained[n].to(device=live[n].device, dtype=live[n].dtype))]
            prompt = [int(x) for x in self.probes[0][:32]]
            done = threading.Event()
            req = GenRequest(input_ids=prompt, return_logprob=True, on_done=lambda _r: done.set(),
                             params=SamplingParams(max_new_tokens=self.size["gen"], temperature=1.0,
                                                   ignore_eos=True, sampling_seed=1234))
            engine.submit(req)
            if not done.wait(60):
                raise TimeoutError("the engine did not finish a generation in 60 s")
        finally:
            engine.stop()
        if req.finish_reason is None or req.finish_reason.get("type") != "length":
            raise RuntimeError(f"generation ended by {req.finish_reason}, not its length")
        seq = np.array(prompt + req.output_ids, dtype=np.int32)
        mine = learner_logprobs(self.be, [seq])[0][-len(req.output_ids):]
        g = gap([mine], [torch.tensor(req.output_logprobs)])
        tol = tolerance(self.args.dtype, self.noise)
        ok = self.untrained_exact and not missing and not unequal and within(g, tol)
        self.report.check("publish_engine", ok, untrained_publish_equals_checkpoint=self.untrained_exact,
                          tensors=len(trained), engine_missing=missing[:5], engine_unequal=unequal[:5],
                          checkpoint_bytes=int(manifest["bytes"]), write_s=_r(write_s, 3), load_s=_r(load_s, 3),
                          engine_device=str(engine.device), engine_dtype="fp32", generated=len(req.output_ids),
                          **{k: _r(v) for k, v in g.items()}, tolerance={k: _r(v) for k, v in tol.items()})


def _read_dir(path: Path) -> dict[str, Any]:
    from inference.weights import read_safetensors_dir

    return read_safetensors_dir(path)


# -- weight_sync over NCCL ----------------------------------------------------------------------
NCCL_PROBE_BOUND_S = 10.0  # the probe's groups' bound (group_timeout_s): TORCH_NCCL_NONBLOCKING_TIMEOUT 10
NCCL_PROBE_DEADLINE_S = 75.0  # the probe's own watchdog: under the parent's limit (LIMITS - 10)
NCCL_PROBE_STDERR_TAIL = 3000


def run_nccl_probe(limit_s: float, cmd: list[str] | None = None) -> dict[str, Any]:
    """weight_sync_nccl's process (`--nccl-probe`; one of its own: a set-up nothing ends must
    not hang the run), killed at limit_s. Its figures: the JSON line it printed last, else the
    partial one of its last progress line (the stage it reached), with `exit`, and when it did
    not pass, `error` and the tail of its stderr (progress, thread stacks of a probe stuck)."""
    cmd = cmd or [sys.executable, str(Path(__file__).resolve()), "--nccl-probe"]
    with tempfile.TemporaryDirectory(prefix="nccl_probe-") as d:
        out_p, err_p = Path(d, "stdout"), Path(d, "stderr")
        with out_p.open("wb") as out, err_p.open("wb") as err:
            proc = subprocess.Popen(cmd, stdout=out, stderr=err, stdin=subprocess.DEVNULL)
            try:
                rc: int | None = proc.wait(timeout=limit_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                rc = None
        stdout = out_p.read_text(errors="replace")
        stderr = err_p.read_text(errors="replace")
    found = _last_json(stdout.splitlines(), "") or _last_json(stderr.splitlines(), "[nccl_probe") or {}
    found["exit"] = rc
    if rc is None:
        found["ok"] = False
        found["error"] = (f"the probe was killed at {limit_s:g} s in stage {found.get('stage', 'start')!r} "
                          "(its own watchdog did not end it)")
    elif not found.get("ok"):
        found["ok"] = False
        found.setdefault("error", f"probe exit {rc} in stage {found.get('stage', 'start')!r}")
    if not found["ok"]:
        found["stderr_tail"] = stderr[-NCCL_PROBE_STDERR_TAIL:]
    return found


def _last_json(lines: list[str], prefix: str) -> dict[str, Any] | None:
    for line in reversed(lines):
        if not line.startswith(prefix) or "{" not in line:
            continue
        try:
            v = json.loads(line[line.index("{"):])
        except ValueError:
            continue
        if isinstance(v, dict):
            return v
    return None


def nccl_probe(bound_s: float = NCCL_PROBE_BOUND_S, deadline_s: float = NCCL_PROBE_DEADLINE_S,
               device: str = "cuda") -> dict[str, Any]:
    """Rank 0 of weight_sync's update group over NCCL on this GPU, with bound_s as the groups'
    bound (see the module doc and docs/gpu.md; `device` is for tests' stand-ins). Each stage
    prints `[nccl_probe <s>] <stage> <JSON so far>` to stderr; every wait is bounded, and at
    deadline_s a watchdog prints the JSON so far (`error`: the stage it is stuck in) and every
    thread's stack (`_probe_watchdog`)."""
    import asyncio
    from datetime import timedelta

    t_start = time.monotonic()
    out: dict[str, Any] = {"ok": False, "stage": "start", "bound_s": bound_s}

    def stage(name: str, **found: Any) -> None:
        out.update(found)
        out["stage"] = name
        out["at_s"] = round(time.monotonic() - t_start, 3)
        print(f"[nccl_probe {out['at_s']:6.1f}s] {name} {json.dumps(out, sort_keys=True, default=str)}",
              file=sys.stderr, flush=True)

    stop_watchdog = _probe_watchdog(out, deadline_s)
    try:
        stage("imports")
        import torch
        from torch.distributed import distributed_c10d as c10d

        from common.services import free_port
        from weight_sync.update_group import (
            NONBLOCKING_TIMEOUT_ENV,
            UpdateGroup,
            init_custom_process_group,
            nccl_nonblocking_options,
            nccl_setup_bound,
        )

        env_before = os.environ.get(NONBLOCKING_TIMEOUT_ENV)
        stage("nccl_setup_bound", torch=torch.__version__, nonblocking_timeout_env_before=env_before,
              nonblocking_timeout=nccl_setup_bound(bound_s))  # before the process's first NCCL operation
        v = torch.cuda.nccl.version()
        stage("cuda", nccl=".".join(map(str, v)) if isinstance(v, tuple) else str(v),
              device_name=torch.cuda.get_device_name(),
              nonblocking=nccl_nonblocking_options() is not None)
    except Exception as e:
        out["error"] = f"{type(e).__name__}: {e}"[:600]
        traceback.print_exc(file=sys.stderr)
        stage("done")
        stop_watchdog()
        return out

    async def settled(futs: list[asyncio.Future[Any]], limit_s: float) -> bool:
        done, _ = await asyncio.wait(futs, timeout=limit_s)
        return len(done) == len(futs)

    def why(fut: asyncio.Future[Any]) -> str | None:
        if not fut.done() or fut.cancelled() or fut.exception() is None:
            return None
        return f"{type(fut.exception()).__name__}: {fut.exception()}"[:400]

    async def group(name: str, world: int) -> UpdateGroup:
        g = UpdateGroup(name=name, members=[], clients=[], tp_sizes=[], backend="nccl", timeout_s=bound_s,
                        device=device)
        made = g._thread(init_custom_process_group, "nccl", f"tcp://127.0.0.1:{free_port()}", world, 0, name,
                         timedelta(seconds=g.group_timeout_s))
        if not await settled([made], 20):
            raise RuntimeError(f"{name}: the group was not made within 20 s")
        g.pg = made.result()
        return g

    async def one_rank(prefix: str) -> bool:
        stage(f"{prefix}_group")
        one = await group(f"probe-{prefix}", 1)
        stage(f"{prefix}_bucket")
        t0 = time.monotonic()
        fut = one._thread(one._broadcast, [torch.arange(1 << 22, device=device, dtype=torch.float32)])
        done = await settled([fut], 30)
        ok = done and why(fut) is None
        stage(f"{prefix}_close", **{f"{prefix}_bucket_completed": ok,
                                    f"{prefix}_bucket_s": round(time.monotonic() - t0, 3) if done else None,
                                    f"{prefix}_bucket_error": why(fut) if done else "not done within 30 s"})
        pg = one.pg
        closed = await settled([asyncio.ensure_future(one.close())], 20)
        out[f"{prefix}_closed"] = closed and one.running == 0 and pg not in c10d._world.pg_map
        return bool(ok and out[f"{prefix}_closed"])

    async def absent_peer() -> bool:
        stage("absent_peer_group")
        absent = await group("probe-absent-peer", 2)
        pg = absent.pg
        stage("absent_peer_setup_waits")
        t0 = time.monotonic()
        fut = absent._thread(absent._broadcast, [torch.ones(1024, device=device)])
        await asyncio.wait([fut], timeout=min(3.0, bound_s / 2))
        waits = not fut.done()
        stage("absent_peer_break", waits_for_the_absent_peer=waits, early_error=why(fut))
        t1 = time.monotonic()
        absent._break("probe: the peer never joined", fut)  # as after a server's refusal
        stage("absent_peer_thread_ends", break_returned_s=round(time.monotonic() - t1, 3))
        ended = await settled([fut], bound_s + 15)
        stage("absent_peer_teardown", thread_ended=ended,
              thread_ended_s=round(time.monotonic() - t0, 3) if ended else None, thread_error=why(fut))
        t2 = time.monotonic()
        limit = 2 * bound_s + 15  # torch's abort waits up to the group's own timeout (2 x bound)
        teardown = [t for t in absent._threads if not t.done()]
        torn = await settled(teardown, limit) if teardown else True
        out.update(teardown_done=torn, teardown_s=round(time.monotonic() - t2, 3) if torn else None,
                   group_left=pg in c10d._world.pg_map)
        return bool(waits and out["break_returned_s"] < 0.5 and ended and out["thread_ended_s"] <= bound_s + 3
                    and torn and not out["group_left"])

    async def run() -> None:
        first = await one_rank("one_rank")
        absent = await absent_peer()
        after = await one_rank("next_group")  # the next update's group, once one was aborted
        out["ok"] = first and absent and after

    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(run())
    except Exception as e:
        out["error"] = f"{type(e).__name__}: {e}"[:600]
        traceback.print_exc(file=sys.stderr)
    finally:
        loop.close()  # not asyncio.run: that would wait for threads still running (they are reported)
    stage("done")
    stop_watchdog()
    return out


def _probe_watchdog(out: dict[str, Any], deadline_s: float) -> Callable[[], None]:
    """At deadline_s, whatever the probe is stuck in: print `out` as the JSON line (`error`: the
    stage) and every thread's stack to stderr, exit 3. A thread does it (torch releases the GIL
    in its NCCL calls), and faulthandler, which needs no GIL, exits 10 s later should that
    thread not run. Returns what stops both."""
    import faulthandler

    err = sys.__stderr__ if sys.__stderr__ is not None else sys.stderr  # a file descriptor's, for faulthandler

    def stuck() -> None:
        out["error"] = f"stuck in stage {out.get('stage')!r} at {deadline_s:g} s"
        print(json.dumps(out, sort_keys=True, default=str), flush=True)
        print("[nccl_probe] every thread's stack:", file=err, flush=True)
        faulthandler.dump_traceback(file=err, all_threads=True)
        err.flush()
        os._exit(3)

    timer = threading.Timer(deadline_s, stuck)
    timer.daemon = True
    timer.start()
    faulthandler.dump_traceback_later(deadline_s + 10, exit=True, file=err)

    def stop() -> None:
        timer.cancel()
        faulthandler.cancel_dump_traceback_later()

    return stop


# -- before anything runs ---------------------------------------------------------------------
def compiler() -> dict[str, Any]:
    """Whether torch.compile can build here (a C compiler, as triton and inductor look for it, and
    Python.h); if not, it is turned off before torch is imported."""
    import shutil
    import sysconfig

    cc_env = os.environ.get("CC")
    cc = shutil.which(cc_env) if cc_env else (shutil.which("cc") or shutil.which("gcc") or shutil.which("clang"))
    header = Path(sysconfig.get_paths().get("include") or "/nonexistent") / "Python.h"
    info: dict[str, Any] = {"cc": cc, "python_h": str(header) if header.exists() else None}
    if cc and header.exists():
        info["torch_compile"] = "on"
    else:
        os.environ["TORCHDYNAMO_DISABLE"] = "1"
        info["torch_compile"] = ("off (TORCHDYNAMO_DISABLE=1): no " + ("C compiler" if not cc else "Python.h")
                                 + "; megatron-core's bias-dropout-add fusion runs unfused")
    return info


def missing_imports() -> dict[str, str]:
    """Each module of IMPORTS that does not import, with its distribution and why."""
    import importlib

    missing = {}
    with contextlib.redirect_stdout(sys.stderr):  # what imports print: stdout holds the JSON line only
        for module, dist in IMPORTS.items():
            try:
                importlib.import_module(module)
            except Exception as e:  # a missing requirement of the module, too
                missing[module] = f"{dist}: {type(e).__name__}: {e}"[:300]
    return missing


def refuse(info: dict[str, Any], missing: dict[str, str], out: str | None) -> int:
    """The one JSON line of a run that cannot start: what is missing, and where it comes from."""
    error = f"missing imports: {', '.join(sorted(missing))}"
    line = json.dumps({"check": "gpu_check", **info, "ok": False, "error": error, "missing": missing,
                       "install": INSTALL.format(dir=WHEELS_DIR) + f" (after make gpu-wheels; {WHEELS_DIR} "
                                  "carries " + ", ".join(WHEELS) + ")",
                       "wall_s": round(time.monotonic() - _T0, 1),
                       "checks": {c: {"ok": False, "error": f"not run: {error}"} for c in CHECKS}}, sort_keys=True)
    print(line, flush=True)
    if out:
        Path(out).write_text(line + "\n")
    return 1


# -- wheels ---------------------------------------------------------------------------------
def download_wheels(out: Path, python_version: str) -> int:
    """pip download (no dependencies, binary only) of WHEELS at this environment's versions, for
    CPython `python_version` on manylinux x86-64; refuse a set over WHEELS_MAX_BYTES."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        pins = [f"{name}=={version(name)}" for name in WHEELS]
    except PackageNotFoundError as e:
        print(f"--wheels: {e.name} is not installed here; its version pins the wheel", file=sys.stderr)
        return 2
    out.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--python-version",
           python_version, "--implementation", "cp", "-d", str(out)]
    for p in WHEEL_PLATFORMS:
        cmd += ["--platform", p]
    progress(" ".join([*cmd, *pins]))
    if subprocess.run([*cmd, *pins], timeout=600).returncode:
        return 1
    wheels = sorted(out.glob("*.whl"))
    total = sum(w.stat().st_size for w in wheels)
    for w in wheels:
        print(f"{w.stat().st_size / 2**20:7.2f} MiB  {w.name}", file=sys.stderr)
    by_name: dict[str, list[str]] = {}
    for w in wheels:
        by_name.setdefault(w.name.split("-")[0].lower().replace("_", "-"), []).append(w.name)
    twice = [names for names in by_name.values() if len(names) > 1]
    if twice:  # pip install refuses two versions of one package
        print(f"--wheels: {out} holds two versions of a package: {twice}; empty it and run again", file=sys.stderr)
        return 1
    print(f"{total / 2**20:7.2f} MiB  total in {out}", file=sys.stderr)
    if total > WHEELS_MAX_BYTES:
        print(f"--wheels: {total / 2**20:.1f} MiB is over the {WHEELS_MAX_BYTES >> 20} MiB that may be carried",
              file=sys.stderr)
        return 1
    print(f"install there: {INSTALL.format(dir=out.name)}", file=sys.stderr)
    return 0


# -- recording ------------------------------------------------------------------------------
def record_line(line: dict[str, Any]) -> None:
    from _record import markdown_table, record

    c = line["checks"]
    rows = [[name, "ok" if v.get("ok") else "FAILED", _summary(name, v)] for name, v in c.items()]
    cmd = "python3 benchmarks/gpu_check.py" + (" --device cpu --tiny" if line.get("tiny") else "")
    notes = (f"`{cmd}` ran on {line.get('device_name')} ({line.get('device')}, "
             f"{line.get('dtype')}; the line above names the machine that recorded it), torch {line.get('torch')}, megatron-core {line.get('megatron_core')}, "
             f"TransformerEngine: {line.get('transformer_engine') or 'absent'}; {line.get('wall_s')} s in all. "
             f"MFU: {FORMULA}.")
    record("gpu_check", markdown_table(["check", "result", "figures"], rows), line, notes)


def _summary(name: str, v: dict[str, Any]) -> str:
    keys = {"hf_logprobs": ("max_abs_diff", "mean_abs_diff"), "train": ("loss", "matrices_changed"),
            "throughput": ("tokens_per_s", "mfu"), "recompute_memory": ("full_over_none",),
            "publish_engine": ("max_abs_diff", "mean_abs_diff", "untrained_publish_equals_checkpoint")}
    parts = [f"{k} {v[k]}" for k in keys.get(name, ()) if k in v]
    return ", ".join(parts) or str(v.get("error", ""))[:120]


# -- main -----------------------------------------------------------------------------------
def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--tiny", action="store_true", help="inference.tiny_model's shape and small batches")
    ap.add_argument("--dtype", choices=["bf16", "fp32"], default=None, help="default: bf16 on cuda, fp32 on cpu")
    ap.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                    help="a learner setting for every backend built (e.g. packing=false)")
    ap.add_argument("--deadline-s", type=float, default=450.0, help="the whole run's bound")
    ap.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (CPU)")
    ap.add_argument("--out", help="also write the JSON line to this file")
    ap.add_argument("--workdir", help="keep the model and checkpoint here (default: a temporary directory)")
    ap.add_argument("--record", action="store_true", help="write this run's figures to benchmarks/RESULTS.md")
    ap.add_argument("--record-from", metavar="FILE", help="record a run's JSON line (e.g. from a GPU machine) and exit")
    ap.add_argument("--wheels", metavar="DIR", help="download the wheels to carry to a GPU machine and exit")
    ap.add_argument("--python-version", default="3.12", help="--wheels: the GPU machine's Python")
    ap.add_argument("--nccl-probe", action="store_true", help=argparse.SUPPRESS)  # weight_sync_nccl's process
    args = ap.parse_args(argv)
    if args.dtype is None:
        args.dtype = "bf16" if args.device == "cuda" else "fp32"
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.wheels:
        return download_wheels(Path(args.wheels), args.python_version)
    if args.record_from:
        record_line(json.loads(Path(args.record_from).read_text().strip().splitlines()[-1]))
        return 0
    if args.nccl_probe:
        found = nccl_probe()
        print(json.dumps(found, sort_keys=True, default=str), flush=True)
        os._exit(0 if found.get("ok") else 1)  # a thread nothing ended must not hold the exit
    if args.device == "cpu":
        os.environ["CUDA_VISIBLE_DEVICES"] = ""  # the backend picks CUDA whenever it sees one
    early = {"device": args.device, "dtype": args.dtype, "tiny": args.tiny, "python": sys.version.split()[0],
             "compiler": compiler()}  # before torch is imported: TORCHDYNAMO_DISABLE
    missing = missing_imports()
    if missing:
        return refuse(early, missing, args.out)
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        print("--device cuda: torch sees no CUDA device (use --device cpu --tiny here)", file=sys.stderr)
        return 2
    if args.threads:
        torch.set_num_threads(args.threads)
    report = Report({**early, **_versions(args)}, _own_stdout())
    learner_fields(args)  # a bad --set exits 2 before anything runs
    progress(f"{report.info}")

    def deadline() -> None:  # the watchdog thread: whatever the main thread is stuck in
        with report.lock:
            if not report.done:
                report.stop(f"the run passed --deadline-s {args.deadline_s:.0f}")
                report.emit(args.out)
        os._exit(0 if report.ok else 1)

    watchdog = threading.Timer(args.deadline_s, deadline)
    watchdog.daemon = True
    watchdog.start()
    with contextlib.ExitStack() as stack:
        work = Path(args.workdir) if args.workdir else Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="gpu_check-")))
        try:
            Check(args, report, work).run()
        except BaseException as e:  # outside a phase: the line still reports it
            traceback.print_exc(file=sys.stderr)
            report.stop(f"{type(e).__name__}: {e}")
        report.emit(args.out)  # before the shutdown: a hang there cannot lose the line
        _shutdown()
        watchdog.cancel()
    if args.record:
        record_line(json.loads(report.line()))
    return 0 if report.ok else 1


def _own_stdout() -> Any:
    """The JSON line's own copy of file descriptor 1; fd 1 itself (what libraries print, C code
    included) goes to stderr from here on, so stdout holds that one line."""
    own = os.fdopen(os.dup(1), "w")
    sys.stdout.flush()
    os.dup2(2, 1)
    return own


def _versions(args: argparse.Namespace) -> dict[str, Any]:
    import importlib.util
    from importlib.metadata import PackageNotFoundError, version

    import torch

    def v(name: str) -> str | None:
        try:
            return version(name)
        except PackageNotFoundError:
            return None

    te = importlib.util.find_spec("transformer_engine") is not None
    return {"device": args.device, "dtype": args.dtype, "tiny": args.tiny,
            "device_name": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
            "torch": torch.__version__, "megatron_core": v("megatron-core"), "transformers": v("transformers"),
            "transformer_engine": (v("transformer-engine") or v("transformer_engine") or "present") if te else None,
            "python": sys.version.split()[0]}


def _shutdown() -> None:
    import torch.distributed as dist

    with contextlib.suppress(Exception):
        from megatron.core import parallel_state as ps

        ps.destroy_model_parallel()
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
