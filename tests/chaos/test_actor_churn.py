"""Actors added and removed at random every few seconds through a whole run (SIGTERM or SIGKILL,
one to three at a time), with a real learner, CPU inference server, pool, envd and dockerd.

"Every enqueued job ends exactly once" is checked by an oracle that does not use the learner's
own bookkeeping (its consumed set, counters or Redis state):
- a second consumer group, `oracle`, created before the run and never acknowledging, keeps the
  whole replay stream (the learner trims only below what every group acknowledged): the multiset
  of sample ids that reached the stream;
- `<run>/learner/trained.jsonl`, one line per optimizer step with the sample ids that step
  trained on (written after the step, fsynced): the multiset that went into optimizer steps;
- jobs:done / jobs:failed against the enqueued job ids.
Every enqueued job is done or failed for good (never both); every sample id that reached the
stream went into exactly one optimizer step; each done job has its episode's samples in the
stream. Copies in the stream (a job re-run after its actor was SIGKILLed) carry the same ids and
count once.

Final weights: a churned run and an uninterrupted one differ in which episodes finish first, and
so in which share an optimizer step, so they are not comparable as such. What is compared: a
second learner (same seed, no actors) fed the very samples each step of the churned run trained
on, in that order, ends at the same weights (max abs difference <= 1e-6)."""

from __future__ import annotations

import asyncio
import json
import os
import random
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
import redis as redis_sync
from fixtures_nodes import actor_sets, calc_row, start_actor, write_config

from broker.keys import Keys
from common.procs import terminate
from inference.weights import read_safetensors_dir

pytestmark = [pytest.mark.docker, pytest.mark.chaos, pytest.mark.timeout(1500)]
REPO = Path(__file__).resolve().parents[2]
KEY = "churn-key"
INSTANCES, N_SAMPLES, EPOCHS, BATCH = 4, 2, 2, 4
JOBS = INSTANCES * N_SAMPLES * EPOCHS


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SWARL_")}
    return env | {"OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}


def _swarl(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "swarl.cli", *args], cwd=REPO, env=_env(),
                          capture_output=True, text=True, timeout=120)


def _start(log: Path, *args: str) -> subprocess.Popen[bytes]:
    with open(log, "wb") as f:
        return subprocess.Popen([sys.executable, "-m", "swarl.cli", *args], cwd=REPO, env=_env(),
                                stdout=f, stderr=subprocess.STDOUT, start_new_session=True)


