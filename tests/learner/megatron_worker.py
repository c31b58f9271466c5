"""One learner layout of the megatron backend on fixed samples, alone or under torchrun (the
multi-rank tests in test_megatron_ranks.py run it in real processes).

    python tests/learner/megatron_worker.py --model DIR --out FILE [--set key=value ...]
        [--steps 3] [--save-at 2 --ckpt DIR [--shard-bytes N]] [--resume DIR --first-step 3]
        [--bucket-size N] [--probe-model DIR]

Every rank builds the backend after the default process group is up (learner.ranks, as the
learner does), trains its data-parallel shard of each step's samples (learner.trainer.shard_step,
learner.train.train_step: a varying number of micro-batches per step and per rank), and after
each step computes per-token logprobs of a fixed probe batch. Rank 0 writes FILE (torch.save):
logprobs per step, the published weights before and after training, each step's statistics and
every rank's micro-batch count per step.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import torch

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent.parent)]

from learner_helpers import make_sample  # noqa: E402

from learner.config import LearnerConfig  # noqa: E402
from learner.packing import MicroBatch, TrainItem, make_microbatches  # noqa: E402
from learner.train import set_token_weights, split_minibatches  # noqa: E402

STEP_SIZES = (3, 6, 4)  # samples per step: micro-batch counts differ per step and per rank


def items(step: int, n: int, minibatches: int = 1) -> list[TrainItem]:
    """`n` fixed samples (learner_helpers.make_sample) of lengths 20..90, rewards ±1, in groups
    of two split into `minibatches` (learner.train.split_minibatches)."""
    out = []
    for i in range(n):
        length = 20 + (37 * (step * 7 + i)) % 71
        s = make_sample(f"g{step}", i, reward=1.0 if i % 2 else -1.0, length=length,
                        prompt_len=4 + i % 5, seed=1000 * (step + 1) + i, logprob=-5.0)
        out.append(TrainItem(s.sample_id, s.tokens, s.loss_mask, s.rollout_logprobs,
                             0.8 if i % 2 else -0.6))
    groups = split_minibatches([2] * ((n + 1) // 2), minibatches)
    for i, it in enumerate(out):
        it.minibatch = groups[i // 2]
    set_token_weights(out, "token")
    return out


def probe(vocab: int) -> list[MicroBatch]:
    """Three fixed samples (token ids below `vocab`) in one packed micro-batch."""
    its = items(-1, 3)
    for it in its:
        it.tokens = it.tokens % vocab
    return make_microbatches(its, 1 << 16)


def probe_logprobs(backend: Any) -> torch.Tensor:
    with torch.no_grad():
        return torch.cat([backend.logprobs(mb, grad=False, with_entropy=False)[0].detach().float().cpu()
                          for mb in probe(backend.arch.vocab)])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--set", dest="sets", action="append", default=[])
    ap.add_argument("--steps", type=int, default=len(STEP_SIZES))
    ap.add_argument("--first-step", type=int, default=1)
    ap.add_argument("--save-at", type=int, default=0)
    ap.add_argument("--ckpt")
    ap.add_argument("--resume")
    ap.add_argument("--bucket-size", type=int)
    ap.add_argument("--shard-bytes", type=int, default=10**9)
    ap.add_argument("--probe-model")
    args = ap.parse_args()
    torch.set_num_threads(1)

    import torch.distributed as dist

    from common.settings import parse_scalar
    from learner.backends.megatron_backend import MegatronBackend
    from learner.ranks import init_ranks, shutdown
    from learner.train import train_step
    from learner.trainer import shard_step

    fields: dict[str, Any] = {"backend": "megatron", "lr": 1e-3, "max_tokens_per_microbatch": 100}
    for s in args.sets:
        k, _, v = s.partition("=")
        fields[k] = parse_scalar(v)
    cfg = LearnerConfig.model_validate(fields)
    ranks = init_ranks(cfg.dist_timeout_s)
    try:
        be = MegatronBackend(cfg, args.model, ddp_bucket_size=args.bucket_size,
                             checkpoint_shard_bytes=args.shard_bytes)
        out: dict[str, Any] = {"dp_size": be.dp_size, "logprobs": {}, "stats": {}, "mb_counts": {}}
        if args.resume:
            be.load(Path(args.resume))
        out["params_start"] = be.hf_state()
        for step in range(args.first_step, args.steps + 1):
            shard = shard_step(items(step, STEP_SIZES[step - 1], cfg.minibatches), be.dp_size)[be.dp_rank]
            st = train_step(be, shard, cfg)
            counts: list[Any] = [None] * ranks.world
            dist.all_gather_object(counts, (be.dp_rank, int(st["microbatches"])))
            out["stats"][step], out["mb_counts"][step] = st, counts
            out["logprobs"][step] = probe_logprobs(be)
            if step == args.save_at:
                be.save(Path(args.ckpt))
        out["params"] = be.hf_state()
        if args.probe_model:
            other = MegatronBackend(cfg, args.probe_model)
            out["probe_model_logprobs"] = probe_logprobs(other)
            out["probe_model_params"] = other.hf_state()
        if ranks.leader:
            torch.save(out, args.out)
    finally:
        shutdown(ranks, clean=True)


if __name__ == "__main__":
    main()
