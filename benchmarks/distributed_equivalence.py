"""The same fixed samples through 1 rank and through 2 ranks (torchrun, gloo on CPU), for every
parallel layout that runs here: torch data parallel 2, Megatron data parallel 2 (with and
without the distributed optimizer), Megatron tensor parallel 2 and pipeline parallel 2. Each run takes 3 optimizer
steps (learner.equivalence: a varying number of micro-batches per step); the per-token logprobs
after every step and the final published weights must agree within 1e-4 in fp32.

Also: a CPU inference server that joins a weight-update group as tensor-parallel size 2 (two
receiving ranks) gets a new version over the distributed transport, and its weights' checksum
equals the learner's.

    .venv/bin/python benchmarks/distributed_equivalence.py

Prints a table, records it in benchmarks/RESULTS.md; last line one JSON object:
{"configs": [...], "max_logprob_diff": x, "max_param_diff": y, "tp2_server_update_ok": bool}.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # the packages before this folder (benchmarks/weight_sync.py)

from _record import markdown_table, record  # noqa: E402

TOLERANCE = 1e-4
# name, the backend's settings, ranks
LAYOUTS: list[tuple[str, list[str]]] = [
    ("torch DP=2", ["learner.backend=torch"]),
    ("megatron DP=2", ["learner.backend=megatron", "learner.use_distributed_optimizer=false"]),
    ("megatron DP=2 + distributed optimizer", ["learner.backend=megatron",
                                               "learner.use_distributed_optimizer=true"]),
    ("megatron TP=2", ["learner.backend=megatron", "learner.tensor_parallel=2"]),
    ("megatron PP=2", ["learner.backend=megatron", "learner.pipeline_parallel=2"]),
]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}


def _run(model: Path, out: Path, nproc: int, sets: list[str]) -> dict[str, Any]:
    import torch

    args = ["-m", "learner.equivalence", "--model", str(model), "--out", str(out),
            *(a for s in sets for a in ("--set", s))]
    cmd = [sys.executable, *args] if nproc == 1 else [
        sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}", *args]
    res = subprocess.run(cmd, cwd=REPO, env=ENV, capture_output=True, text=True, timeout=1800)
    if res.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[-6:])}: exit {res.returncode}\n{res.stderr[-2000:]}")
    return torch.load(out, weights_only=False)


def _diffs(one: dict[str, Any], two: dict[str, Any]) -> tuple[float, float, float]:
    lp = max(float((a - b).abs().max()) for a, b in zip(one["logprobs"], two["logprobs"], strict=True))
    if one["params"].keys() != two["params"].keys():
        raise RuntimeError(f"published names differ: {sorted(one['params'].keys() ^ two['params'].keys())[:5]}")
    par = max(float((one["params"][k] - two["params"][k]).abs().max()) for k in one["params"])
    gn = max(abs(a["grad_norm"] - b["grad_norm"]) / max(abs(a["grad_norm"]), 1e-12)
             for a, b in zip(one["stats"], two["stats"], strict=True))
    return lp, par, gn


async def _tp2_server_update(model: Path, work: Path) -> tuple[bool, str]:
    """A tp-2 and a tp-1 CPU server updated over gloo by the weight-sync coordinator; both report
    the published version and the learner's checksum."""
    import torch

    from broker.connection import connect
    from broker.keys import Keys
    from broker.registry import ServerRegistry
    from common.services import start_redis
    from inference.local_server import start_cpu_server
    from inference.weights import checksum, read_safetensors_dir
    from weight_sync import make_publisher
    from weight_sync.config import WeightSyncConfig

    redis = start_redis(work / "redis")
    servers = []
    r = connect(redis.url)
    try:
        keys = Keys("swarl", "equiv")
        key = "equivalence-key"
        servers = [start_cpu_server(model, redis_url=redis.url, run_id="equiv", api_key=key,
                                    log_dir=work, extra_args=["--tp-size", str(tp)])
                   for tp in (2, 1)]
        for _ in range(300):
            listed = await ServerRegistry(r, keys).list(alive_only=True)
            if len(listed) == 2 and all(s.state == "ready" for s in listed):
                break
            await asyncio.sleep(0.1)
        tp_sizes = sorted(s.meta.tp_size for s in listed if s.meta)
        if tp_sizes != [1, 2]:
            return False, f"servers registered tp sizes {tp_sizes}, expected [1, 2]"
        ws = WeightSyncConfig(transport="distributed", backend="gloo", wait_rollout=True,
                              poll_interval_s=0.2, min_ready=0, max_updating=2, api_key=key)
        pub = make_publisher(ws, r, keys, work / "run", str(model))
        try:
            new = {n: t + 0.01 for n, t in read_safetensors_dir(model).items()}
            with torch.no_grad():
                await pub.publish(1, 1, lambda: list(new.items()))
        finally:
            await pub.close()
        want = checksum(new)
        import httpx

        async with httpx.AsyncClient(timeout=30, headers={"Authorization": f"Bearer {key}"}) as http:
            got = [(await http.get(f"{s.url}/swarl/weights_checksum")).json() for s in servers]
        ok = all(g["sha256"] == want and g["weight_version"] == "1" for g in got)
        return ok, "" if ok else f"checksums/versions after the update: {got}, expected {want}"
    finally:
        await r.aclose()
        for s in servers:
            s.stop()
        redis.stop()


