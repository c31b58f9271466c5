"""The learner on several ranks (torchrun, gloo on CPU): the same samples give the same model on
2 ranks as on 1, and `swarl learner --nproc-per-node 2` on a real replay stream has one
consumer, trains every sample once, stops all ranks on a signal to any of them, ends the job
when a rank dies, and resumes exactly."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import redis as redis_sync
import torch
import yaml
from learner_helpers import make_sample

from broker.keys import Keys
from broker.replay import ReplayWriter
from common.procs import terminate
from swarl.config import load_config

REPO = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}


def _equivalence(model_dir: Path, out: Path, nproc: int, *sets: str) -> dict:
    args = ["-m", "learner.equivalence", "--model", str(model_dir), "--out", str(out),
            *(a for s in sets for a in ("--set", s))]
    cmd = [sys.executable, *args] if nproc == 1 else [
        sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}", *args]
    res = subprocess.run(cmd, cwd=REPO, env=ENV, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    return torch.load(out, weights_only=False)


# `make test`: one update a step, and two with the trust region; `make long` adds four without it
# and the trust region on each update's own minibatch
@pytest.mark.parametrize("sets", [(), pytest.param(("learner.minibatches=2", "learner.epochs=2"), marks=pytest.mark.long),
                                  ("learner.minibatches=2", "learner.max_update_kl=0.001"),
                                  pytest.param(("learner.minibatches=2", "learner.max_update_kl=0.001",
                                                "learner.max_update_kl_scope=minibatch"), marks=pytest.mark.long)],
                         ids=["one_update", "four_updates", "trust_region", "trust_region_minibatch"])
def test_torch_data_parallel_two_ranks_equals_one(small_model_dir, tmp_path, sets: tuple[str, ...]) -> None:
    """Also with several optimizer updates a step: each minibatch is sharded on its own, every
    rank takes part in every update, the proximal pass runs on every rank; and with the trust
    region, whose KL is summed over the ranks so that every rank scales its update alike."""
    one = _equivalence(small_model_dir, tmp_path / "one.pt", 1, *sets)
    two = _equivalence(small_model_dir, tmp_path / "two.pt", 2, *sets)
    if "learner.epochs=2" in sets:
        assert all(st["updates"] == 4 for st in one["stats"] + two["stats"])
    if "learner.max_update_kl=0.001" in sets:  # it acted, and alike on one rank and two
        assert all(st["update_backtracked"] >= 1 and st["update_alpha_min"] < 1 for st in one["stats"])
        for k in ("update_backtracked", "update_alpha_min"):
            assert [st[k] for st in one["stats"]] == [st[k] for st in two["stats"]], k
    assert (one["dp_size"], two["dp_size"]) == (1, 2)
    for a, b in zip(one["logprobs"], two["logprobs"], strict=True):
        assert float((a - b).abs().max()) <= 1e-4
    assert one["params"].keys() == two["params"].keys()
    moved = max(float((one["params"][k] - two["params"][k]).abs().max()) for k in one["params"])
    assert moved <= 1e-4
    # the reduced gradient is the sum over ranks, not their mean (Adam alone would hide a 2x)
    for a, b in zip(one["stats"], two["stats"], strict=True):
        assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=1e-4)
        # the step's update KL: each rank's share (the trust region's last measure, already
        # summed over ranks, counted once) adds up to the one rank's
        assert b["update_kl_ranks"] == pytest.approx(a["update_kl_ranks"], rel=1e-3) and a["update_kl_ranks"] > 0
    # the runs really trained: the first step's logprobs differ from the third's
    assert float((one["logprobs"][0] - one["logprobs"][-1]).abs().max()) > 1e-4


# -- the learner process on two ranks --------------------------------------------------------


def _write_config(path: Path, redis_url: str, run_dir: Path, model_dir: Path, **learner) -> Path:
    cfg = load_config(None, [f"redis.url={redis_url}", "run.id=test", f"run.dir={run_dir}",
                             "admission.max_staleness=10", "admission.batch_size=4",
                             "replay.block_ms=100"], environ={})
    cfg.learner.model_dir = str(model_dir)
    for k, v in {"n_samples_per_prompt": 2, "update_every": 1, "lr": 1e-3, "heartbeat_s": 0.2,
                 "publish": "none", "threads": 1, "max_tokens_per_microbatch": 64, "tensorboard": False,
                 **learner}.items():
        setattr(cfg.learner, k, v)
    path.write_text(yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False))
    return path


def _learner(cfg_path: Path, log: Path, *extra: str) -> subprocess.Popen[bytes]:
    with open(log, "ab") as f:
        return subprocess.Popen([sys.executable, "-m", "swarl.cli", "learner", "-c", str(cfg_path),
                                 "--nproc-per-node", "2", *extra], cwd=REPO, env=ENV, stdout=f,
                                stderr=subprocess.STDOUT, start_new_session=True)


async def _feed(redis_url: str, rounds: range) -> list[str]:
    from broker.connection import connect

    r = connect(redis_url)
    try:
        samples = [make_sample(f"r{v}g{g}", i, reward=float(i), version=0, length=20 + 3 * i + g)
                   for v in rounds for g in range(2) for i in range(2)]
        await ReplayWriter(r, Keys("swarl", "test")).add(samples)
        return [s.sample_id for s in samples]
    finally:
        await r.aclose()


def _trained(run_dir: Path) -> list[str]:
    p = run_dir / "learner" / "trained.jsonl"
    return [i for line in p.read_text().splitlines() if line.strip() for i in json.loads(line)["ids"]] \
        if p.exists() else []


def _wait(pred, timeout: float, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if proc.poll() is not None:
            raise AssertionError(f"learner exited with {proc.returncode}:\n{log.read_text()[-4000:]}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out:\n{log.read_text()[-4000:]}")
        time.sleep(0.2)


class Run:
    """A two-rank `swarl learner` on a run directory of its own."""

    def __init__(self, redis_url: str, model_dir: Path, tmp: Path) -> None:
        self.redis_url, self.run_dir, self.log = redis_url, tmp / "run", tmp / "learner.log"
        self.cfg = _write_config(tmp / "c.yaml", redis_url, self.run_dir, model_dir)
        self.proc = _learner(self.cfg, self.log)

    async def train(self, rounds: range, expect: int) -> list[str]:
        """Feed `rounds` of samples; wait until `expect` sample ids are trained in all."""
        ids = await _feed(self.redis_url, rounds)
        _wait(lambda: len(_trained(self.run_dir)) == expect, 300, self.proc, self.log)
        return ids


def _worker_pids(parent: int) -> list[int]:
    """The learner ranks: the children of the torchrun agent that `swarl learner` started."""
    (agent,) = psutil.Process(parent).children()
    return sorted(p.pid for p in agent.children())


async def test_two_ranks_train_every_sample_once_and_stop_together(redis_url, small_model_dir, tmp_path) -> None:
    run = Run(redis_url, small_model_dir, tmp_path)
    proc, log = run.proc, run.log
    try:
        ids = await run.train(range(3), expect=12)
        trained = _trained(run.run_dir)
        assert sorted(trained) == sorted(ids) and len(set(trained)) == len(trained)
        r = redis_sync.Redis.from_url(redis_url)
        consumers = r.xinfo_consumers(Keys("swarl", "test").replay, "learner")
        assert [c["name"] for c in consumers] == [b"learner-0"]  # rank 0 alone reads
        ranks = _worker_pids(proc.pid)
        assert len(ranks) == 2, ranks
        os.kill(ranks[1], signal.SIGTERM)  # a signal to rank 1 stops both, cleanly
        assert proc.wait(120) == 0, log.read_text()[-4000:]
        assert r.hget(Keys("swarl", "test").learner_state, "status") == b"stopped"
        assert (r.xpending(Keys("swarl", "test").replay, "learner"))["pending"] == 0
    finally:
        terminate(proc, 30, group=True)


async def test_a_dead_rank_ends_the_job_and_resume_continues(redis_url, small_model_dir, tmp_path) -> None:
    run = Run(redis_url, small_model_dir, tmp_path)
    proc, log, run_dir = run.proc, run.log, run.run_dir
    try:
        first = await run.train(range(2), expect=8)
        ranks = _worker_pids(proc.pid)
        os.kill(ranks[1], signal.SIGKILL)
        code = proc.wait(180)
        assert code != 0
        text = log.read_text()
        assert "exited with" in text and "--resume" in text, text[-3000:]
    finally:
        terminate(proc, 30, group=True)
    second = await _feed(redis_url, range(2, 4))
    proc = _learner(run.cfg, log, "--resume")
    try:
        _wait(lambda: len(_trained(run_dir)) == len(first) + len(second), 300, proc, log)
        trained = _trained(run_dir)
        assert sorted(trained) == sorted(first + second) and len(set(trained)) == len(trained)
        assert terminate(proc, 120) == 0, log.read_text()[-4000:]  # SIGTERM: every rank stops cleanly
    finally:
        terminate(proc, 30, group=True)
