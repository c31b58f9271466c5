"""common.files.machine_lock: one holder per machine across processes, and a bounded wait."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
from filelock import Timeout

from common.files import machine_lock

HOLD = """
import sys, time
from common.files import machine_lock
with machine_lock(sys.argv[1]):
    print("held", flush=True)
    time.sleep(float(sys.argv[2]))
"""


def _holder(name: str, seconds: float) -> subprocess.Popen:
    p = subprocess.Popen([sys.executable, "-c", HOLD, name, str(seconds)], stdout=subprocess.PIPE, text=True)
    assert p.stdout is not None and p.stdout.readline().strip() == "held"
    return p


def test_a_second_process_waits_for_the_holder() -> None:
    name = f"test-lock-{time.monotonic_ns()}"
    p = _holder(name, 1.5)
    t0 = time.monotonic()
    with machine_lock(name, timeout_s=30):
        waited = time.monotonic() - t0
    p.wait(timeout=30)
    assert waited > 1.0, f"entered after {waited:.2f}s while another process held the lock"


def test_a_holder_that_does_not_let_go_is_an_error_not_a_hang() -> None:
    name = f"test-lock-{time.monotonic_ns()}"
    p = _holder(name, 30)
    try:
        t0 = time.monotonic()
        with pytest.raises(Timeout), machine_lock(name, timeout_s=0.5):
            pass
        assert time.monotonic() - t0 < 5
    finally:
        p.kill()
        p.wait()
    with machine_lock(name, timeout_s=5):  # the holder's death released it
        pass
