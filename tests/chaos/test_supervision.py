"""common.procs' supervision, as systemd's Restart=on-failure: a SIGKILLed child is restarted
after its backoff, a clean exit is not, and a child that keeps failing ends the group."""

from __future__ import annotations

import signal
import sys
import time

import pytest

from common.procs import ProcessGroup, Restart

SLEEPER = [sys.executable, "-c", "import time; time.sleep(120)"]


def _until(pred, within_s: float = 20.0):
    deadline = time.monotonic() + within_s
    while not pred():
        assert time.monotonic() < deadline, "condition not met"
        time.sleep(0.05)


def test_a_killed_child_restarts_after_its_backoff_and_a_failing_one_ends_the_group(tmp_path):
    with ProcessGroup(tmp_path) as group:
        p = group.start("svc", SLEEPER, restart=Restart(backoff_s=0.5, burst=2, interval_s=60))
        clean = group.start("once", [sys.executable, "-c", "pass"], restart=Restart(backoff_s=0.1))
        first_pid = p.proc.pid
        p.signal(signal.SIGKILL)
        _until(lambda: not p.alive())
        t0 = time.monotonic()
        events = group.supervise(t0)
        assert p.state() == "restarting" and "restarting in 0s" in events[0]
        assert group.supervise(t0 + 0.1) == [] and not p.alive()  # still in its backoff
        events = group.supervise(t0 + 0.6)
        assert p.alive() and p.proc.pid != first_pid and "restart #1" in events[-1]
        _until(lambda: not clean.alive())
        assert clean.proc.returncode == 0 and clean.restarts == []  # exit 0 is not a failure

        # the second failure waits twice as long; a third within the interval gives up
        p.signal(signal.SIGKILL)
        _until(lambda: not p.alive())
        now = time.monotonic()
        assert "restarting in 1s" in group.supervise(now)[0]
        group.supervise(now + 1.1)
        assert p.alive() and len(p.restarts) == 2
        p.signal(signal.SIGKILL)
        _until(lambda: not p.alive())
        with pytest.raises(RuntimeError, match="svc failed 3 times within 60s"):
            group.supervise()


def test_a_child_without_a_policy_or_stopped_on_purpose(tmp_path):
    with ProcessGroup(tmp_path) as group:
        kept = group.start("kept", SLEEPER, restart=Restart(backoff_s=0.1))
        kept.stop(10)
        assert group.supervise(time.monotonic() + 5) == [] and not kept.alive()  # stopped: stays down
        bare = group.start("bare", SLEEPER)
        bare.signal(signal.SIGKILL)
        _until(lambda: not bare.alive())
        with pytest.raises(RuntimeError, match="bare exited with -9"):
            group.supervise()


def test_the_demo_restarts_its_redis_from_the_aof(tmp_path):
    import redis as redis_sync

    from common.services import start_redis
    from swarl.demo.run import Demo, DemoOptions

    demo = Demo(DemoOptions(run_dir=str(tmp_path / "run")))
    demo.redis = start_redis(tmp_path / "redis", appendonly=True)
    try:
        r = redis_sync.Redis(port=demo.redis.port)
        r.set("kept", "1")
        time.sleep(1.2)  # past one appendfsync everysec
        demo.redis.kill()
        demo.supervise()
        assert demo.redis.proc.poll() is None and demo.redis_restarts == 1
        assert "restarted from its AOF" in demo.events[-1]
        _until(lambda: _answers(r))
        assert r.get("kept") == b"1"
        r.close()
        demo.supervise()  # alive: nothing to do
        assert demo.redis_restarts == 1
    finally:
        demo.close()


def _answers(r) -> bool:
    try:
        return bool(r.ping())
    except Exception:
        return False
