"""Redis connections from a URL: redis://, rediss://, unix://, or redis+sentinel://.

Every client rides out a Redis outage (a restart, a Sentinel failover, a network blip): a
command that meets a connection error, a timeout or a loading Redis reconnects and is retried
with capped exponential backoff and one log line per attempt until `redis.outage_s` have passed
since its first failure; only then does the error reach the caller (and, in a process, end it
for its supervisor to restart). One policy, in one place, for every process and for arq's
worker, which gets its connection from here too (`arq_redis`). Replies are bytes (the sample
wire format is binary).
"""

from __future__ import annotations

import asyncio
import builtins
import inspect
import ssl
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar
from urllib.parse import parse_qs, urlparse

import redis
import redis.asyncio as aioredis
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import ExponentialBackoff
from redis.exceptions import (
    AuthenticationError,
    AuthorizationError,
    BusyLoadingError,
    ConnectionError,
    MaxConnectionsError,
    TimeoutError,
)
from redis.retry import Retry

from broker.config import RedisConfig
from common.logs import get_logger

log = get_logger("broker.redis")
SENTINEL_SCHEMES = ("redis+sentinel", "rediss+sentinel")
T = TypeVar("T")
_RETRY_ON = [ConnectionError, TimeoutError, BusyLoadingError]
# A connect's socket errors too: redis-py opens a pool's first connection outside the command's
# retry, so without them a fresh client would fail at once while Redis is down. Not for
# Sentinel-managed connections: their connect() retries on ConnectionError around a lookup of
# the primary, and retrying the socket error inside would keep dialling the dead primary.
_RETRY_ALSO_ON = (OSError, builtins.TimeoutError)


def _permanent(error: BaseException) -> bool:
    """Errors that waiting does not cure (a wrong password, a refused certificate, a full
    connection pool): they go to the caller at once."""
    if isinstance(error, AuthenticationError | AuthorizationError | MaxConnectionsError | ssl.SSLError):
        return True
    return isinstance(error.__context__, ssl.SSLError)  # redis-py re-raises an SSLError as ConnectionError


class _Outage:
    """The outage policy shared by the sync and asyncio retries: how long to wait before the
    next attempt, or None once the budget is spent (then the error goes to the caller)."""

    def __init__(self, cfg: RedisConfig) -> None:
        self.backoff = ExponentialBackoff(cap=cfg.retry_backoff_max_s, base=cfg.retry_backoff_s)
        self.budget_s = cfg.outage_s

    def next_delay(self, started: float, failures: int, error: Exception) -> float | None:
        if _permanent(error):
            return None
        elapsed = time.monotonic() - started
        if elapsed >= self.budget_s:
            log.error("redis_outage_budget_exceeded", attempts=failures, elapsed_s=round(elapsed, 1),
                      outage_s=self.budget_s, error=f"{type(error).__name__}: {error}")
            return None
        delay = min(self.backoff.compute(failures), self.budget_s - elapsed)
        log.warning("redis_unreachable_retrying", attempt=failures, elapsed_s=round(elapsed, 1),
                    outage_s=self.budget_s, next_in_s=round(delay, 2),
                    error=f"{type(error).__name__}: {error}")
        return delay


def _errors(sentinel: bool) -> tuple[type[Exception], ...]:
    return tuple(_RETRY_ON) if sentinel else (*_RETRY_ON, *_RETRY_ALSO_ON)


class OutageRetry(Retry):
    """redis-py's Retry with a time budget (redis.outage_s) instead of a count of attempts."""

    __slots__ = ("_outage",)

    def __init__(self, cfg: RedisConfig, sentinel: bool = False) -> None:
        super().__init__(ExponentialBackoff(), -1, _errors(sentinel))
        self._outage = _Outage(cfg)

    def call_with_retry(self, do: Callable[[], T], fail: Callable[[Exception], Any]) -> T:
        started, failures = time.monotonic(), 0
        while True:
            try:
                return do()
            except self._supported_errors as error:
                failures += 1
                fail(error)  # drops the connection (or raises, e.g. WatchError inside a MULTI)
                delay = self._outage.next_delay(started, failures, error)
                if delay is None:
                    raise
                time.sleep(delay)


class AsyncOutageRetry(AsyncRetry):
    """The asyncio twin of OutageRetry."""

    __slots__ = ("_outage",)

    def __init__(self, cfg: RedisConfig, sentinel: bool = False) -> None:
        super().__init__(ExponentialBackoff(), -1, _errors(sentinel))  # type: ignore[arg-type]
        self._outage = _Outage(cfg)

    async def call_with_retry(self, do: Callable[[], Awaitable[T]], fail: Callable[[Any], Any]) -> T:
        started, failures = time.monotonic(), 0
        while True:
            try:
                return await do()
            except self._supported_errors as error:
                failures += 1
                await fail(error)
                delay = self._outage.next_delay(started, failures, error)
                if delay is None:
                    raise
                await asyncio.sleep(delay)


_RETRYING: dict[type, type] = {}


