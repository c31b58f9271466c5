"""Rank 0's teardown of a group given up on, and the bound on NCCL's lazy set-up, on CPU.

torch 2.11's non-blocking NCCL set-up polls while holding the communicator's lock, and abort()
needs that lock: it waits until the set-up gives up (TORCH_NCCL_NONBLOCKING_TIMEOUT). A stand-in
group reproduces that (its abort() blocks on a lock rank 0's thread holds), so these tests check
what UpdateGroup does with it: the event loop never waits for the abort, the abort and the
destroy run after rank 0's thread is done, and `running` counts them until they have. Real
NCCL runs in gpu_check's weight_sync_nccl (CUDA)."""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from typing import Any

import pytest
from polling import wait_for

from weight_sync import update_group
from weight_sync.update_group import NONBLOCKING_TIMEOUT_ENV, UpdateGroup, nccl_setup_bound


def test_the_setup_bound_is_the_group_bound_unless_the_user_set_one(monkeypatch):
    monkeypatch.delenv(NONBLOCKING_TIMEOUT_ENV, raising=False)
    assert nccl_setup_bound(2.5) == 3  # whole seconds, rounded up
    assert update_group.os.environ[NONBLOCKING_TIMEOUT_ENV] == "3"
    assert nccl_setup_bound(60) == 3  # set once: torch reads it once per process
    monkeypatch.setenv(NONBLOCKING_TIMEOUT_ENV, "120")
    assert nccl_setup_bound(60) == 120  # the user's, kept (and logged: above the bound)
    monkeypatch.setenv(NONBLOCKING_TIMEOUT_ENV, "soon")
    assert nccl_setup_bound(60) == 60
    monkeypatch.delenv(NONBLOCKING_TIMEOUT_ENV)
    assert nccl_setup_bound(0.2) == 1  # never 0


def test_an_nccl_group_sets_the_bound_when_made_and_gloo_does_not(monkeypatch):
    monkeypatch.delenv(NONBLOCKING_TIMEOUT_ENV, raising=False)
    UpdateGroup(name="g", members=[], clients=[], tp_sizes=[], backend="gloo", timeout_s=7)
    assert NONBLOCKING_TIMEOUT_ENV not in update_group.os.environ
    UpdateGroup(name="g", members=[], clients=[], tp_sizes=[], backend="nccl", timeout_s=7)
    assert update_group.os.environ[NONBLOCKING_TIMEOUT_ENV] == "7"


class SetupLockedGroup:
    """A ProcessGroup whose lazy set-up holds a lock, as torch's waitReady holds the
    communicator's, until its own timeout; abort() takes the same lock."""

    def __init__(self, setup_s: float) -> None:
        self.lock = threading.Lock()
        self.setup_s = setup_s
        self.events: list[tuple[str, float]] = []

    def setup(self) -> None:
        with self.lock:
            self.events.append(("setup_start", time.monotonic()))
            time.sleep(self.setup_s)
            self.events.append(("setup_timeout", time.monotonic()))
        raise RuntimeError("NCCL timeout in communicator initialization")

    def abort(self) -> None:
        self.events.append(("abort_called", time.monotonic()))
        with self.lock:
            self.events.append(("aborted", time.monotonic()))


class NeverAnswers:
    async def update_weights_from_distributed(self, **_kw: Any) -> dict:
        await asyncio.sleep(3600)
        return {}


async def test_a_set_up_abort_cannot_end_is_torn_down_after_it_and_never_on_the_loop(monkeypatch):
    monkeypatch.delenv(NONBLOCKING_TIMEOUT_ENV, raising=False)
    destroyed: list[tuple[Any, float]] = []
    monkeypatch.setattr(update_group, "destroy_process_group", lambda pg: destroyed.append((pg, time.monotonic())))
    pg = SetupLockedGroup(setup_s=1.5)
    g = UpdateGroup(name="absent-peer", members=["s"], clients=[NeverAnswers()], tp_sizes=[1],  # type: ignore[list-item]
                    backend="nccl", timeout_s=0.5)
    g.pg = pg
    ticks: list[float] = []

    async def ticker() -> None:  # the event loop's other work (the coordinator's, a server's answers)
        while True:
            ticks.append(time.monotonic())
            await asyncio.sleep(0.02)

    tick = asyncio.ensure_future(ticker())
    t0 = time.monotonic()
    with pytest.raises(TimeoutError, match="no answer from servers"):
        await g._together(g._thread(pg.setup), [asyncio.ensure_future(g.clients[0].update_weights_from_distributed())],
                          "update_weights_from_distributed")
    assert time.monotonic() - t0 < 0.8  # the bound (0.5 s), not the set-up's own timeout
    assert g.broken and g.pg is None and g.running >= 1  # rank 0's thread, then the teardown
    await wait_for(lambda: g.running == 0, 5, "the teardown after rank 0's thread")
    tick.cancel()
    ev = dict(pg.events)
    assert ev["abort_called"] >= ev["setup_timeout"]  # called once rank 0's thread was done
    assert destroyed and destroyed[0][0] is pg and destroyed[0][1] >= ev["aborted"]
    gaps = [b - a for a, b in itertools.pairwise(ticks)]
    assert max(gaps) < 0.3  # the loop never sat in the abort or the destroy


async def test_a_join_given_up_on_is_destroyed_once_it_is_made(monkeypatch):
    destroyed: list[Any] = []
    monkeypatch.setattr(update_group, "destroy_process_group", destroyed.append)
    made = object()

    def slow_join() -> object:
        time.sleep(0.3)
        return made

    g = UpdateGroup(name="late-join", members=["s"], clients=[NeverAnswers()], tp_sizes=[1],  # type: ignore[list-item]
                    backend="gloo", timeout_s=0.1)
    with pytest.raises(TimeoutError):
        await g._together(g._thread(slow_join), [asyncio.ensure_future(g.clients[0].update_weights_from_distributed())],
                          "init_weights_update_group")
    assert g.running
    await wait_for(lambda: g.running == 0, 5, "the join, then its teardown")
    assert destroyed == [made]


async def test_close_waits_for_a_collective_then_destroys_within_the_bound(monkeypatch):
    destroyed: list[Any] = []
    monkeypatch.setattr(update_group, "destroy_process_group", destroyed.append)
    g = UpdateGroup(name="busy", members=[], clients=[], tp_sizes=[], backend="gloo", timeout_s=2)
    g.pg = pg = object()
    busy = g._thread(time.sleep, 0.3)
    assert await g.close()
    assert busy.done() and destroyed == [pg] and g.pg is None and g.running == 0
