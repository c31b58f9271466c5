"""What the whole-system tests share: `swarl` subcommands as subprocesses, the learner's own
records (trained.jsonl, metrics.jsonl) and a watcher that keeps every replay-stream entry the
actors write (the learner trims the stream once it has acknowledged entries)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis

from broker.keys import Keys
from broker.replay import ReplayReader
from broker.wire import Sample

REPO = Path(__file__).resolve().parents[2]


def swarl_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SWARL_")}
    return env | {"OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}


def swarl(*args: str, timeout: float = 120, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "swarl.cli", *args], cwd=REPO, env=swarl_env() | (env or {}),
                          capture_output=True, text=True, timeout=timeout)


def start_swarl(log: Path, *args: str) -> subprocess.Popen[bytes]:
    with open(log, "wb") as f:
        return subprocess.Popen([sys.executable, "-m", "swarl.cli", *args], cwd=REPO, env=swarl_env(),
                                stdout=f, stderr=subprocess.STDOUT, start_new_session=True)


def trained(run_dir: Path) -> list[tuple[int, list[str]]]:
    """(step, sample ids) per learner step, from <run.dir>/learner/trained.jsonl."""
    p = run_dir / "learner" / "trained.jsonl"
    if not p.exists():
        return []
    return [(d["step"], d["ids"]) for d in map(json.loads, p.read_text().splitlines())]


def metrics(run_dir: Path) -> list[dict[str, Any]]:
    from learner.metrics_log import read_metrics

    return read_metrics(run_dir / "metrics.jsonl")


@dataclass
class StreamWatch:
    """Reads the replay stream through a consumer group of its own ("test-watch", acking what
    it reads) every `every` seconds and keeps each sample by id. A group of its own, created
    before any sample is written, makes it lossless: the learner trims the stream only below
    what every group has acknowledged (broker.replay), so an entry is never trained, acked and
    trimmed before the watch has read it, however late this process is scheduled. The
    learner's own group is not disturbed."""

    redis_url: str
    keys: Keys
    every: float = 0.2
    samples: dict[str, Sample] = field(default_factory=dict)
    _stop: asyncio.Event = field(default_factory=asyncio.Event)
    _task: asyncio.Task[None] | None = None

    async def start(self) -> StreamWatch:
        r = aioredis.Redis.from_url(self.redis_url)
        reader = ReplayReader(r, self.keys, group="test-watch", consumer="watch-0")
        await reader.ensure_group()
        self._task = asyncio.create_task(self._run(r, reader))
        return self

    async def _run(self, r: aioredis.Redis, reader: ReplayReader) -> None:
        try:
            while not self._stop.is_set():
                await self.poll(reader)
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._stop.wait(), self.every)
            await self.poll(reader)
        finally:
            await r.aclose()

    async def poll(self, reader: ReplayReader) -> None:
        while entries := await reader.read(count=500, block_ms=None):
            for e in entries:
                self.samples[e.sample.sample_id] = e.sample
            await reader.ack([e.id for e in entries])

    async def stop(self) -> None:
        self._stop.set()
        if self._task is not None:
            await self._task

    def episodes(self) -> dict[str, list[Sample]]:
        out: dict[str, list[Sample]] = {}
        for s in self.samples.values():
            out.setdefault(s.episode_id or s.sample_id, []).append(s)
        return out


def job_ids(keys: Keys, rows: list[dict[str, Any]], n: int, epochs: int) -> set[str]:
    """The ids `swarl enqueue --n-samples n --epochs epochs` gives the jobs of `rows`."""
    return {keys.job_id(r["instance_id"], e, i) for r in rows for e in range(epochs) for i in range(n)}


async def wait_jobs_ended(redis_url: str, keys: Keys, ids: set[str], procs: list[Any],
                          within_s: float) -> tuple[set[str], dict[str, str]]:
    """Wait until every job is done or failed for good; returns (done, {failed id: reason}).
    A process of `procs` (Popen-like: poll()) that exits first fails the wait."""
    r = aioredis.Redis.from_url(redis_url, decode_responses=True)
    try:
        deadline = asyncio.get_running_loop().time() + within_s
        while True:
            done = set(await r.smembers(keys.jobs_done)) & ids
            failed = {k: v for k, v in (await r.hgetall(keys.jobs_failed)).items() if k in ids}
            if done | set(failed) == ids:
                return done, failed
            for p in procs:
                code = p.poll() if hasattr(p, "poll") else p.proc.poll()
                assert code is None, f"{getattr(p, 'args', p)} exited with {code}"
            assert asyncio.get_running_loop().time() < deadline, \
                f"jobs not ended within {within_s:.0f}s: {sorted(ids - done - set(failed))[:5]}"
            await asyncio.sleep(1.0)
    finally:
        await r.aclose()
