"""The vocab-parallel logprob head (learner.backends.megatron_head) on tensor-parallel ranks
against the gathered full-vocabulary computation (learner.logprobs), and the memory of both.

    python -m torch.distributed.run --standalone --nproc-per-node 2 \\
        tests/learner/megatron_head_check.py --out FILE

Every rank draws the same full logits [M, V_p] (seeded) and keeps its slice [M, V_p / tp] as
Megatron's output layer would; the padded columns (V_p - vocab, Megatron pads to 128 x tp) hold
large values, so counting them would show. The reference is token_logprobs_entropy on the full
logits' real columns, its gradient cut to this rank's slice. Cases: vocabularies that are and are
not a multiple of 128 x tp (one where the last rank's slice is all padding), temperatures (1, 0.7,
greedy 0), all rows or a subset of slots, chunks smaller than the batch, and gradients through the
logprob, the entropy or both.

Both are also compared with the same convention in fp64: at a vocabulary of 50000 the fp32
gathered computation is itself ~2e-5 from fp64 while the head stays within ~2e-6.

Memory: the peak bytes allocated (torch.profiler's CPU allocator events, as
megatron_publish_memory.py measures) over forward + backward of the head on this rank's slice,
against the code it replaced: megatron-core's gather_from_tensor_model_parallel_region, cut to
the real vocabulary, then learner.logprobs. Rank 0 writes one JSON object to FILE.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import torch

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent.parent)]

from megatron_publish_memory import peak_bytes  # noqa: E402

from inference.logprobs import logprob_temperature  # noqa: E402
from learner.backends.megatron_head import vocab_parallel_logprobs  # noqa: E402
from learner.logprobs import token_logprobs_entropy  # noqa: E402

# (vocab, tokens, temperature, slots, chunk rows, gradient through)
CASES: list[tuple[int, int, float, bool, int, str]] = [
    (1000, 37, 1.0, False, 8, "both"),     # 1000 -> 1024 at tp 2: the last rank has 24 padded columns
    (1000, 37, 0.7, True, 5, "both"),
    (1000, 37, 0.0, False, 64, "logprob"),  # greedy: logprobs of the unscaled distribution
    (1000, 37, 0.7, True, 3, "entropy"),
    (1024, 20, 0.7, True, 7, "both"),      # a multiple of 128 x tp: no padding
    (100, 20, 1.3, False, 6, "both"),      # 100 -> 256: the last rank's slice is all padding
    (50000, 65, 1.0, True, 16, "both"),    # a wider vocabulary, 50000 -> 50176
]


def padded(vocab: int, tp: int) -> int:
    m = 128 * tp
    return -(-vocab // m) * m


def loss(lp: torch.Tensor, ent: torch.Tensor, g_lp: torch.Tensor, g_ent: torch.Tensor, use_lp: bool,
         use_ent: bool) -> torch.Tensor:
    """Only the terms used: an unused output takes no gradient at all (None, not zeros)."""
    terms = [(lp * g_lp).sum()] * use_lp + [(ent * g_ent).sum()] * use_ent
    return torch.stack(terms).sum()


def one_case(vocab: int, n: int, temp: float, with_slots: bool, rows: int, through: str,
             group: Any, rank: int, tp: int) -> dict[str, float]:
    vp = padded(vocab, tp)
    w = vp // tp
    gen = torch.Generator().manual_seed(vocab + n)
    full = torch.randn(n + 5, vp, generator=gen) * 4
    full[:, vocab:] = 40.0  # padding, far above every real logit
    slots = torch.randperm(n + 5, generator=gen)[:n] if with_slots else None
    m = n if with_slots else n + 5
    targets = torch.randint(0, vocab, (m,), generator=gen)
    g_lp, g_ent = torch.randn(m, generator=gen), torch.randn(m, generator=gen)
    use_lp, use_ent = through in ("both", "logprob"), through in ("both", "entropy")

    mine = full[:, rank * w:(rank + 1) * w].clone().requires_grad_(True)
    lp, ent = vocab_parallel_logprobs(mine, targets, vocab=vocab, temperature=temp, with_entropy=True,
                                      slots=slots, group=group, chunk_elements=rows * w)
    assert ent is not None
    lp_only, none = vocab_parallel_logprobs(mine.detach(), targets, vocab=vocab, temperature=temp,
                                            with_entropy=False, slots=slots, group=group)
    assert none is None and torch.equal(lp_only, lp.detach())
    loss(lp, ent, g_lp, g_ent, use_lp, use_ent).backward()

    assert mine.grad is not None
    got = (lp.detach(), ent.detach(), mine.grad)
    out: dict[str, float] = {}
    ref = {}
    for dtype in (torch.float32, torch.float64):
        ref_in = full.to(dtype, copy=True).requires_grad_(True)
        sel = ref_in if slots is None else ref_in[slots]
        ref_lp, ref_ent = token_logprobs_entropy(sel[:, :vocab], targets, temp, True)
        assert ref_ent is not None
        if dtype == torch.float64:  # learner.logprobs computes in fp32: its convention in fp64
            logp_all = torch.log_softmax(sel[:, :vocab] / logprob_temperature(temp), -1)
            ref_lp = logp_all.gather(-1, targets[:, None])[:, 0]
            ref_ent = -(logp_all.exp() * logp_all).sum(-1)
        loss(ref_lp, ref_ent, g_lp.to(dtype), g_ent.to(dtype), use_lp, use_ent).backward()
        assert ref_in.grad is not None
        ref[dtype] = (ref_lp.detach(), ref_ent.detach(), ref_in.grad[:, rank * w:(rank + 1) * w])
    for i, k in enumerate(("logprob", "entropy", "grad")):
        out[k] = float((got[i] - ref[torch.float32][i]).abs().max())
        out[f"{k}_fp64"] = float((got[i].double() - ref[torch.float64][i]).abs().max())
        # how far the gathered fp32 computation itself is from fp64
        out[f"{k}_gathered_fp64"] = float((ref[torch.float32][i].double() - ref[torch.float64][i]).abs().max())
    pad = mine.grad[:, max(0, vocab - rank * w):]
    out["padding_grad"] = float(pad.abs().max()) if pad.numel() else 0.0
    return out


def memory(vocab: int, n: int, group: Any, rank: int, tp: int) -> dict[str, Any]:
    """Peak bytes of forward + backward (logprob and entropy) on this rank, logits [n, V_p/tp]
    already allocated: the head on fp32 and on bf16 logits (the GPU recipes' case), and the
    gathered fp32 computation it replaced. The head's chunks are a 16th of the logits, about
    their share at the recipes' 16384 tokens."""
    from megatron.core.tensor_parallel import gather_from_tensor_model_parallel_region

    from learner.backends.megatron_cpu import cpu_standins

    vp = padded(vocab, tp)
    w = vp // tp
    gen = torch.Generator().manual_seed(0)
    logits32 = (torch.randn(n, w, generator=gen) * 4).requires_grad_(True)
    logits16 = logits32.detach().bfloat16().requires_grad_(True)
    targets = torch.randint(0, vocab, (n,), generator=gen)
    chunk = n * w // 16

    def head(logits: torch.Tensor) -> None:
        lp, ent = vocab_parallel_logprobs(logits, targets, vocab=vocab, temperature=0.7,
                                          with_entropy=True, group=group, chunk_elements=chunk)
        assert ent is not None
        (lp.sum() + ent.sum()).backward()
        logits.grad = None

    def gathered() -> None:  # the backend's head before this one (_vocab + learner.logprobs)
        with cpu_standins():  # megatron-core's gather allocates on "the" CUDA device
            full = gather_from_tensor_model_parallel_region(logits32)[..., :vocab]
        lp, ent = token_logprobs_entropy(full, targets, 0.7, True)
        assert ent is not None
        (lp.sum() + ent.sum()).backward()
        logits32.grad = None

    runs = {"head_fp32": lambda: head(logits32), "head_bf16": lambda: head(logits16), "gathered_fp32": gathered}
    for fn in runs.values():  # warm-up: first calls allocate once-only state (gloo, autograd)
        fn()
    entries = n * w
    out: dict[str, Any] = {"tokens": n, "vocab": vocab, "padded_vocab": vp, "slice": w,
                           "chunk_elements": chunk}
    for name, fn in runs.items():
        peak = peak_bytes(fn)
        out[name] = {"peak_bytes": peak, "bytes_per_token_per_slice_entry": round(peak / entries, 3),
                     "bytes_per_token_per_vocab_entry": round(peak / (n * vp), 3)}
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--mem-tokens", type=int, default=512)
    ap.add_argument("--mem-vocab", type=int, default=32000)
    args = ap.parse_args()
    torch.set_num_threads(1)

    import torch.distributed as dist
    from megatron.core import parallel_state as ps

    dist.init_process_group("gloo")
    rank, tp = dist.get_rank(), dist.get_world_size()
    ps.initialize_model_parallel(tensor_model_parallel_size=tp)
    group = ps.get_tensor_model_parallel_group()
    try:
        worst: dict[str, float] = {}
        cases = []
        for case in CASES:
            diffs = one_case(*case, group=group, rank=rank, tp=tp)
            cases.append({"case": case, **diffs})
            for k, v in diffs.items():
                worst[k] = max(worst.get(k, 0.0), v)
        mem = memory(args.mem_vocab, args.mem_tokens, group, rank, tp)
        every: list[Any] = [None] * tp
        dist.all_gather_object(every, {"rank": rank, "max_diff": worst, "cases": cases, "memory": mem})
        if rank == 0:
            out = {"tp": tp, "ranks": every, "method": "torch.profiler CPU allocator events",
                   "max_diff": {k: max(r["max_diff"][k] for r in every) for k in worst}}
            print(json.dumps(out))
            Path(args.out).write_text(json.dumps(out))
    finally:
        ps.destroy_model_parallel()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
