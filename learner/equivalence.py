"""Same samples, one rank or many: the check that anything true of one learner rank is equally
true of N (tests/learner and benchmarks/distributed_equivalence.py run it).

`python -m learner.equivalence --model DIR --out FILE [--set learner.key=value ...]`, alone or
under `torchrun --nproc-per-node N`: every rank builds the configured backend, then for each of
--steps optimizer steps takes the same deterministic batch of samples (lengths that make the
number of micro-batches differ from step to step), trains its data-parallel shard of it exactly
as the learner does (learner.trainer.shard_items, learner.train.train_step), and after each step
computes the per-token logprobs of a fixed probe batch. Rank 0 writes the logprobs, the
published weights (backend.publish_tensors) and the step statistics to FILE (torch.save).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import numpy as np
import torch

from common.settings import SettingsError
from learner.config import LearnerConfig
from learner.packing import TrainItem, make_microbatches
from learner.train import set_token_weights, split_minibatches


def batch(step: int, vocab: int, n: int = 6, seed: int = 1234, minibatches: int = 1,
          aggregation: str = "token") -> list[TrainItem]:
    """`n` samples of varied lengths with prompt (mask 0) and answer (mask 1) parts, rewards ±1,
    in groups of two split into `minibatches` (learner.train.split_minibatches)."""
    rng = np.random.default_rng(seed + step)
    items = []
    for i in range(n):
        length = int(rng.integers(24, 120))
        prompt = int(rng.integers(4, length // 2))
        tokens = rng.integers(3, vocab, size=length).astype(np.int32)
        mask = np.zeros(length, dtype=np.uint8)
        mask[prompt:] = 1
        behav = np.where(mask == 1, rng.uniform(-4.0, -0.5, size=length), 0.0).astype(np.float32)
        adv = 1.0 if i % 2 else -1.0
        items.append(TrainItem(f"s{step}-{i}", tokens, mask, behav, adv))
    groups = split_minibatches([2] * ((n + 1) // 2), minibatches)
    for i, it in enumerate(items):
        it.minibatch = groups[i // 2]
    set_token_weights(items, aggregation)
    return items


def run(cfg: LearnerConfig, model_dir: str, steps: int) -> dict[str, Any] | None:
    from learner.ranks import init_ranks, shutdown

    torch.manual_seed(0)
    ranks = init_ranks(cfg.dist_timeout_s)
    clean = False
    try:
        out = _steps(cfg, model_dir, steps)
        clean = True
        return out if ranks.leader else None
    finally:
        shutdown(ranks, clean)


def _steps(cfg: LearnerConfig, model_dir: str, steps: int) -> dict[str, Any]:
    from learner.backends import make_backend
    from learner.train import train_step
    from learner.trainer import shard_step

    backend = make_backend(cfg, model_dir)
    from transformers import AutoConfig

    vocab = int(AutoConfig.from_pretrained(model_dir).vocab_size)
    probe = make_microbatches(batch(-1, vocab, n=3), 1 << 16)
    mbs = cfg.minibatches
    out: dict[str, Any] = {"logprobs": [], "stats": [], "dp_size": backend.dp_size}
    for step in range(1, steps + 1):
        shard = shard_step(batch(step, vocab, minibatches=mbs, aggregation=cfg.aggregation),
                           backend.dp_size)[backend.dp_rank]
        st = train_step(backend, shard, cfg)
        if "update_kl" in st:  # each rank holds its share (learner.trainer sums them so)
            st["update_kl_ranks"] = backend.dp_sum(st["update_kl"])
        out["stats"].append(st)
        with torch.no_grad():
            out["logprobs"].append(torch.cat([backend.logprobs(mb, grad=False, with_entropy=False)[0]
                                              .detach().float().cpu() for mb in probe]))
    out["params"] = {n: t.detach().float().cpu().clone() for n, t in backend.publish_tensors()}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--model", required=True, help="HF model directory")
    ap.add_argument("--out", required=True, help="where rank 0 writes its results (torch.save)")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--set", dest="sets", action="append", default=[],
                    help="learner.key=value (repeatable)")
    args = ap.parse_args(argv)
    fields: dict[str, Any] = {"lr": 1e-3, "max_tokens_per_microbatch": 160, "threads": 1}
    try:
        from common.settings import parse_scalar

        for item in args.sets:
            key, _, raw = item.partition("=")
            if not key.startswith("learner.") or not raw:
                raise SettingsError(f"--set {item!r}: expected learner.KEY=VALUE")
            fields[key.removeprefix("learner.")] = parse_scalar(raw)
        cfg = LearnerConfig.model_validate(fields)
    except (SettingsError, ValueError) as e:
        print(f"learner.equivalence: {e}", file=sys.stderr)
        return 2
    torch.set_num_threads(cfg.threads)
    result = run(cfg, args.model, args.steps)
    if result is not None:
        torch.save(result, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
