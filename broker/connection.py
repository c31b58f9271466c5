"""Redis connections from a URL: redis://, rediss://, unix://, or redis+sentinel://.

Every client reconnects and retries a command a bounded number of times with exponential
backoff on connection errors and timeouts (redis-py's Retry), so a Redis restart costs a pause,
not a crash. Replies are bytes (the sample wire format is binary).
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable
from typing import Any, TypeVar
from urllib.parse import parse_qs, urlparse

import redis
import redis.asyncio as aioredis
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import ExponentialBackoff
from redis.exceptions import BusyLoadingError, ConnectionError, TimeoutError
from redis.retry import Retry

from broker.config import RedisConfig

SENTINEL_SCHEMES = ("redis+sentinel", "rediss+sentinel")
T = TypeVar("T")
_RETRY_ON = [ConnectionError, TimeoutError, BusyLoadingError]


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


def _client(url: str, cfg: RedisConfig | None, sync: bool) -> Any:
    cfg = cfg or RedisConfig()
    scheme = _check_scheme(url)
    retry = (Retry if sync else AsyncRetry)(ExponentialBackoff(cap=5.0, base=cfg.retry_backoff_s), cfg.retries)
    kwargs = _common_kwargs(cfg, retry)
    if scheme in SENTINEL_SCHEMES:
        if sync:
            from redis.sentinel import Sentinel
        else:
            from redis.asyncio.sentinel import Sentinel  # type: ignore[assignment]
        hosts, master, db, opts = _sentinel_parts(url)
        kwargs.pop("max_connections")
        sentinel = Sentinel(hosts, socket_timeout=cfg.connect_timeout_s, **opts)
        return sentinel.master_for(master, db=db, **kwargs, **opts)
    return (redis.Redis if sync else aioredis.Redis).from_url(url, **kwargs)


def connect(url: str, cfg: RedisConfig | None = None) -> aioredis.Redis:
    """An asyncio client (connects lazily on first command)."""
    return _client(url, cfg, sync=False)


def connect_sync(url: str, cfg: RedisConfig | None = None) -> redis.Redis:
    return _client(url, cfg, sync=True)


async def reply(value: Awaitable[T] | T) -> T:
    """Await one command of a redis.asyncio client. redis-py types every command as
    `Awaitable[T] | T` (one signature for its sync and async clients); an asyncio client always
    returns the awaitable."""
    assert inspect.isawaitable(value), "not a redis.asyncio reply"
    return await value
