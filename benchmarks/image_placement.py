"""Image pulls under image-affinity vs least-loaded placement: a run's lease sequence replayed
over K nodes through the pool's real reserve/release scripts on a private redis-server, with
envd's ImageIndex recording each image where it arrives (as envd does after a pull).

The default sequence is a synthetic run shaped like SWE-Gym training: T tasks, each with its
own image (sizes log-normal around 1.5 GB), enqueued group by group (n samples per prompt),
E epochs, C episodes at once, each holding its lease for a log-normal time. `--leases FILE`
replays a recorded sequence instead (JSONL: image, start_s, duration_s, optional size_bytes).
It runs without a disk budget and again with each node keeping at most `--disk-images` images
(LRU among the unused ones, as envd's budget does).

Prints a table; last line: {"pulls_affinity": a, "pulls_least_loaded": b, ...}.
Usage: .venv/bin/python benchmarks/image_placement.py [--nodes K] [--tasks T] [--samples N]
       [--epochs E] [--concurrency C] [--max-per-node M] [--disk-images D] [--leases FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import heapq
import json
import random
import time
from dataclasses import dataclass, field
from pathlib import Path

import redis.asyncio as aioredis

from _record import markdown_table, record
from broker.config import RedisConfig
from broker.keys import Keys
from common.services import start_redis
from envd.config import PoolConfig
from envd.image_index import ImageIndex
from envd.pool_state import PoolState


@dataclass
class Lease:
    image: str
    start: float
    duration: float


@dataclass
class Result:
    pulls: int = 0
    bytes: int = 0
    evictions: int = 0
    waits: int = 0  # reserves that found no room and waited for a release
    per_node: dict[str, int] = field(default_factory=dict)


def synthetic(tasks: int, samples: int, epochs: int, concurrency: int, seed: int) -> tuple[list[Lease], dict[str, int]]:
    """Leases in queue order: each epoch visits the tasks in a new order, a group at a time;
    C actor slots take the next job as soon as one frees (so C episodes run at once)."""
    rng = random.Random(seed)
    sizes = {f"registry.local/swe-gym/task-{t}:latest": int(rng.lognormvariate(21.1, 0.5)) for t in range(tasks)}
    images = list(sizes)
    slots = [0.0] * concurrency  # when each actor slot is free again
    out: list[Lease] = []
    for _ in range(epochs):
        order = images[:]
        rng.shuffle(order)
        for image in order:
            for _ in range(samples):
                start = heapq.heappop(slots)
                duration = rng.lognormvariate(0.0, 0.6)
                out.append(Lease(image, start, duration))
                heapq.heappush(slots, start + duration)
    return out, sizes


def from_file(path: Path) -> tuple[list[Lease], dict[str, int]]:
    leases, sizes = [], {}
    for line in path.read_text().splitlines():
        if line.strip():
            row = json.loads(line)
            leases.append(Lease(row["image"], float(row["start_s"]), float(row["duration_s"])))
            sizes[row["image"]] = int(row.get("size_bytes", 1_500_000_000))
    leases.sort(key=lambda lease: lease.start)
    return leases, sizes


async def replay(url: str, mode: str, leases: list[Lease], sizes: dict[str, int], nodes: int,
                 max_per_node: int, disk_images: int) -> Result:
    keys = Keys("bench", f"placement-{mode}-{time.time_ns()}")
    pcfg = PoolConfig(max_concurrent=10**6, max_per_node=max_per_node, health_stale_s=10**6,
                      image_affinity=mode == "affinity")
    state = await PoolState.open(pcfg, RedisConfig(url=url), keys)
    redis = aioredis.Redis.from_url(url)
    urls = {f"http://node-{i}:5000": f"node-{i}" for i in range(nodes)}
    index = {nid: ImageIndex(redis, keys, nid) for nid in urls.values()}
    held: dict[str, dict[str, int]] = {nid: {} for nid in urls.values()}  # node -> image -> leases
    present: dict[str, dict[str, float]] = {nid: {} for nid in urls.values()}  # node -> image -> last use
    for u, nid in urls.items():
        await state.add_node(u)
        await state.set_health(u, True, node_id=nid)
    res = Result(per_node={nid: 0 for nid in urls.values()})
    ends: list[tuple[float, str, str, str]] = []  # (end, lease id, node id, image)

    async def release_until(t: float) -> None:
        while ends and ends[0][0] <= t:
            _, lid, nid, image = heapq.heappop(ends)
            await state.release(lid)
            held[nid][image] -= 1

    try:
        for i, lease in enumerate(leases):
            await release_until(lease.start)
            while True:
                status, node = await state.reserve(f"l{i}", lease.image, f"t{i}", "bench")
                if status == "ok":
                    break
                res.waits += 1  # every node full: wait for the next release
                await release_until(ends[0][0])
            nid = urls[node]
            if lease.image not in present[nid]:
                res.pulls += 1
                res.bytes += sizes[lease.image]
                res.per_node[nid] += 1
                await index[nid].arrived(lease.image, lease.start)
            else:
                await index[nid].used(lease.image, lease.start)
            present[nid][lease.image] = lease.start
            held[nid][lease.image] = held[nid].get(lease.image, 0) + 1
            heapq.heappush(ends, (lease.start + lease.duration, f"l{i}", nid, lease.image))
            if disk_images:
                # envd's budget: least recently used first, never an image in use
                for victim in sorted(present[nid], key=present[nid].__getitem__):
                    if len(present[nid]) <= disk_images:
                        break
                    if held[nid].get(victim, 0) == 0:
                        del present[nid][victim]
                        await index[nid].left(victim)
                        res.evictions += 1
    finally:
        await redis.aclose()
        await state.close()
    return res


async def main(args: argparse.Namespace) -> dict:
    if args.leases:
        leases, sizes = from_file(Path(args.leases))
        source = f"recorded sequence {args.leases}"
    else:
        leases, sizes = synthetic(args.tasks, args.samples, args.epochs, args.concurrency, args.seed)
        source = (f"synthetic run: {args.tasks} tasks x {args.samples} samples x {args.epochs} epochs, "
                  f"{args.concurrency} episodes at once")
    budgets = [0] if args.disk_images == 0 else [0, args.disk_images]
    srv = start_redis()
    try:
        t0 = time.perf_counter()
        results = {(mode, d): await replay(srv.url, mode, leases, sizes, args.nodes, args.max_per_node, d)
                   for d in budgets for mode in ("affinity", "least_loaded")}
        seconds = time.perf_counter() - t0
    finally:
        srv.stop()
    gb = 1e9
    rows = [[mode, f"{d} images" if d else "none", len(leases), r.pulls, round(r.bytes / gb, 1), r.evictions,
             r.waits, " ".join(str(v) for v in r.per_node.values())] for (mode, d), r in results.items()]
    table = markdown_table(["placement", "disk budget per node", "leases", "pulls", "GB pulled", "evictions",
                            "waits", "pulls per node"], rows)
    print(table)
    a, b = results[("affinity", 0)], results[("least_loaded", 0)]
    summary = {"pulls_affinity": a.pulls, "pulls_least_loaded": b.pulls,
               "bytes_affinity": a.bytes, "bytes_least_loaded": b.bytes,
               "pull_ratio": round(a.pulls / max(1, b.pulls), 3), "leases": len(leases),
               "images": len(sizes), "nodes": args.nodes, "max_per_node": args.max_per_node,
               "disk_images": args.disk_images, "seconds": round(seconds, 2)}
    if args.disk_images:
        ab, bb = results[("affinity", args.disk_images)], results[("least_loaded", args.disk_images)]
        summary.update(pulls_affinity_budget=ab.pulls, pulls_least_loaded_budget=bb.pulls,
                       bytes_affinity_budget=ab.bytes, bytes_least_loaded_budget=bb.bytes)
    notes = (f"{source}; {args.nodes} nodes, pool.max_per_node {args.max_per_node}; without a disk budget"
             + (f" and with at most {args.disk_images} images per node (LRU among the unused, as "
                "envd.image_budget does)" if args.disk_images else "")
             + ". Each lease is placed by the pool's reserve script on a private redis-server; a pull "
               "is counted when the chosen node lacks the image, which then arrives at once "
               "(recorded by envd's ImageIndex). Least-loaded = pool.image_affinity false. "
               "Summary keys without a suffix are the no-budget run.")
    if not args.no_record:
        record("image_placement", table, summary, notes)
    return summary


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nodes", type=int, default=4)
    p.add_argument("--tasks", type=int, default=200)
    p.add_argument("--samples", type=int, default=8, help="samples per prompt (a group's leases)")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--concurrency", type=int, default=48, help="episodes at once over the cluster")
    p.add_argument("--max-per-node", type=int, default=16)
    p.add_argument("--disk-images", type=int, default=40,
                   help="also replay with each node keeping at most this many images (0: only without a budget)")
    p.add_argument("--leases", help="JSONL of recorded leases: image, start_s, duration_s[, size_bytes]")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-record", action="store_true", help="print only; leave RESULTS.md alone")
    print(json.dumps(asyncio.run(main(p.parse_args())), sort_keys=True))