def _retrying_connect(base: type) -> type:
    """`base` (a redis-py connection class) whose whole connect() runs under the connection's
    retry: redis-py retries only opening the socket, so an error in the handshake after it
    (AUTH, HELLO, SELECT, CLIENT SETINFO: a server that died or restarted just after accepting)
    would reach the caller at once from the pool, outside every command's retry. The outer
    budget starts first, so a connect gives up within about outage_s (at most twice that when
    the socket part alone used up its own budget just as the handshake failed).

    A connection being opened also skips redis-py's health-check PING before the handshake's
    first command: that PING runs under the retry, which reconnects through connect() again,
    so a server that accepts and drops connections would nest one connect per drop until the
    recursion limit; a new connection's handshake already proves it alive."""
    if base in _RETRYING:
        return _RETRYING[base]
    if inspect.iscoroutinefunction(getattr(base, "connect", None)):

        class AsyncConn(base):
            async def connect(self) -> None:
                parent = super().connect

                async def attempt() -> None:
                    if not self.is_connected:
                        self.next_health_check = (asyncio.get_running_loop().time()
                                                  + self.health_check_interval)
                    await parent()

                await self.retry.call_with_retry(attempt, lambda _e: self.disconnect())

        cls: type = AsyncConn
    else:

        class SyncConn(base):
            def connect(self) -> None:
                parent = super().connect

                def attempt() -> None:
                    if self._sock is None:
                        self.next_health_check = time.time() + self.health_check_interval
                    parent()

                self.retry.call_with_retry(attempt, lambda _e: self.disconnect())

        cls = SyncConn
    cls.__name__ = cls.__qualname__ = f"Retrying{base.__name__}"
    _RETRYING[base] = cls
    return cls


def _common_kwargs(cfg: RedisConfig, retry: Any) -> dict[str, Any]:
    return {
        "socket_timeout": cfg.socket_timeout_s,
        "socket_connect_timeout": cfg.connect_timeout_s,
        "retry": retry,
        "retry_on_error": _RETRY_ON,
        "health_check_interval": 30,
        "max_connections": cfg.max_connections,
    }


def _sentinel_parts(url: str) -> tuple[list[tuple[str, int]], str, int, dict[str, Any]]:
    """redis+sentinel://[:password@]h1:26379,h2:26379/<master>[/<db>] → hosts, master, db, opts."""
    u = urlparse(url)
    netloc = u.netloc.rsplit("@", 1)[-1]
    hosts = []
    for part in netloc.split(","):
        host, _, port = part.partition(":")
        hosts.append((host, int(port or 26379)))
    path = [p for p in u.path.split("/") if p]
    if not path:
        raise ValueError(f"redis URL {url!r}: sentinel URLs need the master name: .../<master>[/<db>]")
    db = int(path[1]) if len(path) > 1 else 0
    opts: dict[str, Any] = {}
    if u.password:
        opts["password"] = u.password
    if u.scheme.startswith("rediss"):
        opts["ssl"] = True
    for k, v in parse_qs(u.query).items():
        opts[k] = v[0]
    return hosts, path[0], db, opts


def _check_scheme(url: str) -> str:
    scheme = urlparse(url).scheme
    if scheme not in ("redis", "rediss", "unix", *SENTINEL_SCHEMES):
        raise ValueError(f"redis URL {url!r}: scheme must be redis, rediss, unix or redis+sentinel")
    return scheme


def _client(url: str, cfg: RedisConfig | None, sync: bool, redis_class: type | None = None) -> Any:
    cfg = cfg or RedisConfig()
    scheme = _check_scheme(url)
    use_sentinel = scheme in SENTINEL_SCHEMES
    retry = OutageRetry(cfg, use_sentinel) if sync else AsyncOutageRetry(cfg, use_sentinel)
    kwargs = _common_kwargs(cfg, retry)
    if use_sentinel:
        if sync:
            from redis.sentinel import Sentinel
        else:
            from redis.asyncio.sentinel import Sentinel  # type: ignore[assignment]
        hosts, master, db, opts = _sentinel_parts(url)
        kwargs.pop("max_connections")
        # master_for's connections ask the Sentinels for the primary on every (re)connect, so
        # the outage retry follows a failover
        sentinel = Sentinel(hosts, socket_timeout=cfg.connect_timeout_s, **opts)
        if redis_class is not None:
            kwargs["redis_class"] = redis_class
        return sentinel.master_for(master, db=db, **kwargs, **opts)
    cls: Any = redis_class or (redis.Redis if sync else aioredis.Redis)
    client = cls.from_url(url, **kwargs)
    # (Sentinel-managed connections need no wrapper: their connect() retries the lookup, the
    # socket and the handshake together.)
    pool = client.connection_pool
    pool.connection_class = _retrying_connect(pool.connection_class)
    return client


def connect(url: str, cfg: RedisConfig | None = None) -> aioredis.Redis:
    """An asyncio client (connects lazily on first command)."""
    return _client(url, cfg, sync=False)


def connect_sync(url: str, cfg: RedisConfig | None = None) -> redis.Redis:
    return _client(url, cfg, sync=True)


def connect_as(redis_class: type[T], url: str, cfg: RedisConfig | None = None) -> T:
    """An asyncio client of a redis.asyncio.Redis subclass (arq's ArqRedis) with the same
    outage policy and Sentinel handling as `connect`."""
    return _client(url, cfg, sync=False, redis_class=redis_class)


async def reply(value: Awaitable[T] | T) -> T:
    """Await one command of a redis.asyncio client. redis-py types every command as
    `Awaitable[T] | T` (one signature for its sync and async clients); an asyncio client always
    returns the awaitable."""
    assert inspect.isawaitable(value), "not a redis.asyncio reply"
    return await value