def main() -> int:
    from inference.tiny_model import init_tiny

    rows: list[list[Any]] = []
    summary: dict[str, Any] = {"configs": [], "max_logprob_diff": 0.0, "max_param_diff": 0.0,
                               "max_grad_norm_rel_diff": 0.0, "failed": []}
    with tempfile.TemporaryDirectory(prefix="swarl-equiv-") as tmp:
        work = Path(tmp)
        model = init_tiny(work / "model", seed=0, vocab_size=512, hidden_size=64,
                          intermediate_size=128, num_hidden_layers=2, head_dim=16)
        singles: dict[str, dict[str, Any]] = {}
        for name, sets in LAYOUTS:
            t0 = time.monotonic()
            try:
                base = sets[0]
                if base not in singles:
                    singles[base] = _run(model, work / f"one-{len(singles)}.pt", 1, [base])
                two = _run(model, work / f"two-{len(rows)}.pt", 2, sets)
                lp, par, gn = _diffs(singles[base], two)
            except RuntimeError as e:
                print(f"{name}: FAILED: {e}", file=sys.stderr)
                rows.append([name, "failed", "-", "-", round(time.monotonic() - t0, 1)])
                summary["failed"].append(name)
                continue
            rows.append([name, f"{lp:.2e}", f"{par:.2e}", f"{gn:.1e}", round(time.monotonic() - t0, 1)])
            summary["configs"].append(name)
            summary["max_logprob_diff"] = max(summary["max_logprob_diff"], lp)
            summary["max_param_diff"] = max(summary["max_param_diff"], par)
            summary["max_grad_norm_rel_diff"] = max(summary["max_grad_norm_rel_diff"], gn)
        ok, why = asyncio.run(_tp2_server_update(model, work))
        summary["tp2_server_update_ok"] = ok
        if not ok:
            print(f"tp2 server update: {why}", file=sys.stderr)
    table = markdown_table(["2 ranks vs 1", "max logprob diff", "max param diff",
                            "grad norm rel. diff", "seconds"], rows)
    print(table)
    notes = (f"Tiny Qwen3 (vocab 512, hidden 64, 2 layers), fp32, 3 AdamW steps at lr 1e-3 on 6 "
             f"samples of 24-120 tokens with a 160-token micro-batch budget (2-4 micro-batches per "
             f"rank and step); gloo on 2 CPU ranks. Tolerance {TOLERANCE:g}. tp2 server update: "
             f"{'ok' if summary['tp2_server_update_ok'] else 'FAILED'}.")
    summary["max_logprob_diff"] = float(f"{summary['max_logprob_diff']:.3g}")
    summary["max_param_diff"] = float(f"{summary['max_param_diff']:.3g}")
    summary["max_grad_norm_rel_diff"] = float(f"{summary['max_grad_norm_rel_diff']:.3g}")
    record("distributed_equivalence", table, summary, notes)
    print(json.dumps(summary))
    good = (not summary["failed"] and summary["tp2_server_update_ok"]
            and summary["max_logprob_diff"] <= TOLERANCE and summary["max_param_diff"] <= TOLERANCE)
    return 0 if good else 1


if __name__ == "__main__":
    raise SystemExit(main())