async def test_actor_churn_every_job_ends_exactly_once(
        redis_url, envd_factory, pool_factory, cpu_server_factory, tiny_model_dir, test_image,
        tmp_path) -> None:
    from broker.wire import decode

    rng = random.Random(17)
    node = envd_factory()
    pool = pool_factory([node.url], redis_url, sets=["pool.lease_ttl_s=20", "pool.reap_interval_s=1"])
    cpu_server_factory.start(tiny_model_dir, redis_url=redis_url, run_id="test", api_key=KEY)
    run_dir = tmp_path / "run"
    sets = actor_sets(
        redis_url, run_dir, pool.url, pool.token, tiny_model_dir, KEY,
        **{"actor.step_limit": 2, "actor.sampling.max_new_tokens": 24, "actor.max_context_len": 2048,
           "actor.shutdown_grace_s": 2, "queue.max_tries": 8, "admission.batch_size": BATCH,
           "admission.max_staleness": 10, "inference.api_key": KEY,
           "learner.model_dir": str(tiny_model_dir), "learner.n_samples_per_prompt": N_SAMPLES,
           "learner.max_steps": JOBS // BATCH, "learner.lr": 1e-3, "learner.threads": 1,
           "learner.entropy_coef": 0.01,   # the weights move even when every reward is equal
           "learner.tensorboard": False, "learner.group_timeout_s": 600,
           "weight_sync.api_key": KEY})
    cfg = write_config(tmp_path / "swarl.yaml", sets)
    keys = Keys("swarl", "test")
    r = redis_sync.Redis.from_url(redis_url)
    r.xgroup_create(keys.replay, "oracle", id="0", mkstream=True)   # keeps every entry
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps(calc_row(test_image, n)) + "\n" for n in range(1, INSTANCES + 1)))
    enq = await asyncio.to_thread(_swarl, "enqueue", "-c", str(cfg), "--data", str(rows), "--n-samples",
                                  str(N_SAMPLES), "--epochs", str(EPOCHS))
    assert enq.returncode == 0, enq.stderr
    job_ids = {keys.job_id(f"swarl-test__calc-{n}", e, i)
               for n in range(1, INSTANCES + 1) for e in range(EPOCHS) for i in range(N_SAMPLES)}
    log = tmp_path / "learner.log"
    learner = _start(log, "learner", "-c", str(cfg))
    actors: list = []
    churn = Counter()
    try:
        deadline = time.monotonic() + 1200
        while learner.poll() is None:
            assert time.monotonic() < deadline, log.read_text()[-4000:]
            alive = [a for a in actors if a.proc.poll() is None]
            if len(alive) < 1 or (len(alive) < 3 and rng.random() < 0.5):
                actors.append(start_actor(cfg, tmp_path / "actors", concurrency=rng.choice([1, 2])))
                churn["started"] += 1
            else:
                victim = rng.choice(alive)
                if rng.random() < 0.5:
                    victim.kill()
                    churn["sigkill"] += 1
                else:
                    await asyncio.to_thread(victim.stop, 30)
                    churn["sigterm"] += 1
            await asyncio.sleep(rng.uniform(3, 7))
        assert learner.returncode == 0, log.read_text()[-4000:]
    finally:
        for a in actors:
            a.stop(60)
        terminate(learner, 60)
    assert churn["sigkill"] >= 1 and churn["sigterm"] >= 1, churn

    # -- the oracle ---------------------------------------------------------------------
    done = {m.decode() for m in r.smembers(keys.jobs_done)}
    failed = {k.decode(): json.loads(v) for k, v in r.hgetall(keys.jobs_failed).items()}
    assert done | set(failed) == job_ids, (job_ids - done - set(failed), churn)
    assert not done & set(failed)
    assert all(doc["reason"] for doc in failed.values())
    entries = r.xrange(keys.replay)
    stream = Counter(decode(f[b"s"]).sample_id for _, f in entries)
    episodes = {decode(f[b"s"]).episode_id for _, f in entries}
    assert episodes == done, (episodes ^ done)            # a done job's samples are in the stream
    trained_lines = [json.loads(x) for x in (run_dir / "learner" / "trained.jsonl").read_text().splitlines()]
    trained = Counter(i for line in trained_lines for i in line["ids"])
    assert [line["step"] for line in trained_lines] == list(range(1, JOBS // BATCH + 1))
    assert max(trained.values()) == 1, [i for i, n in trained.items() if n > 1]  # no id trained twice
    assert set(trained) == set(stream), (set(stream) - set(trained), set(trained) - set(stream))
    # -- the same samples in the same order, uninterrupted -------------------------------
    # A learner of another run, same seed, fed exactly what each step of this one trained on,
    # in that order (first copy of each id): it must end at the same weights.
    first = {}
    for _, f in entries:
        first.setdefault(decode(f[b"s"]).sample_id, f[b"s"])
    replay = Keys("swarl", "replay")
    for line in trained_lines:
        for sid in line["ids"]:
            r.xadd(replay.replay, {b"s": first[sid]})
    run2 = tmp_path / "run-replay"
    cfg2 = write_config(tmp_path / "replay.yaml", [*sets, "run.id=\"replay\"", f"run.dir={json.dumps(str(run2))}"])
    log2 = tmp_path / "learner-replay.log"
    learner2 = _start(log2, "learner", "-c", str(cfg2))
    try:
        assert await asyncio.to_thread(learner2.wait, 600) == 0, log2.read_text()[-4000:]
    finally:
        terminate(learner2, 30)
    assert [json.loads(x)["ids"] for x in (run2 / "learner" / "trained.jsonl").read_text().splitlines()] \
        == [line["ids"] for line in trained_lines]
    last = f"v{JOBS // BATCH:06d}"
    a = read_safetensors_dir(run_dir / "weights" / last)
    b = read_safetensors_dir(run2 / "weights" / last)
    max_diff = max(float((a[k].double() - b[k].double()).abs().max()) for k in a)
    assert set(a) == set(b) and max_diff <= 1e-6, max_diff
    base = read_safetensors_dir(tiny_model_dir)
    moved = max(float((a[k].double() - base[k].double()).abs().max()) for k in a if k in base)
    assert moved > 1e-4, moved                      # else the comparison could not fail
    # what churn cost, for docs/reliability.md
    print(json.dumps({"weights_max_abs_diff_vs_uninterrupted": max_diff, "weights_moved": moved,"churn": dict(churn), "jobs": len(job_ids), "done": len(done), "failed": len(failed),
                      "stream_entries": len(entries), "distinct_samples": len(stream),
                      "duplicate_copies": sum(stream.values()) - len(stream),
                      "retried": int(r.hget(keys.stats, "episodes_infra_retried") or 0)}))
    r.close()
