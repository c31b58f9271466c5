"""The coordinator on a thread of its own, with its own event loop and Redis client, inside
the learner process: a training step that holds the learner's loop never stalls a rollout.
The publisher talks to it only through CoordinatorThread's methods, from its own thread."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import redis.asyncio as aioredis

from common.logs import get_logger
from weight_sync.coordinator import Coordinator, UpdateResult
from weight_sync.transports.distributed import Snapshot

log = get_logger("weight_sync")

T = TypeVar("T")


class CoordinatorNotRunning(RuntimeError):
    """The coordinator's thread is not running (never started, stopped, or died)."""


class CoordinatorThread:
    """`make_redis` builds the coordinator's Redis client on the thread's loop (the thread owns
    and closes it); `make` builds the Coordinator around it."""

    def __init__(self, make_redis: Callable[[], aioredis.Redis],
                 make: Callable[[aioredis.Redis], Coordinator]) -> None:
        self._make_redis, self._make = make_redis, make
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._coordinator: Coordinator | None = None
        self._thread = threading.Thread(target=self._main, name="weight-sync-coordinator", daemon=True)

    def start(self, timeout_s: float = 30.0) -> None:
        self._thread.start()
        if not self._ready.wait(timeout_s):
            raise TimeoutError(f"weight-sync coordinator not started after {timeout_s:.0f}s")
        if self._error is not None:
            raise self._error

    def _main(self) -> None:
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        redis = None
        try:
            try:
                redis = self._make_redis()
                coord = self._make(redis)
            except BaseException as e:
                self._error = e
                self._ready.set()
                return
            self._loop, self._coordinator = loop, coord
            self._ready.set()
            loop.run_until_complete(coord.run())
        except BaseException as e:
            log.exception("coordinator_thread_died", error=repr(e))
        finally:
            if redis is not None:
                with contextlib.suppress(Exception):
                    loop.run_until_complete(redis.aclose())
            loop.close()

    # -- commands (from any thread) -------------------------------------------------------
    def _call(self, fn: Callable[[Coordinator], object]) -> None:
        coord, loop = self._coordinator, self._loop
        if coord is None or loop is None:
            raise CoordinatorNotRunning("weight-sync coordinator is not running")
        try:
            loop.call_soon_threadsafe(fn, coord)
        except RuntimeError as e:  # its loop is closed
            raise CoordinatorNotRunning("weight-sync coordinator has stopped") from e

    def offer(self, snap: Snapshot) -> None:
        """Hand over a version's tensors held in memory (distributed transport)."""
        self._call(lambda c: c.offer(snap))

    def trust(self, manifest: dict[str, Any]) -> None:
        """A checkpoint this process has just written and hashed: no re-verification."""
        self._call(lambda c: c.disk.trust(manifest))

    def wake(self) -> None:
        """Look at the registries now (a version was published)."""
        self._call(lambda c: c.wake())

    async def _ask(self, fn: Callable[[Coordinator], Coroutine[Any, Any, T]], timeout_s: float) -> T:
        """Run fn(coordinator) on the coordinator's loop and await its result from this one."""
        coord, loop = self._coordinator, self._loop
        if coord is None or loop is None or loop.is_closed():
            raise CoordinatorNotRunning("weight-sync coordinator is not running")
        coro = fn(coord)
        try:
            fut = asyncio.run_coroutine_threadsafe(coro, loop)
        except RuntimeError as e:  # its loop closed meanwhile
            coro.close()
            raise CoordinatorNotRunning("weight-sync coordinator has stopped") from e
        try:
            return await asyncio.wait_for(asyncio.wrap_future(fut), max(0.0, timeout_s))
        finally:
            fut.cancel()

    async def wait_rolled(self, version: int, timeout_s: float) -> bool:
        """Wait until `version` has been tried on every live server; False at the timeout (or
        when the coordinator is not running)."""
        deadline = time.monotonic() + timeout_s
        with contextlib.suppress(CoordinatorNotRunning, TimeoutError):
            while time.monotonic() < deadline:
                if await self._ask(lambda c: c.rolled(version), deadline - time.monotonic()):
                    return True
                await asyncio.sleep(0.1)
        return False

    async def wait_quiet(self, version: int, timeout_s: float) -> None:
        """Wait (at most timeout_s) until the coordinator is no longer loading `version` into
        servers that could take it at once."""

        async def sending(c: Coordinator) -> bool:
            return c.sending(version)

        deadline = time.monotonic() + timeout_s
        with contextlib.suppress(CoordinatorNotRunning, TimeoutError):
            while time.monotonic() < deadline:
                if not await self._ask(sending, deadline - time.monotonic()):
                    return
                await asyncio.sleep(0.02)

    # -- views (copies, taken under the GIL; no Python code runs while a dict is copied) --
    def metrics(self) -> dict[str, float]:
        return dict(self._coordinator.metrics) if self._coordinator is not None else {}

    def history(self) -> list[UpdateResult]:
        """The latest updates, oldest first (up to 1000)."""
        return list(self._coordinator.history) if self._coordinator is not None else []

    def refusals(self) -> dict[int, str]:
        """Versions refused by a transport, with the reason."""
        if self._coordinator is None:
            return {}
        return {v: reason for (_, v), (_, reason) in dict(self._coordinator.refused).items()}

    def stop(self, timeout_s: float = 30.0) -> None:
        """Stop the coordinator (its updates are cancelled, drained servers given back) and
        wait for the thread."""
        with contextlib.suppress(CoordinatorNotRunning):
            self._call(lambda c: c.stop())
        if self._thread.is_alive():
            self._thread.join(timeout_s)
            if self._thread.is_alive():
                log.warning("coordinator_stop_timeout", timeout_s=timeout_s)
