"""Peak resident memory of the learner's ranks while they load a model and while rank 0 publishes
it, against the model's size: the megatron backend on two gloo ranks (torchrun, CPU) and a
random Qwen3-shaped model of a few hundred MB (nothing from the hub).

    .venv/bin/python benchmarks/publish_load_memory.py [--layouts tensor_parallel=2,pipeline_parallel=2]
        [--compare-with /tmp/old] [--no-record]

Per layout, every rank:
- builds the backend from the HF directory (`construct`: includes megatron-core's own random
  initialisation, which on CPU makes each full tensor once before cutting its shard);
- saves a checkpoint (learner.checkpoint's model part: HF shards written by rank 0 + optimizer
  files) and loads it back (`load checkpoint`: the resume path, each rank reading its shards and
  its optimizer file, whose Adam moments stay resident), then its weights alone (`load weights`:
  what building the backend from the base model does);
- rank 0 publishes through the command channel (learner.trainer.Trainer.weights, the others in
  their `follow` loop) into the two consumers weight_sync has: `publish_disk`
  (weight_sync.checkpoints.write_checkpoint, shards of --shard-mb) and `publish_snapshot`
  (weight_sync.transports.distributed.Snapshot, which keeps a copy of the model by design).

Figures are the peak RSS (VmHWM, reset through /proc/self/clear_refs before each phase, glibc's
free memory handed back with malloc_trim first) above the RSS the phase started from, in MB
and as a fraction of the model's bytes. --compare-with DIR runs the same phases with another
checkout's learner and weight_sync (e.g. `git worktree add --detach /tmp/old <commit>`) and
records both. Last line: JSON.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent

MB = 1 << 20


# -- measuring (in the rank processes) ------------------------------------------------------
def _status() -> dict[str, int]:
    out = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        k, _, v = line.partition(":")
        if k in ("VmRSS", "VmHWM"):
            out[k] = int(v.split()[0]) * 1024
    return out


def _start() -> int:
    """Reset the peak to now; the RSS now."""
    import gc

    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except OSError:
        pass
    Path("/proc/self/clear_refs").write_text("5")
    return _status()["VmRSS"]


def _peak_above(start: int) -> int:
    return _status()["VmHWM"] - start


def _phase(fn: Any) -> tuple[int, Any]:
    start = _start()
    got = fn()
    return _peak_above(start), got


def _load_weights(be: Any, model_dir: Path) -> None:
    """The weights alone into the backend (base model or checkpoint): an HF directory where the
    backend reads its own slices, the whole HF state handed over by the code before it."""
    from learner.backends import megatron_weights

    if hasattr(megatron_weights, "HFSource"):
        be.load_hf(model_dir)
    else:
        from learner.backends.megatron_backend import load_hf_state

        be.load_hf(load_hf_state(model_dir))


def rank_main(args: argparse.Namespace) -> None:
    import torch

    torch.set_num_threads(1)
    import torch.distributed as dist

    from common.settings import parse_scalar
    from learner.backends.megatron_backend import MegatronBackend
    from learner.config import LearnerConfig
    from learner.ranks import init_ranks, shutdown
    from learner.trainer import RankWorker, Trainer, follow

    k, _, v = args.layout.partition("=")
    cfg = LearnerConfig.model_validate({"backend": "megatron", k: parse_scalar(v)})
    ranks = init_ranks(cfg.dist_timeout_s)
    out: dict[str, Any] = {"rank": ranks.rank}
    work = Path(args.work)
    clean = False
    try:
        base = _start()
        be = MegatronBackend(cfg, args.model)
        out["construct"] = _peak_above(base)
        ckpt = work / "ckpt"
        out["save"], _ = _phase(lambda: be.save(ckpt))
        out["load"], _ = _phase(lambda: be.load(ckpt))
        out["load_weights"], _ = _phase(lambda: _load_weights(be, ckpt / "model"))
        worker = RankWorker(be, cfg)
        if ranks.leader:
            from weight_sync.checkpoints import write_checkpoint
            from weight_sync.transports.distributed import Snapshot

            trainer = Trainer(worker, ranks)
            out["publish_disk"], _ = _phase(lambda: write_checkpoint(
                work / "run", 1, 1, trainer.weights(), None, args.shard_mb))
            out["publish_snapshot"], snap = _phase(lambda: Snapshot.take(2, trainer.weights()))
            out["model_bytes"] = sum(t.numel() * t.element_size() for _, t in snap.tensors)
            del snap
            trainer.close()
        else:
            start = _start()
            follow(worker, ranks)  # both publishes, until rank 0 lets it go
            out["publish_follower"] = _peak_above(start)
        every: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(every, out)
        if ranks.leader:
            Path(args.out).write_text(json.dumps(every))
        clean = True
    finally:
        shutdown(ranks, clean)


# -- driving ------------------------------------------------------------------------------
def make_model(out: Path, a: argparse.Namespace) -> None:
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen3Config(vocab_size=a.vocab, hidden_size=a.hidden, intermediate_size=a.ffn,
                      num_hidden_layers=a.layers, num_attention_heads=a.heads,
                      num_key_value_heads=a.kv_heads, head_dim=a.hidden // a.heads,
                      max_position_embeddings=4096, tie_word_embeddings=True)
    Qwen3ForCausalLM(cfg).save_pretrained(out)


def run_layout(code: Path, model: Path, layout: str, shard_mb: float, tmp: Path) -> list[dict[str, Any]]:
    out = tmp / "out.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(code)}
    env = {k: v for k, v in env.items() if not k.startswith("SWARL_")}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
           str(Path(__file__).resolve()), "--rank", "--model", str(model), "--layout", layout,
           "--shard-mb", str(shard_mb), "--work", str(tmp), "--out", str(out)]
    res = subprocess.run(cmd, cwd=code, env=env, capture_output=True, text=True, timeout=1800)
    if res.returncode != 0:
        raise SystemExit(f"{code} {layout}: torchrun failed\n{res.stderr[-4000:]}")
    return json.loads(out.read_text())


def _mb(x: int, model: int) -> str:
    return f"{x / MB:.0f} ({x / model:.2f})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layouts", default="tensor_parallel=2,pipeline_parallel=2")
    ap.add_argument("--compare-with", help="another checkout (the code before a change)")
    ap.add_argument("--vocab", type=int, default=32768)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--ffn", type=int, default=3072)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--shard-mb", type=float, default=64.0)
    ap.add_argument("--no-record", action="store_true")
    # the rank processes
    ap.add_argument("--rank", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--model", help=argparse.SUPPRESS)
    ap.add_argument("--layout", help=argparse.SUPPRESS)
    ap.add_argument("--work", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.rank:  # benchmarks/weight_sync.py would shadow the package
        here = Path(__file__).resolve().parent
        sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != here]
        rank_main(args)
        return
    sys.path[:0] = [str(REPO / "benchmarks")]
    from _record import markdown_table, record

    codes = [("new", REPO)] + ([("old", Path(args.compare_with).resolve())] if args.compare_with else [])
    rows, summary = [], {}
    with tempfile.TemporaryDirectory(prefix="swarl-pubmem-") as t:
        model = Path(t) / "model"
        make_model(model, args)
        for layout in args.layouts.split(","):
            for label, code in codes:
                with tempfile.TemporaryDirectory(prefix="swarl-pubmem-run-") as w:
                    r0, r1 = run_layout(code, model, layout, args.shard_mb, Path(w))
                m = r0["model_bytes"]
                rows.append([layout, label, f"{m / MB:.0f}",
                             *(_mb(r[k], m) for r, k in [(r0, "load_weights"), (r1, "load_weights"),
                                                         (r0, "load"), (r1, "load"), (r0, "publish_disk"),
                                                         (r0, "publish_snapshot"), (r1, "publish_follower"),
                                                         (r0, "construct"), (r1, "construct")])])
                summary[f"{layout}/{label}"] = {"model_bytes": m, "ranks": [r0, r1]}
                print(rows[-1], flush=True)
    headers = ["layout", "code", "model MB", "load weights r0", "load weights r1", "load checkpoint r0",
               "load checkpoint r1", "publish disk r0",
               "publish snapshot r0", "publish r1", "construct r0", "construct r1"]
    table = markdown_table(headers, rows)
    print(table)
    notes = (f"Peak RSS above each phase's start, MB (fraction of the model's bytes); 2 gloo ranks, "
             f"random Qwen3 (vocab {args.vocab}, hidden {args.hidden}, ffn {args.ffn}, {args.layers} "
             f"layers, fp32, tied), checkpoint shards of {args.shard_mb:g} MB. `load weights`: the HF "
             "weights into the backend; `load checkpoint`: the resume path (HF weights + optimizer "
             "files, whose Adam moments then stay resident); `publish disk`: Trainer.weights() into "
             "write_checkpoint; `publish snapshot`: into the distributed transport's Snapshot (a "
             "copy of the model by design); `construct`: building the backend (megatron-core's "
             "CPU initialisation included). `old`: the checkout given by --compare-with.")
    if not args.no_record:
        record("publish_load_memory", table, summary, notes)
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
