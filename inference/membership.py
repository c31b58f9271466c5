"""An inference server's entry in the broker's server registry, written once for every kind of
server (swarl's CPU server, a supervised SGLang server, the scripted policy server).

`async with Membership(...):` registers the server on entry (state `ready` when its weights are
at least the newest published policy version, else `starting` for the weight-sync coordinator to
bring up to date), heartbeats its weight version every `heartbeat_s` seconds (and at once when
`wake` is set) while the block runs, and removes the entry on exit. Redis going away never stops
the server: every Redis call is bounded, a failure is logged, and the next beat tries again
(registering first if the server never got in)."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypeVar

from broker.keys import Keys
from broker.registry import PolicyRegistry, ServerMeta, ServerRegistry
from common.logs import get_logger

if TYPE_CHECKING:
    import redis.asyncio as aioredis

    from broker.config import RedisConfig

log = get_logger("inference")
T = TypeVar("T")

REDIS_CALL_TIMEOUT_S = 10.0  # one registry call; a longer stall counts as a failed beat
LEAVE_TIMEOUT_S = 5.0
FAILURES_PER_LOG = 20  # a long outage logs its first failed beat, then one in this many

# The server's weight version as it reports it (a str such as "3"), read fresh at every beat.
VersionSource = Callable[[], str | Awaitable[str]]


def version_int(version: str) -> int | None:
    """swarl's policy versions are ints sent as str(int); anything else has no number."""
    try:
        return int(str(version).strip())
    except ValueError:
        return None


@dataclass
class Membership:
    """Register, heartbeat and leave for one server: an async context manager."""

    redis_url: str
    keys: Keys
    server_id: str
    url: str
    meta: ServerMeta
    version: VersionSource
    heartbeat_s: float = 3.0
    wake: asyncio.Event | None = None  # set it after a weight change: beat now, not at the next tick
    any_version_ready: bool = False  # the scripted server's answers do not depend on weights
    redis_cfg: RedisConfig | None = None
    registered: bool = field(default=False, init=False)
    failures: int = field(default=0, init=False)  # beats failed in a row
    _redis: aioredis.Redis | None = field(default=None, init=False, repr=False)
    _servers: ServerRegistry | None = field(default=None, init=False, repr=False)
    _task: asyncio.Task[None] | None = field(default=None, init=False, repr=False)

    @property
    def servers(self) -> ServerRegistry:
        if self._servers is None:
            raise RuntimeError(f"server {self.server_id}: membership is not running")
        return self._servers

    async def __aenter__(self) -> Membership:
        from broker.connection import connect

        redis = self._redis = connect(self.redis_url, self.redis_cfg)
        self._servers = ServerRegistry(redis, self.keys)
        try:
            await self._beat()  # registered (or the failure logged) before the server takes work
        except BaseException:
            await self._close()
            raise
        self._task = asyncio.create_task(self._heartbeats(), name=f"membership-{self.server_id}")
        return self

    async def __aexit__(self, *exc: object) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self._close()

    async def _close(self) -> None:
        try:
            await self._leave()
        finally:
            redis, self._servers, self._redis = self._redis, None, None
            if redis is not None:
                await redis.aclose()

    async def _heartbeats(self) -> None:
        while True:
            await self._sleep()
            await self._beat()

    async def _beat(self) -> None:
        try:
            await self._beat_once()
        except asyncio.CancelledError:
            raise
        except Exception as e:  # Redis (or the server's version endpoint) away: try next beat
            self.failures += 1
            if self.failures % FAILURES_PER_LOG == 1:
                log.warning("registry_heartbeat_failed", server_id=self.server_id, registered=self.registered,
                            failures=self.failures, error=f"{type(e).__name__}: {e}")
            return
        if self.failures:
            log.info("registry_heartbeat_recovered", server_id=self.server_id, failures=self.failures)
            self.failures = 0

    async def _beat_once(self) -> None:
        version = version_int(await _bounded(self._read_version()))
        if self.registered:
            if await _bounded(self.servers.heartbeat(self.server_id, version=version)):
                return
            # the entry is gone (Redis restarted empty, or it was removed): register again
            log.warning("server_entry_lost", server_id=self.server_id)
            self.registered = False
        current = await _bounded(PolicyRegistry(self.servers.redis, self.keys).current())
        # a judge (role prm) serves its own weights and an eval server the version its eval worker
        # loads: the newest policy version does not apply to either
        ready = self.any_version_ready or self.meta.role != "policy" or (
            version is not None and version >= current)
        state = "ready" if ready else "starting"
        await _bounded(self.servers.register(self.server_id, self.url, version, meta=self.meta, state=state))
        self.registered = True
        log.info("server_registered", server_id=self.server_id, url=self.url, version=version,
                 state=state, policy_current=current, kind=self.meta.kind, tp_size=self.meta.tp_size,
                 role=self.meta.role)

    async def _read_version(self) -> str:
        v = self.version()
        return str(await v) if inspect.isawaitable(v) else str(v)

    async def _sleep(self) -> None:
        if self.wake is None:
            await asyncio.sleep(self.heartbeat_s)
            return
        self.wake.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.wake.wait(), timeout=self.heartbeat_s)

    async def _leave(self) -> None:
        if not self.registered:
            return
        try:
            await asyncio.wait_for(self.servers.remove(self.server_id), LEAVE_TIMEOUT_S)
            self.registered = False
            log.info("server_deregistered", server_id=self.server_id)
        except Exception as e:  # the entry goes stale on its own (SERVER_TTL_S)
            log.warning("server_deregister_failed", server_id=self.server_id, error=f"{type(e).__name__}: {e}")

    async def set_state(self, state: str) -> None:
        """Set this server's registry state (draining before a shutdown); bounded, never raises
        for a Redis failure (logged)."""
        if not self.registered:
            return
        try:
            await _bounded(self.servers.set_state(self.server_id, state))
        except Exception as e:
            log.warning("server_state_failed", server_id=self.server_id, state=state,
                        error=f"{type(e).__name__}: {e}")

    async def pin_count(self) -> int:
        """Episodes pinned to this server now (0 when not registered or Redis is away)."""
        if not self.registered:
            return 0
        try:
            return await _bounded(self.servers.pin_count(self.server_id))
        except Exception as e:
            log.warning("server_pins_failed", server_id=self.server_id, error=f"{type(e).__name__}: {e}")
            return 0


async def _bounded(call: Awaitable[T]) -> T:
    return await asyncio.wait_for(call, REDIS_CALL_TIMEOUT_S)
