"""A live run for the fault tests: envd (real containers), the pool, two CPU inference servers
on the tiny model, the learner (disk weight sync) and two actors, all real `swarl` processes on
one Redis (a plain AOF server or Sentinel). Faults are injected from outside; every check reads
Redis or the run's own files."""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis as redis_sync
from actor_services import Proc, actor_sets, calc_row, start_actor, write_config

from broker.config import RedisConfig
from broker.connection import connect_sync
from broker.keys import Keys
from common.procs import Child
from inference.local_server import CpuServerHandle, start_cpu_server

REPO = Path(__file__).resolve().parents[2]
KEY = "chaos-test-key"
KEYS = Keys("swarl", "test")


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SWARL_")}
    return env | {"OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}


@dataclass
class LiveRun:
    url: str
    tmp: Path
    model: Path
    envd: Any
    pool: Any
    servers: dict[str, CpuServerHandle] = field(default_factory=dict)
    actors: list[Proc] = field(default_factory=list)
    learner: Child | None = None
    cfg_path: Path | None = None
    down: set[str] = field(default_factory=set)  # processes a test took down on purpose
    seen_at: dict[str, float] = field(default_factory=dict)  # sample id -> when the watcher first saw it
    _watch_stop: threading.Event = field(default_factory=threading.Event)
    _watcher: threading.Thread | None = None

    @property
    def run_dir(self) -> Path:
        return self.tmp / "run"

    def redis(self) -> redis_sync.Redis:
        # the test's own reads ride out the faults like every process's
        return connect_sync(self.url, RedisConfig(outage_s=90, retry_backoff_s=0.1))

    # -- start --------------------------------------------------------------------------
    def start(self, n_rows: int = 4, **extra: object) -> LiveRun:
        for i in range(2):
            self.start_server(f"cpu-{i}")
        sets = actor_sets(
            self.url, self.run_dir, self.pool.url, self.pool.token, self.model, KEY,
            **{"actor.step_limit": 2, "actor.sampling.max_new_tokens": 16, "actor.max_context_len": 2048,
               "actor.pin_wait_s": 60, "admission.batch_size": 4, "admission.max_staleness": 2,
               "inference.api_key": KEY, "learner.model_dir": str(self.model),
               "learner.n_samples_per_prompt": 2, "learner.lr": 1e-3, "learner.threads": 1,
               "learner.tensorboard": False, "learner.group_timeout_s": 60,
               "weight_sync.api_key": KEY, "weight_sync.keep_versions": 50,
               "weight_sync.drain_timeout_s": 20, "weight_sync.drain_timeout_action": "proceed",
               "weight_sync.lease_s": 4, "weight_sync.retry_failed_s": 5,
               "queue.max_tries": 4, "redis.outage_s": 90, **extra})
        self.cfg_path = write_config(self.tmp / "swarl.yaml", sets)
        rows = self.tmp / "rows.jsonl"
        rows.write_text("".join(json.dumps(calc_row(self.pool_image, n)) + "\n"
                                for n in range(1, n_rows + 1)))
        enq = Child.spawn([sys.executable, "-m", "swarl.cli", "enqueue", "-c", str(self.cfg_path),
                           "--data", str(rows), "--n-samples", "2", "--epochs", "40"],
                          self.tmp / "enqueue.log", env=_env(), cwd=REPO)
        assert enq.proc.wait(180) == 0, enq.log()
        self.start_learner(resume=False)
        self.actors = [start_actor(self.cfg_path, self.tmp / "actors", concurrency=2) for _ in range(2)]
        self._watcher = threading.Thread(target=self._watch, daemon=True)
        self._watcher.start()
        return self

    pool_image: str = ""

    def start_server(self, server_id: str) -> CpuServerHandle:
        (self.tmp / "servers").mkdir(parents=True, exist_ok=True)
        h = start_cpu_server(self.model, redis_url=self.url, run_id="test", api_key=KEY,
                             server_id=server_id, log_dir=self.tmp / "servers",
                             extra_args=["--set", "inference.heartbeat_s=1", "--set", "redis.outage_s=90"])
        self.servers[server_id] = h
        self.down.discard(server_id)
        return h

    def start_learner(self, resume: bool) -> None:
        assert self.cfg_path is not None
        args = [sys.executable, "-m", "swarl.cli", "learner", "-c", str(self.cfg_path)]
        self.learner = Child.spawn(args + (["--resume"] if resume else []), self.tmp / "learner.log",
                                   env=_env(), cwd=REPO)
        self.down.discard("learner")

    def kill_learner(self) -> None:
        assert self.learner is not None
        self.down.add("learner")
        os.killpg(self.learner.proc.pid, signal.SIGKILL)
        self.learner.proc.wait(10)

    def kill_server(self, server_id: str) -> None:
        self.down.add(server_id)
        h = self.servers[server_id]
        os.killpg(h.proc.pid, signal.SIGKILL)
        h.proc.wait(10)

    # -- watch --------------------------------------------------------------------------
    def _watch(self) -> None:
        """Record every sample id that reaches the stream (an independent record of what was
        in Redis before a crash); entries are read by id range, so trimming loses nothing here."""
        last = "0-0"
        r = self.redis()
        from broker.wire import decode

        while not self._watch_stop.is_set():
            try:
                for eid, fields in r.xrange(KEYS.replay, min=f"({last}", count=500):
                    last = eid.decode()
                    try:
                        self.seen_at.setdefault(decode(fields[b"s"]).sample_id, time.time())
                    except Exception:
                        pass
            except redis_sync.RedisError:
                pass
            time.sleep(0.1)
        r.close()

    def check_alive(self) -> None:
        procs: list[tuple[str, Any]] = [("envd", self.envd), ("pool", self.pool), ("learner", self.learner)]
        procs += list(self.servers.items()) + [(f"actor-{i}", a) for i, a in enumerate(self.actors)]
        for name, p in procs:
            if name in self.down or p is None:
                continue
            assert p.proc.poll() is None, f"{name} died ({p.proc.returncode}):\n{p.tail(40)}"

    def wait(self, cond: Callable[[], Any], within_s: float, what: str) -> Any:
        deadline = time.monotonic() + within_s
        while True:
            self.check_alive()
            v = cond()
            if v:
                return v
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            time.sleep(0.5)

    # -- reads --------------------------------------------------------------------------
    def version(self) -> int:
        r = self.redis()
        try:
            return int(r.get(KEYS.policy_current) or 0)
        finally:
            r.close()

    def stats(self) -> dict[str, float]:
        r = self.redis()
        try:
            return {k.decode(): float(v) for k, v in r.hgetall(KEYS.stats).items()}
        finally:
            r.close()

    def server_hash(self, server_id: str) -> dict[str, str]:
        r = self.redis()
        try:
            return {k.decode(): v.decode() for k, v in r.hgetall(KEYS.server(server_id)).items()}
        finally:
            r.close()

    def trained(self) -> list[str]:
        p = self.run_dir / "learner" / "trained.jsonl"
        if not p.exists():
            return []
        return [i for line in p.read_text().splitlines() for i in json.loads(line)["ids"]]

    def stream_ids(self) -> set[str]:
        from broker.wire import decode

        r = self.redis()
        try:
            return {decode(f[b"s"]).sample_id for _, f in r.xrange(KEYS.replay)}
        finally:
            r.close()

    def stop(self) -> None:
        self._watch_stop.set()
        for a in self.actors:
            a.stop(60)
        if self.learner is not None:
            self.learner.stop(60)
        for h in self.servers.values():
            h.stop()
