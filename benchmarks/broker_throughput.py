"""Samples of 16k tokens through swarl's wire format + replay stream vs raw redis-py XADD /
XREAD of byte strings of the same size, side by side on one private redis-server.

Prints a table; last line: {"write_ratio": w, "read_ratio": r} (swarl / raw throughput).
Usage: .venv/bin/python benchmarks/broker_throughput.py [--samples N] [--tokens T]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time

import numpy as np
import redis.asyncio as aioredis

from _record import markdown_table, record
from broker.keys import Keys
from broker.replay import ReplayReader, ReplayWriter
from broker.wire import Sample, encode
from common.services import start_redis


def make_samples(n: int, tokens: int) -> list[Sample]:
    rng = np.random.default_rng(0)
    out = []
    for i in range(n):
        mask = np.zeros(tokens, np.uint8)
        mask[tokens // 4 :] = 1
        out.append(Sample(tokens=rng.integers(0, 150_000, tokens), loss_mask=mask,
                          rollout_logprobs=rng.normal(size=tokens) * mask, prompt_len=tokens // 4,
                          reward=1.0, group_id=f"g{i // 8}", sample_index=i % 8, instance_id="bench",
                          policy_version=0, sample_id=f"s{i}", weight_versions=["0"] * 10,
                          metrics={"agent/turns": 10.0}))
    return out


async def swarl_round(r: aioredis.Redis, run: str, samples: list[Sample], batch: int) -> tuple[float, float]:
    keys = Keys("swarl", run)
    w = ReplayWriter(r, keys, batch=batch)
    t0 = time.perf_counter()
    await w.add(samples)
    t_write = time.perf_counter() - t0
    rd = ReplayReader(r, keys, consumer="bench")
    await rd.ensure_group()
    t0 = time.perf_counter()
    got = 0
    while got < len(samples):
        entries = await rd.read(count=batch, block_ms=1000)
        await rd.ack([e.id for e in entries])
        got += len(entries)
    t_read = time.perf_counter() - t0
    return t_write, t_read


async def raw_round(r: aioredis.Redis, key: str, payloads: list[bytes], batch: int) -> tuple[float, float]:
    t0 = time.perf_counter()
    for i in range(0, len(payloads), batch):
        pipe = r.pipeline(transaction=False)
        for p in payloads[i : i + batch]:
            pipe.xadd(key, {b"s": p})
        await pipe.execute()
    t_write = time.perf_counter() - t0
    t0 = time.perf_counter()
    last, got = "0-0", 0
    while got < len(payloads):
        res = await r.xread({key: last}, count=batch, block=1000)
        entries = res[0][1]
        last = entries[-1][0]
        got += len(entries)
    t_read = time.perf_counter() - t0
    return t_write, t_read


async def main(n: int, tokens: int, repeats: int, batch: int) -> dict:
    srv = start_redis()
    r = aioredis.Redis.from_url(srv.url)
    try:
        samples = make_samples(n, tokens)
        payloads = [encode(s) for s in samples]
        mb = sum(map(len, payloads)) / 1e6
        res: dict[str, list[float]] = {"swarl_w": [], "swarl_r": [], "raw_w": [], "raw_r": []}
        for rep in range(repeats):  # interleaved, so drift hits both sides alike
            w, rd = await raw_round(r, f"raw{rep}", payloads, batch)
            res["raw_w"].append(w)
            res["raw_r"].append(rd)
            w, rd = await swarl_round(r, f"b{rep}", samples, batch)
            res["swarl_w"].append(w)
            res["swarl_r"].append(rd)
            await r.flushall()
        med = {k: statistics.median(v) for k, v in res.items()}
        rows = [
            ["write (XADD, pipelined)", "swarl wire + stream", mb / med["swarl_w"], n / med["swarl_w"]],
            ["write (XADD, pipelined)", "raw redis-py bytes", mb / med["raw_w"], n / med["raw_w"]],
            ["read (XREADGROUP+decode+XACK)", "swarl wire + stream", mb / med["swarl_r"], n / med["swarl_r"]],
            ["read (XREAD)", "raw redis-py bytes", mb / med["raw_r"], n / med["raw_r"]],
        ]
        table = markdown_table(["path", "side", "MB/s", "samples/s"], rows)
        summary = {"write_ratio": round(med["raw_w"] / med["swarl_w"], 3),
                   "read_ratio": round(med["raw_r"] / med["swarl_r"], 3),
                   "samples": n, "tokens_per_sample": tokens, "bytes_per_sample": len(payloads[0])}
        print(table)
        record("broker_throughput", table, summary,
               notes=f"{n} samples x {tokens} tokens ({len(payloads[0]) / 1024:.0f} KiB each), batch {batch}, "
                     f"median of {repeats} interleaved repeats; goal: both ratios >= 0.8.")
        return summary
    finally:
        await r.aclose()
        srv.stop()


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--samples", type=int, default=400)
    ap.add_argument("--tokens", type=int, default=16384)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--batch", type=int, default=32)
    a = ap.parse_args()
    print(json.dumps(asyncio.run(main(a.samples, a.tokens, a.repeats, a.batch))))
