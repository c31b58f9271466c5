"""What the logprob head costs inside a real training step of the megatron backend, in bytes per
micro-batch token per entry of this rank's vocabulary slice: the constant swarl.plan uses.

    python -m torch.distributed.run --standalone --nproc-per-node 2 \\
        tests/learner/megatron_head_memory.py --models DIR_V1 DIR_V2 [--set key=value ...]
        [--tokens 2048] [--chunk-elements 262144] [--head gathered] [--out FILE]

DIR_V1 and DIR_V2 are the same tiny model (hidden 64) with two vocabulary sizes. On each, the
learner's own learner.train.train_step runs one micro-batch of `--tokens` tokens (the optimizer
step left out: it is not the head) and the peak bytes allocated during it are measured
(torch.profiler's CPU allocator events, megatron_publish_memory.peak_bytes). Everything that does
not grow with the vocabulary (layer activations, the hidden states) is the same in both runs, so

    bytes per token per slice entry = (peak_V2 - peak_V1) / (tokens x (slice_V2 - slice_V1))

and a third run, on DIR_V2 with chunks 4 times larger, gives what the head's chunk temporaries
cost per logit of a chunk: (peak_V2,4c - peak_V2,c) / (3 c).

`--head gathered` measures the head this one replaced (the logits upcast to fp32 by
Float16Module, gathered over the vocabulary, learner.logprobs on the full vocabulary): its
constant is per entry of the whole padded vocabulary. Rank 0 prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent.parent)]

from megatron_publish_memory import peak_bytes  # noqa: E402

from learner.packing import TrainItem  # noqa: E402


def items(tokens: int, vocab: int) -> list[TrainItem]:
    """Four samples filling one micro-batch of `tokens`, every token but the prompt trained."""
    rng = np.random.default_rng(0)
    n = tokens // 4
    out = []
    for i in range(4):
        mask = np.ones(n, dtype=np.uint8)
        mask[:4] = 0
        out.append(TrainItem(f"s{i}", rng.integers(0, vocab, n).astype(np.int32), mask,
                             np.where(mask == 1, -3.0, 0.0).astype(np.float32), adv=0.5 - i % 2,
                             tok_w=1.0 / (4 * (n - 4))))
    return out


def use_gathered_head() -> None:
    """The backend's head before megatron_head: fp32 logits from Float16Module, all-gathered
    over the vocabulary, learner.logprobs on the real columns of the full vocabulary."""
    from megatron.core import parallel_state as ps
    from megatron.core.tensor_parallel import gather_from_tensor_model_parallel_region
    from megatron.core.transformer.module import Float16Module

    from learner.backends.megatron_backend import MegatronBackend
    from learner.logprobs import token_logprobs_entropy

    fp16_forward = Float16Module.forward

    def forward(self: Any, *inputs: Any, fp32_output: bool = True, **kwargs: Any) -> Any:
        return fp16_forward(self, *inputs, fp32_output=True, **kwargs)

    def head(self: MegatronBackend, logits: torch.Tensor, pmb: Any,
             with_entropy: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        if ps.get_tensor_model_parallel_world_size() > 1:
            logits = gather_from_tensor_model_parallel_region(logits)
        return token_logprobs_entropy(logits[..., : self.arch.vocab][pmb.rows, pmb.cols], pmb.targets,
                                      self.cfg.rollout_temperature, with_entropy)

    Float16Module.forward = forward
    MegatronBackend._head = head  # type: ignore[method-assign]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", nargs=2, required=True)
    ap.add_argument("--set", dest="sets", action="append", default=[])
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--chunk-elements", type=int, default=1 << 18)
    ap.add_argument("--head", choices=["vocab-parallel", "gathered"], default="vocab-parallel")
    ap.add_argument("--out")
    args = ap.parse_args()
    torch.set_num_threads(1)

    import torch.distributed as dist

    from common.settings import parse_scalar
    from learner.backends import megatron_head
    from learner.backends.megatron_backend import MegatronBackend
    from learner.config import LearnerConfig
    from learner.ranks import init_ranks, shutdown
    from learner.train import train_step

    if args.head == "gathered":
        use_gathered_head()
    fields: dict[str, Any] = {"backend": "megatron", "dtype": "bf16", "max_tokens_per_microbatch": args.tokens}
    for s in args.sets:
        k, _, v = s.partition("=")
        fields[k] = parse_scalar(v)
    cfg = LearnerConfig.model_validate(fields)
    ranks = init_ranks(cfg.dist_timeout_s)
    try:
        runs = []
        chunk = args.chunk_elements
        for model, chunk_elements in ((args.models[0], chunk), (args.models[1], chunk), (args.models[1], 4 * chunk)):
            # chunks far smaller than the logits, as at the recipes' scale (16M of 300M logits
            # at TP 8): the same in the first two runs, so their temporaries cancel there
            megatron_head.CHUNK_ELEMENTS = chunk_elements
            be = MegatronBackend(cfg, model, model if cfg.kl_coef else None)
            be.step = lambda max_norm=None: {"grad_norm": 0.0, "lr": 0.0}  # type: ignore[method-assign]
            batch = items(args.tokens, be.arch.vocab)

            def one_step(be: MegatronBackend = be, batch: list[TrainItem] = batch) -> None:
                st = train_step(be, batch, cfg)
                assert st["microbatches"] == 1
                be._zero_grads()

            one_step()  # warm-up: lazily made state (gloo, autograd, Megatron's buffers)
            width = be.model.output_layer.weight.shape[0]
            runs.append({"model": model, "vocab": be.arch.vocab, "slice": width, "chunk_elements": chunk_elements,
                         "peak_bytes": peak_bytes(one_step)})
            del be
        a, b, c = runs
        per_slice = (b["peak_bytes"] - a["peak_bytes"]) / (args.tokens * (b["slice"] - a["slice"]))
        per_chunk = (c["peak_bytes"] - b["peak_bytes"]) / (3 * chunk)
        tp = cfg.tensor_parallel
        mine = {"rank": ranks.rank, "runs": runs, "bytes_per_token_per_slice_entry": round(per_slice, 3),
                "bytes_per_token_per_vocab_entry": round(per_slice / tp, 3),
                "bytes_per_chunk_element": round(per_chunk, 3)}
        every: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(every, mine)
        if ranks.leader:
            out = {"head": args.head, "tokens": args.tokens, "tensor_parallel": tp, "dtype": cfg.dtype,
                   "entropy_coef": cfg.entropy_coef, "kl_coef": cfg.kl_coef, "ranks": every,
                   "method": "torch.profiler CPU allocator events, difference of two vocabularies"}
            print(json.dumps(out))
            if args.out:
                Path(args.out).write_text(json.dumps(out))
    finally:
        shutdown(ranks, clean=True)


if __name__ == "__main__":
    main()
