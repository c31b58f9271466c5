"""Every redis-cli command of the docs/operations.md cookbook, run against a live run.

The run is made of the real parts: an arq worker (broker.tasks.worker_settings) holding two
jobs in flight, the replay stream written and read through a consumer group, a poisoned
entry dead-lettered, published versions, a registered and pinned server, an actor, the
admission counter and a job failed for good. The commands are taken from the doc itself, so
a key renamed in broker/keys.py (or a command mistyped in the doc) fails here.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from broker.keys import Keys

DOC = Path(__file__).resolve().parents[2] / "docs" / "operations.md"
SERVER_ID = "127.0.0.1:30000"
ACTOR_ID = "actor-a"

pytestmark = pytest.mark.skipif(shutil.which("redis-cli") is None, reason="redis-cli not installed")


def cookbook() -> list[tuple[str, str]]:
    """(label, command) pairs: each command with the comment line above it."""
    text = DOC.read_text()
    m = re.search(r"<!-- cookbook:start -->(.*?)<!-- cookbook:end -->", text, re.S)
    assert m, "docs/operations.md has no cookbook section"
    out, label = [], ""
    for line in m.group(1).splitlines():
        if line.startswith("# "):
            label = line[2:].strip()
        elif line.startswith("redis-cli "):
            out.append((label, line.strip()))
    return out


def sample(i: int, group: str):
    from broker.wire import Sample

    n = 16
    mask = np.array([0] * 8 + [1] * 8, dtype=np.uint8)
    return Sample(tokens=np.arange(n, dtype=np.int32), loss_mask=mask,
                  rollout_logprobs=np.where(mask == 1, -0.5, 0.0).astype(np.float32),
                  prompt_len=8, reward=1.0, group_id=group, sample_index=i,
                  instance_id="demo__demo-1", policy_version=1, sample_id=f"{group}:{i}:0")


async def live_run(redis_url: str, tmp_path: Path):
    """Build the run's state with the real broker code; returns (worker, task, release, job ids)."""
    from arq.worker import Worker, get_kwargs

    from broker.admission import Admission
    from broker.connection import connect
    from broker.registry import ActorRegistry, PolicyRegistry, ServerMeta, ServerRegistry
    from broker.replay import ReplayReader, ReplayWriter
    from broker.tasks import arq_pool, enqueue_jobs, jobs_for, record_failure, worker_settings
    from swarl.config import load_config

    keys = Keys("swarl", "local")
    cfg = load_config(None, [f"redis.url={redis_url}", "run.id=local", f"run.dir={tmp_path}",
                             "queue.poll_delay_s=0.1"], environ={})
    redis = connect(redis_url, cfg.redis)

    # 2 instances x 3 samples = 6 jobs; a worker with max_jobs=2 holds two of them
    pool = await arq_pool(redis_url)
    for iid in ("demo__demo-1", "demo__demo-2"):
        inst = {"instance_id": iid, "repo": "demo/demo"}
        await enqueue_jobs(pool, keys, jobs_for(keys, inst, "test", 3))
    await pool.aclose()
    release = asyncio.Event()
    started: list[str] = []

    async def rollout(ctx, payload):
        started.append(payload["job_id"])
        await release.wait()
        return {"ok": True}

    settings = get_kwargs(worker_settings(cfg.queue, keys, redis_url, rollout, max_jobs=2))
    settings["handle_signals"] = False
    worker = Worker(**settings)
    task = asyncio.create_task(worker.async_run())
    for _ in range(200):
        if len(started) == 2:
            break
        await asyncio.sleep(0.05)
    assert len(started) == 2, "the worker did not take two jobs"
    await record_failure(redis, keys, "local:demo__demo-9:g0:s0", "envd unreachable", 3)

    # replay: 3 samples + a poisoned entry read by the learner's group, 1 acked, 2 more unread
    writer, reader = ReplayWriter(redis, keys), ReplayReader(redis, keys, "learner", "learner-0")
    await reader.ensure_group()
    await writer.add([sample(i, "demo__demo-1:g0") for i in range(3)])
    await redis.xadd(keys.replay, {"s": b"\x00not msgpack"})
    got = await reader.read(count=10, block_ms=100)
    assert len(got) == 3
    await reader.ack([got[0].id])
    await writer.add([sample(i, "demo__demo-2:g0") for i in range(3, 5)])

    policy = PolicyRegistry(redis, keys)
    await policy.publish(1, {"path": str(tmp_path / "weights" / "v1"), "step": 1})
    await policy.publish(2, {"path": str(tmp_path / "weights" / "v2"), "step": 2})
    servers = ServerRegistry(redis, keys)
    await servers.register(SERVER_ID, f"http://{SERVER_ID}", 2, state="ready",
                           meta=ServerMeta(kind="scripted"))
    assert (await servers.pin("episode-1", min_version=2)) is not None
    actors = ActorRegistry(redis, keys)
    await actors.register(ACTOR_ID, "node-7", 4242, 4)
    await actors.heartbeat(ACTOR_ID, 2, {"episodes": 5})
    admission = Admission(redis, keys, cfg.admission)
    assert await admission.try_start()
    assert await admission.admit("demo__demo-1:g0", 3, job_id="local:demo__demo-1:g0:s0") == "started"
    await redis.aclose()
    return worker, task, release, started


