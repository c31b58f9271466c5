"""Fault-injection rigs for tests/chaos (owned by resilience; other chaos files add their own
fixtures beside theirs): a Redis that can be SIGKILLed and restarted from its AOF, and a Redis
primary + replica + three Sentinels on loopback whose primary can be killed.

The full live-run tests are marked `chaos` and left out of `make test` (`make chaos` runs
them); the fast ones here run in the normal suite."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import redis as redis_sync

from common.services import RedisProcess, free_port, start_redis, wait_port

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "actors"))  # actor_services


@dataclass
class RestartableRedis:
    """A redis-server with AOF everysec on a fixed port and dir: kill() is SIGKILL (a crash),
    restart() starts it again from its AOF on the same port."""

    dir: Path
    port: int = 0
    srv: RedisProcess | None = None

    def start(self) -> RestartableRedis:
        self.srv = start_redis(self.dir, port=self.port or None, appendonly=True)
        self.port = self.srv.port
        return self

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def kill(self) -> None:
        assert self.srv is not None
        self.srv.kill()

    def restart(self) -> None:
        self.start()
        # wait until the AOF is loaded (a LOADING Redis answers PING with an error)
        r = redis_sync.Redis(port=self.port, socket_timeout=5)
        deadline = time.monotonic() + 30
        while True:
            try:
                r.ping()
                break
            except redis_sync.exceptions.BusyLoadingError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        r.close()

    def stop(self) -> None:
        if self.srv is not None:
            self.srv.stop()


@pytest.fixture
def aof_redis(tmp_path: Path) -> Iterator[RestartableRedis]:
    r = RestartableRedis(tmp_path / "redis-aof").start()
    yield r
    r.stop()


@dataclass
class SentinelSet:
    """A primary, a replica (both AOF everysec) and three Sentinels (quorum 2, down after 1 s)."""

    dir: Path
    master: str = "swarlmaster"
    nodes: list[RedisProcess] = field(default_factory=list)
    sentinels: list[subprocess.Popen[bytes]] = field(default_factory=list)
    sentinel_ports: list[int] = field(default_factory=list)

    @property
    def url(self) -> str:
        hosts = ",".join(f"127.0.0.1:{p}" for p in self.sentinel_ports)
        return f"redis+sentinel://{hosts}/{self.master}/0"

    def start(self) -> SentinelSet:
        primary = start_redis(self.dir / "primary", appendonly=True)
        replica = start_redis(self.dir / "replica", appendonly=True,
                              extra_args=["--replicaof", "127.0.0.1", str(primary.port)])
        self.nodes = [primary, replica]
        exe = shutil.which("redis-server")
        assert exe is not None
        for i in range(3):
            port = free_port()
            d = self.dir / f"sentinel-{i}"
            d.mkdir(parents=True, exist_ok=True)
            (d / "sentinel.conf").write_text(
                f"port {port}\nbind 127.0.0.1\ndir {d}\nlogfile {d / 'sentinel.log'}\n"
                f"sentinel monitor {self.master} 127.0.0.1 {primary.port} 2\n"
                f"sentinel down-after-milliseconds {self.master} 1000\n"
                f"sentinel failover-timeout {self.master} 10000\n"
                f"sentinel parallel-syncs {self.master} 1\n")
            self.sentinels.append(subprocess.Popen([exe, str(d / "sentinel.conf"), "--sentinel"],
                                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                                   start_new_session=True))
            self.sentinel_ports.append(port)
            wait_port("127.0.0.1", port)
        self._wait_replica_synced(replica)
        return self

    def _wait_replica_synced(self, replica: RedisProcess, timeout: float = 30.0) -> None:
        r = redis_sync.Redis(port=replica.port)
        deadline = time.monotonic() + timeout
        while r.info("replication").get("master_link_status") != "up":
            assert time.monotonic() < deadline, "the replica did not sync with the primary"
            time.sleep(0.1)
        r.close()

    def primary_port(self) -> int:
        r = redis_sync.Redis(port=self.sentinel_ports[0])
        try:
            _host, port = r.sentinel_get_master_addr_by_name(self.master)
            return int(port)
        finally:
            r.close()

    def kill_primary(self) -> int:
        """SIGKILL the current primary; returns its port."""
        port = self.primary_port()
        for n in self.nodes:
            if n.port == port:
                n.kill()
        return port

    def wait_failover(self, old_port: int, timeout: float = 60.0) -> int:
        deadline = time.monotonic() + timeout
        while (port := self.primary_port()) == old_port:
            assert time.monotonic() < deadline, "Sentinel did not fail over"
            time.sleep(0.2)
        return port

    def stop(self) -> None:
        for p in self.sentinels:
            if p.poll() is None:
                p.terminate()
                p.wait(10)
        for n in self.nodes:
            n.stop()


@pytest.fixture
def sentinel_set(tmp_path: Path) -> Iterator[SentinelSet]:
    s = SentinelSet(tmp_path / "sentinel").start()
    yield s
    s.stop()
