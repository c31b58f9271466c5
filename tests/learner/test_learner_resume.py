"""kill -9 a real `swarl learner` mid-run, then --resume: every sample id is trained exactly
once (counted from trained.jsonl, which is cut back to the checkpoint on resume), none is
lost, and nothing stays pending in the consumer group."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
import torch
import yaml
from learner_helpers import make_sample

from broker.connection import connect
from broker.replay import ReplayWriter

SWARL = [sys.executable, "-m", "swarl.cli"]


def start(config: Path, log: Path, resume: bool) -> subprocess.Popen:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env = {k: v for k, v in env.items() if not k.startswith("SWARL_")}
    args = [*SWARL, "learner", "--config", str(config)] + (["--resume"] if resume else [])
    return subprocess.Popen(args, stdout=open(log, "ab"), stderr=subprocess.STDOUT, env=env,
                            start_new_session=True)


def trained_steps(path: Path) -> int:
    if not path.exists():
        return 0
    return sum(1 for line in path.read_text().splitlines() if line.strip())


def wait_steps(proc: subprocess.Popen, path: Path, n: int, log: Path, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while trained_steps(path) < n:
        assert proc.poll() is None, f"learner exited early:\n{log.read_text()[-3000:]}"
        assert time.monotonic() < deadline, f"no step {n} in {timeout}s:\n{log.read_text()[-3000:]}"
        time.sleep(0.02)


async def write(url: str, keys, samples) -> None:
    r = connect(url)
    await ReplayWriter(r, keys).add(samples)
    await r.aclose()


def samples_for(groups: range) -> list:
    out = []
    for g in groups:
        for i in range(2):
            steps = 2 if (g + i) % 3 == 0 else 1  # some dynamic-history episodes
            out += [make_sample(f"g{g}", i, reward=float(i), step_index=k, steps_total=steps,
                                length=24 + 8 * k + g % 5, seed=g * 10 + i * 3 + k)
                    for k in range(steps)]
    return out


def learner_config(tmp_path: Path, redis_url: str, keys, model_dir: Path,
                   weight_sync: dict | None = None, **learner) -> Path:
    """learner.yaml of a small learner run in tmp_path/run; `learner` keys over the common ones."""
    cfg = {
        "run": {"id": keys.run, "dir": str(tmp_path / "run")},
        "redis": {"url": redis_url},
        "replay": {"block_ms": 100, "read_count": 8},
        "admission": {"max_staleness": 1000, "batch_size": 2},
        "learner": {"model_dir": str(model_dir), "n_samples_per_prompt": 2, "idle_exit_s": 3.0,
                    "threads": 1, "tensorboard": False, **learner},
    }
    if weight_sync:
        cfg["weight_sync"] = weight_sync
    path = tmp_path / "learner.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


@pytest.mark.slow
def test_kill_9_and_resume_trains_every_sample_once(redis_url, keys, small_model_dir, tmp_path) -> None:
    run_dir = tmp_path / "run"
    config = learner_config(tmp_path, redis_url, keys, small_model_dir, publish="none", lr=1e-4,
                            update_every=2, checkpoint_every=1)
    trained = run_dir / "learner" / "trained.jsonl"
    log = tmp_path / "learner.log"
    first = samples_for(range(0, 14))
    asyncio.run(write(redis_url, keys, first))

    p1 = start(config, log, resume=False)
    try:
        wait_steps(p1, trained, 3, log)
        os.kill(p1.pid, signal.SIGKILL)  # mid-run: between or inside steps and checkpoints
        p1.wait(10)
    finally:
        if p1.poll() is None:
            p1.kill()
    steps_at_kill = trained_steps(trained)
    assert steps_at_kill < 14

    # the second life resumes while more samples arrive, and runs until the stream is idle
    p2 = start(config, log, resume=True)
    try:
        second = samples_for(range(14, 20))
        asyncio.run(write(redis_url, keys, second))
        assert p2.wait(150) == 0, log.read_text()[-3000:]
    finally:
        if p2.poll() is None:
            p2.kill()

    ids = [i for line in trained.read_text().splitlines() for i in json.loads(line)["ids"]]
    counts = Counter(ids)
    assert not [i for i, c in counts.items() if c > 1], "trained twice"
    assert set(counts) == {s.sample_id for s in first + second}, "lost samples"
    steps = [json.loads(line)["step"] for line in trained.read_text().splitlines()]
    assert steps == list(range(1, 21))  # 20 groups, one group (2 episodes) per step
    r = connect(redis_url)

    async def pending() -> int:
        try:
            return (await r.xpending(keys.replay, "learner"))["pending"]
        finally:
            await r.aclose()

    assert asyncio.run(pending()) == 0
    assert "learner stopped at step 20, version 10" in log.read_text()


@pytest.mark.slow
def test_kill_9_between_checkpoints_after_weights_only_publishes(redis_url, keys, small_model_dir,
                                                                 tmp_path) -> None:
    """Versions are published every step, checkpoints every sixth: a kill -9 after versions
    that no checkpoint records loses those steps, and the resumed learner trains their samples
    (still pending) exactly once, publishes the checkpoint's weights as the version after the
    newest published one (a server holding a lost version is never told it is current), and
    checkpoints its last steps when it stops cleanly."""
    import shutil

    import redis as redis_sync
    from safetensors.torch import load_file

    run_dir = tmp_path / "run"
    config = learner_config(tmp_path, redis_url, keys, small_model_dir, publish="weight_sync", lr=1e-3,
                            update_every=1, checkpoint_every=6,
                            weight_sync={"keep_versions": 100, "stop_rollout_timeout_s": 0})
    trained = run_dir / "learner" / "trained.jsonl"
    log = tmp_path / "learner.log"
    first = samples_for(range(0, 14))
    asyncio.run(write(redis_url, keys, first))
    r = redis_sync.Redis.from_url(redis_url)

    p1 = start(config, log, resume=False)
    try:
        wait_steps(p1, trained, 8, log)
        os.kill(p1.pid, signal.SIGKILL)  # checkpoint at step 6, the next at 12
        p1.wait(10)
    finally:
        if p1.poll() is None:
            p1.kill()
    from learner import checkpoint

    ckpt = checkpoint.latest(run_dir)
    assert ckpt is not None
    saved = json.loads((ckpt / "state.json").read_text())
    current = int(r.get(keys.policy_current))
    assert saved["step"] == 6 and current > saved["version"] == 6  # the case under test
    kept = shutil.copytree(ckpt / "model", tmp_path / "ckpt-model")

    p2 = start(config, log, resume=True)
    try:
        second = samples_for(range(14, 20))
        asyncio.run(write(redis_url, keys, second))
        assert p2.wait(150) == 0, log.read_text()[-3000:]
    finally:
        if p2.poll() is None:
            p2.kill()

    ids = [i for line in trained.read_text().splitlines() for i in json.loads(line)["ids"]]
    counts = Counter(ids)
    assert not [i for i, c in counts.items() if c > 1], "trained twice"
    assert set(counts) == {s.sample_id for s in first + second}, "lost samples"
    assert [json.loads(line)["step"] for line in trained.read_text().splitlines()] == list(range(1, 21))
    assert r.xpending(keys.replay, "learner")["pending"] == 0
    # versions went on from the newest published, the first of them the checkpoint's weights
    resumed = current + 1
    manifest = json.loads(r.hget(keys.policy_manifests, resumed))
    assert manifest["step"] == 6
    republished = load_file(Path(manifest["path"]) / "model.safetensors")
    for name, t in load_file(kept / "model.safetensors").items():
        assert torch.equal(republished[name], t), name
    final = resumed + (20 - 6)
    assert int(r.get(keys.policy_current)) == final
    assert f"learner stopped at step 20, version {final}" in log.read_text()
    # the clean stop checkpointed the steps after 18, the last on the cadence
    last = checkpoint.latest(run_dir)
    assert last is not None and json.loads((last / "state.json").read_text())["step"] == 20