def run_cmd(cmd: str, redis_url: str, job_id: str) -> str:
    cmd = (cmd.replace("<job id>", job_id).replace("<server id>", SERVER_ID)
           .replace("<actor id>", ACTOR_ID))
    p = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, timeout=30,
                       env={**os.environ, "R": redis_url})
    assert p.returncode == 0, f"{cmd}: {p.stderr}"
    assert not p.stdout.startswith(("ERR", "(error)", "WRONGTYPE")), f"{cmd}: {p.stdout}"
    return p.stdout


# label (start of the comment above the command) -> check of its output
def _lines(out: str) -> list[str]:
    return [x for x in out.splitlines() if x.strip()]


def expectations(job_ids: list[str]) -> dict[str, object]:
    return {
        "queue depth": lambda o: o.strip() == "6",  # arq keeps running jobs in the queue
        "the next jobs": lambda o: len(_lines(o)) == 12,
        "in-flight jobs": lambda o: sorted(x.removeprefix("arq:in-progress:") for x in _lines(o)) == sorted(job_ids),
        "how long one claim": lambda o: 0 < int(o) <= 15_000,  # queue.claim_ttl_s, renewed
        "jobs done": lambda o: o.strip() == "0",
        "jobs failed for good": lambda o: "local:demo__demo-9:g0:s0" in o and "envd unreachable" in o,
        "replay stream length": lambda o: o.strip() == "6",
        "consumer groups": lambda o: "learner" in o and re.search(r"pending\n2\n", o) and re.search(r"lag\n2\n", o),
        "pending summary": lambda o: _lines(o)[0] == "2" and "learner-0" in o,
        "pending entries": lambda o: len(_lines(o)) == 8 and "learner-0" in o,
        "dead-lettered entries": lambda o: o.strip() == "1",
        "the newest dead letters": lambda o: "error" in o and "learner" in o,
        "newest published policy version": lambda o: o.strip() == "2",
        "every published version": lambda o: sorted(_lines(o)[0::2]) == ["1", "2"] and "weights/v2" in o,
        "inference servers": lambda o: o.strip() == SERVER_ID,
        "one server": lambda o: "ready" in o and f"http://{SERVER_ID}" in o,
        "episodes pinned": lambda o: o.strip() == "1",
        "actors": lambda o: o.strip() == ACTOR_ID,
        "one actor": lambda o: "node-7" in o and "4242" in o,
        "rollouts started": lambda o: o.strip() == "4",  # one, and a group of three
        "jobs holding an admission slot": lambda o: _lines(o) == ["swarl:{local}:admission:job:local:demo__demo-1:g0:s0"],
        "learner": lambda o: True,           # written by a running learner; none here
        "run-wide counters": lambda o: "jobs_failed" in o and "samples_dead_lettered" in o,
        "pool: envd nodes": lambda o: o.strip() == "",   # written by a running pool; none here
        "pool: open leases": lambda o: o.strip() == "0",
        "every key of the run": lambda o: "swarl:{local}:replay" in o and "swarl:{local}:queue" in o,
        "durability": lambda o: "aof_enabled" in o,
    }


async def test_cookbook_commands_against_a_live_run(redis_url, tmp_path):
    commands = cookbook()
    assert len(commands) >= 25
    worker, task, release, job_ids = await live_run(redis_url, tmp_path)
    try:
        checks = expectations(job_ids)
        seen: set[str] = set()
        for label, cmd in commands:
            out = await asyncio.to_thread(run_cmd, cmd, redis_url, job_ids[0])
            matched = [k for k in checks if label.startswith(k)]
            assert matched, f"no expectation for cookbook entry {label!r}"
            key = max(matched, key=len)
            assert checks[key](out), f"{label}: `{cmd}` gave:\n{out}"
            seen.add(key)
        assert seen == set(checks), f"cookbook lacks: {set(checks) - seen}"
    finally:
        release.set()
        await asyncio.sleep(0.3)
        await worker.close()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
