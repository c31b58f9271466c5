"""Redis killed (SIGKILL) and restarted from its AOF, or its Sentinel primary killed: clients
ride out the outage within redis.outage_s (broker.connection), arq's worker included.

The live run (actors, learner, servers, pool, envd) under the same faults is in
test_live_faults.py (marked chaos); these are the fast checks that stay in `make test`."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis as redis_sync
from redis.exceptions import ConnectionError

from broker.config import RedisConfig
from broker.connection import connect, connect_sync
from broker.keys import Keys
from broker.tasks import arq_pool, enqueue_jobs, jobs_for

HERE = Path(__file__).parent
KEYS = Keys("swarl", "test")
N_JOBS = 16


async def test_a_command_waits_out_a_restart_and_gives_up_after_the_budget(aof_redis, caplog):
    r = connect(aof_redis.url, RedisConfig(outage_s=60, retry_backoff_s=0.05))
    await r.set("before", "1")
    await asyncio.sleep(1.2)  # past one appendfsync everysec
    aof_redis.kill()
    pending = asyncio.create_task(r.incr("during"))
    await asyncio.sleep(2.0)
    assert not pending.done(), "the command gave up during a 2 s outage"
    await asyncio.to_thread(aof_redis.restart)
    assert await asyncio.wait_for(pending, 30) == 1
    assert await r.get("before") == b"1"  # from the AOF
    await r.aclose()

    short = connect(aof_redis.url, RedisConfig(outage_s=1.0, retry_backoff_s=0.05))
    aof_redis.kill()
    t0 = time.monotonic()
    with pytest.raises(ConnectionError):
        await short.ping()
    assert 0.9 < time.monotonic() - t0 < 15
    assert "redis_outage_budget_exceeded" in caplog.text
    await short.aclose()


class HandshakeDropper:
    """A TCP relay to a real redis-server. Each of the first `drops` connections is cut right
    after Redis's first reply reaches the client: Redis dying during a client's handshake
    (redis-py's health-check PING answered, then CLIENT SETINFO meets a closed socket), as when
    it is killed while clients reconnect. Later connections are relayed whole."""

    def __init__(self, target_port: int, drops: int) -> None:
        self.target_port, self.drops, self.dropped = target_port, drops, 0
        self.server: asyncio.Server | None = None

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        return f"redis://127.0.0.1:{self.server.sockets[0].getsockname()[1]}/0"

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        cut = self.dropped < self.drops
        self.dropped += cut
        ur, uw = await asyncio.open_connection("127.0.0.1", self.target_port)

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter, once: bool) -> None:
            try:
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
                    if once:
                        break
            except ConnectionError:
                pass
            finally:
                dst.close()
                (writer if dst is uw else uw).close()

        await asyncio.gather(pipe(reader, uw, False), pipe(ur, writer, cut))

    async def stop(self) -> None:
        assert self.server is not None
        self.server.close()


async def test_a_connection_dropped_during_its_handshake_is_retried(redis_server, caplog):
    cfg = RedisConfig(outage_s=30, retry_backoff_s=0.05)
    relay = HandshakeDropper(redis_server.port, drops=3)
    url = await relay.start()
    try:
        r = connect(url, cfg)  # asyncio client: its first connection is dropped three times
        assert await r.set("k", "v")
        assert relay.dropped == 3
        await r.aclose()
        relay.dropped = 0  # the sync client (CLI commands) the same
        s = connect_sync(url, cfg)
        assert await asyncio.to_thread(s.get, "k") == b"v"
        assert relay.dropped == 3
        s.close()
        assert "redis_unreachable_retrying" in caplog.text
        # a server that drops every handshake is an outage like any other: the budget ends it
        relay.dropped, relay.drops = 0, 10**6
        short = connect(url, RedisConfig(outage_s=1.0, retry_backoff_s=0.05))
        t0 = time.monotonic()
        with pytest.raises(ConnectionError):
            await short.ping()
        assert time.monotonic() - t0 < 15 and relay.dropped > 1
        await short.aclose()
    finally:
        await relay.stop()


def _worker(url: str, log: Path) -> subprocess.Popen[bytes]:
    with open(log, "wb") as f:
        return subprocess.Popen([sys.executable, str(HERE / "chaos_worker.py"), url, "60"],
                                stdout=f, stderr=subprocess.STDOUT, start_new_session=True)


async def _run_jobs_through(url: str, fault, tmp_path: Path) -> tuple[set[str], str]:
    """Enqueue N_JOBS, start a worker, call `fault()` once a few jobs are done, and wait until
    every job is done; returns the job ids that reached `chaos:out` and the worker's log."""
    pool = await arq_pool(url)
    await enqueue_jobs(pool, KEYS, jobs_for(KEYS, {"instance_id": "demo__calc-1"}, "t", N_JOBS))
    log = tmp_path / "worker.log"
    w = _worker(url, log)
    try:
        r = connect(url)
        deadline = time.monotonic() + 120
        while await r.scard(KEYS.jobs_done) < 3:
            assert w.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            await asyncio.sleep(0.1)
        await asyncio.to_thread(fault)
        while await r.scard(KEYS.jobs_done) < N_JOBS:
            assert w.poll() is None, "the worker died:\n" + log.read_text()[-3000:]
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            await asyncio.sleep(0.2)
        out = {f[b"job"].decode() for _, f in await r.xrange("chaos:out")}
        await r.aclose()
    finally:
        if w.poll() is None:
            os.killpg(w.pid, signal.SIGTERM)
            w.wait(30)
        await pool.aclose()
    return out, log.read_text()


async def test_arq_worker_rides_out_a_redis_restart(aof_redis, tmp_path):
    def crash_and_restart() -> None:
        aof_redis.kill()
        time.sleep(3)
        aof_redis.restart()

    out, log = await _run_jobs_through(aof_redis.url, crash_and_restart, tmp_path)
    assert "redis_unreachable_retrying" in log
    # every job ran to the end; an XADD within the last second before the crash may be lost
    # with AOF everysec, then its job (lost from jobs:done too, or not) is the only gap
    assert len(out) >= N_JOBS - 2, sorted(out)


@pytest.mark.chaos
async def test_arq_worker_follows_a_sentinel_failover(sentinel_set, tmp_path):
    def fail_over() -> None:
        old = sentinel_set.kill_primary()
        sentinel_set.wait_failover(old)

    out, log = await _run_jobs_through(sentinel_set.url, fail_over, tmp_path)
    assert "redis_unreachable_retrying" in log
    assert len(out) >= N_JOBS - 2, sorted(out)
    new = redis_sync.Redis(port=sentinel_set.primary_port())
    assert new.info("replication")["role"] == "master"
    new.close()
