"""Time to deliver M MB of weights to K = 1, 2, 4 CPU inference servers through swarl's disk and
gloo transports, side by side with the raw operations underneath:

- swarl disk: publish() (safetensors + sha256 + manifest, atomic rename) → the coordinator
  verifies the checkpoint and updates every server (/update_weights_from_disk, weight_version
  checked) → all K registered ready at v. max_updating = K and
  min_ready = 0 (all K at once, as the raw broadcast), no pinned episodes.
- raw disk: write the same bytes once (fsync) and read them back K times in parallel — the
  floor of any disk transport.
- swarl gloo: publish() with transport=distributed → per-server groups (made on a warm-up
  publish, as in a run) → bucketed broadcast with /update_weights_from_distributed → all K ready
  at v (the disk copy for late joiners is written once these broadcasts are done).
- raw gloo: one gloo group of 1 + K processes (K receiver subprocesses) broadcasting the same
  tensors from rank 0, group already made.

Servers are real `swarl inference serve` subprocesses on a Qwen3 sized to M MB; Redis is a
private redis-server. Last line: JSON with disk_ratio and dist_ratio (raw / swarl time at the
largest K; 1.0 = no overhead).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "tests")]

from _record import markdown_table, record  # noqa: E402

API_KEY = "bench-weight-sync"


def _receiver(port: int, rank: int, world: int, meta_path: str, rounds: int) -> None:
    """A raw gloo receiver: join, then receive every tensor `rounds` times."""
    import torch

    from weight_sync.update_group import init_custom_process_group

    torch.set_num_threads(1)
    meta = json.loads(Path(meta_path).read_text())
    pg = init_custom_process_group("gloo", f"tcp://127.0.0.1:{port}", world, rank, "raw")
    bufs = [torch.empty(shape, dtype=getattr(torch, dt)) for dt, shape in meta]
    import torch.distributed as dist

    for _ in range(rounds):
        works = [dist.broadcast(b, 0, group=pg, async_op=True) for b in bufs]
        for w in works:
            w.wait()
    dist.destroy_process_group(pg)


def _raw_disk(tensors: list, k: int, tmp: Path) -> float:
    from concurrent.futures import ThreadPoolExecutor

    from safetensors.torch import save

    t0 = time.perf_counter()
    data = save(dict(tensors))
    p = tmp / "raw.bin"
    with open(p, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())

    def read(_: int) -> int:
        with open(p, "rb") as f:
            return len(f.read())

    with ThreadPoolExecutor(k) as ex:
        list(ex.map(read, range(k)))
    dt = time.perf_counter() - t0
    p.unlink()
    return dt


def _raw_gloo(tensors: list, k: int, tmp: Path, rounds: int = 2) -> float:
    import torch.distributed as dist

    from common.services import free_port
    from weight_sync.update_group import init_custom_process_group

    meta = tmp / "meta.json"
    meta.write_text(json.dumps([[str(t.dtype).removeprefix("torch."), list(t.shape)] for _, t in tensors]))
    port = free_port()
    procs = [subprocess.Popen([sys.executable, __file__, "--receiver", str(port), str(r + 1), str(k + 1),
                               str(meta), str(rounds)], cwd=REPO) for r in range(k)]
    try:
        pg = init_custom_process_group("gloo", f"tcp://127.0.0.1:{port}", k + 1, 0, "raw")
        times = []
        for _ in range(rounds):
            t0 = time.perf_counter()
            works = [dist.broadcast(t, 0, group=pg, async_op=True) for _, t in tensors]
            for w in works:
                w.wait()
            times.append(time.perf_counter() - t0)
        dist.destroy_process_group(pg)
    finally:
        for p in procs:
            p.wait(timeout=60)
    return min(times)


async def _swarl(transport: str, k: int, servers: list, redis_url: str, run_dir: Path, tensors: list,
                 model_dir: Path, version0: int) -> tuple[float, int]:
    """Warm-up publish (groups, page cache), then a timed one; returns (seconds, next version)."""
    from broker.connection import connect
    from broker.registry import ServerRegistry
    from swarl.config import load_config
    from weight_sync import make_publisher

    cfg = load_config(None, [f"redis.url={redis_url}", "run.id=bench", f"run.dir={run_dir}",
                             f"weight_sync.transport={transport}", f"weight_sync.max_updating={k}",
                             "weight_sync.min_ready=0",
                             "weight_sync.poll_interval_s=0.05", "weight_sync.wait_rollout=false",
                             f"weight_sync.api_key={API_KEY}", "weight_sync.keep_versions=2"],
                      environ={})
    redis = connect(redis_url)
    keys = cfg.keys
    pub = make_publisher(cfg.weight_sync, redis, keys, cfg.run.dir, str(model_dir), redis_cfg=cfg.redis)
    try:
        v = version0
        best = float("inf")
        registry = ServerRegistry(redis, keys)
        urls = {x.url for x in servers}

        async def delivered(version: int) -> bool:
            infos = [s for s in await registry.list(alive_only=True) if s.url in urls]
            return len(infos) == k and all(s.version == version and s.state == "ready" for s in infos)

        for i in range(4):
            v += 1
            t0 = time.perf_counter()
            # delivery = publish() called → every server registered ready at v (a distributed
            # publish also writes the disk copy for late joiners meanwhile)
            task = asyncio.create_task(pub.publish(v, v, lambda: iter(tensors)))
            while not await delivered(v):
                if task.done() and task.exception():
                    raise task.exception()
                await asyncio.sleep(0.01)
            dt = time.perf_counter() - t0
            await task
            if i > 0:  # the first round makes groups and warms caches
                best = min(best, dt)
        assert pub.coordinator is not None
        hist = pub.coordinator.history()
        assert all(r.ok for r in hist), [r for r in hist if not r.ok]
        return best, v
    finally:
        await pub.close()
        await redis.aclose()


async def main(mb: float, ks: list[int]) -> None:
    import torch
    from safetensors.torch import load_file

    from common.services import start_redis
    from inference.local_server import start_cpu_server
    from inference.tiny_model import init_tiny

    torch.set_num_threads(1)
    tmp = Path(tempfile.mkdtemp(prefix="swarl-bench-ws-"))
    # Qwen3 sized to ~mb MB of float32: 12 * hidden^2 per layer with intermediate = 3 * hidden
    hidden = 256
    layers = max(1, int((mb * 1e6 / 4 - 4096 * hidden) / (12 * hidden * hidden)))
    model_dir = init_tiny(tmp / "model", seed=0, hidden_size=hidden, intermediate_size=3 * hidden,
                          num_hidden_layers=layers, num_attention_heads=8, num_key_value_heads=4,
                          head_dim=32)
    base = load_file(model_dir / "model.safetensors")
    g = torch.Generator().manual_seed(1)
    tensors = [(n, t + 0.01 * torch.randn(t.shape, generator=g, dtype=t.dtype)) for n, t in sorted(base.items())]
    nbytes = sum(t.numel() * t.element_size() for _, t in tensors)
    redis = start_redis(tmp / "redis")
    servers = []
    rows, results = [], {}
    try:
        version = 0
        for k in ks:
            while len(servers) < k:
                servers.append(start_cpu_server(model_dir, redis_url=redis.url, run_id="bench",
                                                api_key=API_KEY, log_dir=tmp))
            active = servers[:k]
            # servers beyond k would be updated too: run each K with exactly K servers
            for extra in servers[k:]:
                extra.stop()
            servers = active
            d_swarl, version = await _swarl("disk", k, active, redis.url, tmp / "run", tensors, model_dir, version)
            g_swarl, version = await _swarl("distributed", k, active, redis.url, tmp / "run", tensors,
                                            model_dir, version)
            d_raw = min(_raw_disk(tensors, k, tmp) for _ in range(3))
            g_raw = _raw_gloo(tensors, k, tmp, rounds=3)
            results[k] = (d_raw, d_swarl, g_raw, g_swarl)
            rows.append([k, round(nbytes / 1e6, 1), d_raw, d_swarl, d_raw / d_swarl, g_raw, g_swarl, g_raw / g_swarl])
            print(f"K={k}: disk raw {d_raw:.3f}s swarl {d_swarl:.3f}s | gloo raw {g_raw:.3f}s swarl {g_swarl:.3f}s",
                  flush=True)
    finally:
        for s in servers:
            s.stop()
        redis.stop()
    headers = ["K servers", "MB", "raw disk s", "swarl disk s", "disk ratio", "raw gloo s", "swarl gloo s",
               "gloo ratio"]
    table = markdown_table(headers, rows)
    print(table)
    kmax = max(results)
    d_raw, d_swarl, g_raw, g_swarl = results[kmax]
    summary = {"mb": round(nbytes / 1e6, 1), "k": kmax, "disk_ratio": round(d_raw / d_swarl, 3),
               "dist_ratio": round(g_raw / g_swarl, 3),
               "disk_ratio_by_k": {str(k): round(r[0] / r[1], 3) for k, r in results.items()},
               "dist_ratio_by_k": {str(k): round(r[2] / r[3], 3) for k, r in results.items()},
               "goal": ">= 0.5"}
    notes = (f"Load average at the end: {os.getloadavg()[0]:.1f} (other work shares the machine). "
             "Times are best-of-3 after a warm-up publish. swarl disk includes serialisation, sha256, "
             "atomic rename, manifest (the coordinator trusts the checkpoint its own learner just hashed; "
             "verify_own_checkpoints=false), K server loads and the weight_version check; raw disk is one write + K parallel reads of the same bytes. swarl gloo includes the "
             "CPU snapshot, K per-server broadcasts, the HTTP metadata calls and the version check (the disk "
             "copy for late joiners is written after these broadcasts); raw gloo is one broadcast of the same tensors to K "
             "receivers. 2 cores shared by the learner, K servers and Redis.")
    record("weight_sync", table, summary, notes)
    print(json.dumps(summary))


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--receiver":
        _receiver(int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5], int(sys.argv[6]))
        sys.exit(0)
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=float, default=192.0, help="Model size in MB (float32).")
    ap.add_argument("--k", default="1,2,4", help="Server counts, comma-separated.")
    a = ap.parse_args()
    asyncio.run(main(a.mb, [int(x) for x in a.k.split(",")]))
