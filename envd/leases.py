"""envd's container leases: container_id -> expiry (unix s), renewed by use or heartbeat.

In memory, or in Redis (Keys.envd_leases(node_id), a sorted set) so a restarted envd knows
which of its labelled containers are still owned; without Redis every labelled container of
this node is an orphan at start-up and is destroyed.
"""

from __future__ import annotations

from typing import Protocol

import redis.asyncio as aioredis

from broker.keys import Keys


class LeaseStore(Protocol):
    async def put(self, container_id: str, expiry: float) -> None: ...
    async def renew(self, container_id: str, expiry: float) -> bool: ...
    async def remove(self, container_id: str) -> None: ...
    async def expiry(self, container_id: str) -> float | None: ...
    async def expired(self, now: float) -> list[str]: ...
    async def all(self) -> dict[str, float]: ...
    async def close(self) -> None: ...


class MemoryLeases:
    def __init__(self) -> None:
        self._exp: dict[str, float] = {}

    async def put(self, container_id: str, expiry: float) -> None:
        self._exp[container_id] = expiry

    async def renew(self, container_id: str, expiry: float) -> bool:
        if container_id not in self._exp:
            return False
        self._exp[container_id] = max(self._exp[container_id], expiry)
        return True

    async def remove(self, container_id: str) -> None:
        self._exp.pop(container_id, None)

    async def expiry(self, container_id: str) -> float | None:
        return self._exp.get(container_id)

    async def expired(self, now: float) -> list[str]:
        return [c for c, e in self._exp.items() if e <= now]

    async def all(self) -> dict[str, float]:
        return dict(self._exp)

    async def close(self) -> None:
        pass


class RedisLeases:
    def __init__(self, redis: aioredis.Redis, keys: Keys, node_id: str) -> None:
        self.redis = redis
        self.key = keys.envd_leases(node_id)

    async def put(self, container_id: str, expiry: float) -> None:
        await self.redis.zadd(self.key, {container_id: expiry})

    async def renew(self, container_id: str, expiry: float) -> bool:
        # XX: only an existing lease; GT: never shorten one.
        await self.redis.zadd(self.key, {container_id: expiry}, xx=True, gt=True)
        return await self.redis.zscore(self.key, container_id) is not None

    async def remove(self, container_id: str) -> None:
        await self.redis.zrem(self.key, container_id)

    async def expiry(self, container_id: str) -> float | None:
        score = await self.redis.zscore(self.key, container_id)
        return None if score is None else float(score)

    async def expired(self, now: float) -> list[str]:
        return [_s(m) for m in await self.redis.zrangebyscore(self.key, "-inf", now)]

    async def all(self) -> dict[str, float]:
        return {_s(m): float(s) for m, s in await self.redis.zrange(self.key, 0, -1, withscores=True)}

    async def close(self) -> None:
        await self.redis.aclose()


def _s(v: bytes | str) -> str:
    return v.decode() if isinstance(v, bytes) else v
