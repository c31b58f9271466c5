"""Activation recompute in the megatron backend (CPU, one process, fp32): what a training step
keeps and costs with learner.recompute none, selective and full.

A random Qwen3-shaped model (hidden 512, 8 layers, 8 heads / 2 kv heads of 64, ffn 1536, vocab
4096) trains on one micro-batch of --tokens tokens through the backend's own train_microbatches.
Per mode:
- saved: the bytes autograd saves during the model's forward (distinct storages, parameters left
  out; counting stops where the logprob head starts), as tests/learner/test_megatron_recompute.py
  counts them;
- peak: the peak of the bytes allocated during the whole step (forward, head, backward;
  torch.profiler's allocator events, megatron_publish_memory.peak_bytes);
`plan` is swarl.plan's stored activations for the TE spec (s (L A + 2 h b), full s (L h b + 2 h b));
the CPU runs the local spec, which keeps more without recompute (docs/gpu.md). Prints a table and,
last, one JSON line; records both in benchmarks/RESULTS.md.

Memory only: on a shared 2-core machine step times say little (the GPU check, benchmarks/
gpu_check.py, times recompute on a GPU).

Run: .venv/bin/python benchmarks/recompute_memory.py [--tokens 1024 --threads 2]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

from _record import markdown_table, record

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests" / "learner"), str(ROOT)]

SHAPE = dict(hidden_size=512, num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=2,
             head_dim=64, intermediate_size=1536, vocab_size=4096)
MODES = ("none", "selective", "full")


def make_model(out: Path) -> Path:
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    Qwen3ForCausalLM(Qwen3Config(**SHAPE, max_position_embeddings=8192)).save_pretrained(out)
    return out


def step(be: Any, item: Any, tokens: int, saved: dict[int, int] | None) -> None:
    from learner.packing import make_microbatches

    done = False
    params = {p.untyped_storage().data_ptr() for p in be.ddp.parameters()}

    def pack(t: torch.Tensor) -> torch.Tensor:
        st = t.untyped_storage()
        if saved is not None and not done and st.data_ptr() not in params:
            saved[st.data_ptr()] = st.nbytes()
        return t

    def loss_fn(lp: torch.Tensor, ent: Any, mb: Any) -> tuple[torch.Tensor, dict[str, float]]:
        nonlocal done
        done = True
        return lp.mean(), {}

    head = be._head

    def head_first(*a: Any, **kw: Any) -> Any:
        nonlocal done
        done = True  # the model's forward is over: the logprob head is sized on its own
        return head(*a, **kw)

    be._head = head_first
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            be.train_microbatches(make_microbatches([item], tokens), loss_fn)
    finally:
        del be._head
    be._zero_grads()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=1024)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    from megatron_publish_memory import peak_bytes

    from learner.backends.megatron_backend import MegatronBackend
    from learner.config import LearnerConfig
    from learner.packing import TrainItem
    from swarl.plan import ModelShape, layer_activation_bytes

    s = args.tokens
    rng = np.random.default_rng(0)
    item = TrainItem("s", rng.integers(0, SHAPE["vocab_size"], s).astype(np.int32),
                     np.ones(s, np.uint8), np.zeros(s, np.float32), adv=1.0, tok_w=1.0 / s)
    m = ModelShape(name="bench", source="benchmarks/recompute_memory.py", layers=SHAPE["num_hidden_layers"],
                   hidden=SHAPE["hidden_size"], heads=SHAPE["num_attention_heads"],
                   kv_heads=SHAPE["num_key_value_heads"], head_dim=SHAPE["head_dim"],
                   ffn=SHAPE["intermediate_size"], vocab=SHAPE["vocab_size"], tied=False, qk_norm=True)
    h, L, b = m.hidden, m.layers, 4
    plan = {"none": s * (L * layer_activation_bytes(m, 1, b) + 2 * h * b),
            "full": s * (L * h * b + 2 * h * b)}
    plan["selective"] = plan["none"] - s * L * 4 * m.heads

    with tempfile.TemporaryDirectory() as d:
        model = make_model(Path(d) / "model")
        bes = {mode: MegatronBackend(LearnerConfig(backend="megatron", recompute=mode,  # type: ignore[arg-type]
                                                   max_tokens_per_microbatch=s), model)
               for mode in MODES}
        res: dict[str, dict[str, Any]] = {}
        for mode, be in bes.items():
            saved: dict[int, int] = {}
            step(be, item, s, saved)  # warm-up, and the saved bytes
            res[mode] = {"saved": sum(saved.values()), "peak": peak_bytes(lambda be=be: step(be, item, s, None))}

    mib = 1024**2
    rows, summary = [], {"tokens": s, "shape": SHAPE, "threads": args.threads}
    for mode in MODES:
        r = res[mode]
        rows.append([mode, round(r["saved"] / mib, 1), round(plan[mode] / mib, 1), round(r["peak"] / mib, 1)])
        summary[mode] = {"saved_bytes": r["saved"], "plan_bytes": plan[mode], "peak_bytes": r["peak"]}
    table = markdown_table(["recompute", "saved MiB", "plan (TE spec) MiB", "peak MiB"], rows)
    print(table)
    record("recompute_memory", table, summary, notes=(
        f"One micro-batch of {s} tokens, fp32, local spec (CPU), {args.threads} threads: "
        "`.venv/bin/python benchmarks/recompute_memory.py`. saved = autograd's saved tensors "
        "during the forward; peak = allocated bytes over the whole step. The plan counts the "
        "TE spec (flash attention, fused norms), which keeps less than the local spec without "
        "recompute; under full recompute both keep each layer's input."))
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
