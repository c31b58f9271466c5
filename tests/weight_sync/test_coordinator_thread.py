"""The coordinator thread's interface when the coordinator is not running: commands are
refused loudly, waits end at once, a start that fails raises its cause. Real Redis, no servers."""

from __future__ import annotations

import time

import pytest

from weight_sync.coordinator_thread import CoordinatorNotRunning, CoordinatorThread


async def test_a_stopped_coordinator_refuses_commands_and_waits_end_at_once(ws_cfg, publisher_factory):
    pub = publisher_factory(ws_cfg)
    thread = pub.coordinator
    assert thread is not None
    thread.wake()
    assert await thread.wait_rolled(0, 10)  # no server registered: nothing to roll out
    assert pub.metrics()["updates_ok"] == 0
    await pub.close()
    with pytest.raises(CoordinatorNotRunning):
        thread.wake()
    with pytest.raises(CoordinatorNotRunning):
        thread.trust({"version": 1, "path": "/nowhere", "bytes": 0})
    t0 = time.monotonic()
    assert not await thread.wait_rolled(1, 30)
    await thread.wait_quiet(1, 30)
    assert time.monotonic() - t0 < 5


def test_a_coordinator_that_cannot_start_raises_the_cause() -> None:
    def no_redis():
        raise ConnectionError("redis at 127.0.0.1:1 refused the connection")

    thread = CoordinatorThread(no_redis, lambda r: pytest.fail("made a coordinator without redis"))
    with pytest.raises(ConnectionError, match="refused the connection"):
        thread.start()
    with pytest.raises(CoordinatorNotRunning):
        thread.wake()
    thread.stop(timeout_s=5)
