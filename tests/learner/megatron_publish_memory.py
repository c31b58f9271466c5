"""Peak memory of the megatron backend's publish_tensors (and of writing the model into a
checkpoint) on every rank, against the model's size.

    python -m torch.distributed.run --standalone --nproc-per-node 2 \\
        tests/learner/megatron_publish_memory.py --model DIR [--set tensor_parallel=2]
        [--shard-bytes 524288] [--bucket-bytes 65536] [--out FILE]

Measured: the bytes a publish allocates beyond what was allocated before it, at their peak —
torch.cuda.max_memory_allocated on GPU; on CPU torch.profiler's allocator events (every
allocation and free of a CPU tensor, summed in order). Two consumers on rank 0: one that reads
each tensor and drops it (streaming to a server or a file), one that keeps them all (a whole
snapshot, which is the model's size by construction); `save_hf`, which writes the model as
safetensors shards of at most --shard-bytes as the tensors stream in; and the learner's own path,
rank 0's Trainer.weights() with the other rank in its command loop (`follow`), measured on both
as peak RSS (the channel pickles objects outside torch's allocator). Rank 0 prints one JSON line
(and writes it to FILE): per rank the peaks, the model's size in HF tensors, its largest tensor
and the shards written.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def peak_bytes(fn: Callable[[], Any]) -> int:
    """Peak of the bytes allocated while `fn` runs, net of what was allocated before."""
    if torch.cuda.is_available():
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        fn()
        torch.cuda.synchronize()
        return int(torch.cuda.max_memory_allocated() - base)
    import tempfile

    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        prof.export_chrome_trace(f.name)  # every allocator event, with its signed size
        events = json.loads(Path(f.name).read_text())["traceEvents"]
    live = peak = 0
    for ev in sorted((e for e in events if e.get("name") == "[memory]"), key=lambda e: e["ts"]):
        live += int(ev["args"]["Bytes"])
        peak = max(peak, live)
    return peak


def rss_peak_bytes(fn: Callable[[], Any]) -> int:
    """Peak resident memory while `fn` runs above the resident memory before it (VmHWM, reset
    through /proc/self/clear_refs): sees what the allocator events do not, such as the pickled
    bytes of objects sent through torch.distributed's *_object collectives."""
    import ctypes
    import gc

    def status(key: str) -> int:
        line = next(x for x in Path("/proc/self/status").read_text().splitlines() if x.startswith(key))
        return int(line.split()[1]) * 1024

    gc.collect()
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    Path("/proc/self/clear_refs").write_text("5")
    start = status("VmRSS:")
    fn()
    return status("VmHWM:") - start


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--set", dest="sets", action="append", default=[])
    ap.add_argument("--shard-bytes", type=int, default=1 << 19)
    ap.add_argument("--bucket-bytes", type=int, default=1 << 16)
    ap.add_argument("--out")
    args = ap.parse_args()
    torch.set_num_threads(1)

    import torch.distributed as dist

    from common.settings import parse_scalar
    from learner.backends.megatron_backend import MegatronBackend
    from learner.config import LearnerConfig
    from learner.ranks import init_ranks, shutdown

    fields: dict[str, Any] = {"backend": "megatron"}
    for s in args.sets:
        k, _, v = s.partition("=")
        fields[k] = parse_scalar(v)
    cfg = LearnerConfig.model_validate(fields)
    ranks = init_ranks(cfg.dist_timeout_s)
    try:
        be = MegatronBackend(cfg, args.model, checkpoint_shard_bytes=args.shard_bytes)
        sizes: list[int] = []

        def stream() -> None:  # read each tensor, then let it go
            for _, t in be.publish_tensors():
                sizes.append(t.numel() * t.element_size())
                float(t.sum())

        kept: list[Any] = []

        def keep() -> None:
            kept.extend(be.publish_tensors())

        with tempfile.TemporaryDirectory() as tmp:  # rank 0 writes into its own; the others gather
            ckpt = Path(tmp) / "model"
            mine = {"rank": ranks.rank, "stream_peak": peak_bytes(stream), "keep_peak": peak_bytes(keep),
                    "save_peak": peak_bytes(lambda: be.save_hf(ckpt)),
                    "shards": sorted(p.name for p in ckpt.glob("*.safetensors"))}
        # small buckets (many per pipeline stage): rank 0 gets the HF model's own tensors
        from learner.backends.megatron_backend import load_hf_state
        from learner.backends.megatron_weights import gather_hf

        got = dict(gather_hf(be.model, be.arch, be.te, bucket_bytes=args.bucket_bytes))
        if ranks.leader:
            want = load_hf_state(args.model)
            mine["bucketed_equal"] = got.keys() == want.keys() and all(
                torch.equal(got[k], want[k]) for k in want)
        del got
        # through the command channel, as the learner publishes (learner.trainer)
        from learner.trainer import RankWorker, Trainer, follow

        worker = RankWorker(be, cfg)
        if ranks.leader:
            trainer = Trainer(worker, ranks)

            def via_channel() -> None:
                for _, t in trainer.weights():
                    float(t.sum())

            mine["channel_rss"] = rss_peak_bytes(via_channel)
            trainer.close()
        else:
            mine["channel_rss"] = rss_peak_bytes(lambda: follow(worker, ranks))
        every: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(every, mine)
        if ranks.leader:
            out = {"layout": {"tensor_parallel": cfg.tensor_parallel, "pipeline_parallel": cfg.pipeline_parallel,
                              "data_parallel": be.dp_size, "distributed_optimizer": cfg.use_distributed_optimizer},
                   "model_bytes": sum(sizes), "largest_tensor_bytes": max(sizes), "ranks": every,
                   "shard_bytes": args.shard_bytes,
                   "method": "cuda max_memory_allocated" if torch.cuda.is_available()
                   else "torch.profiler CPU allocator events"}
            print(json.dumps(out))
            if args.out:
                Path(args.out).write_text(json.dumps(out))
    finally:
        shutdown(ranks, clean=True)


if __name__ == "__main__":
    main()
