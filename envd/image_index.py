"""Which node holds which task image, in Redis, as envd sees it (read by the pool's placement).

Two keys (broker/keys.py): `Keys.image_nodes(image)` (node_id -> `ready` or `pulling:<t>`),
which the pool's reserve script reads, and `Keys.envd_images(node_id)` (image -> last use),
this node's own record: the LRU order for the disk budget and the list of entries to withdraw
when an image leaves. Both change together in one MULTI (one hash slot: the run id is a hash
tag). Without Redis the record is kept in memory and nothing is published.
"""

from __future__ import annotations

import time

import redis.asyncio as aioredis

from broker.connection import reply
from broker.keys import Keys

READY = "ready"
PULLING = "pulling:"


def _s(v: bytes | str) -> str:
    return v.decode() if isinstance(v, bytes) else v


class ImageIndex:
    def __init__(self, redis: aioredis.Redis | None, keys: Keys, node_id: str) -> None:
        self.redis = redis
        self.keys = keys
        self.node_id = node_id
        self.mine = keys.envd_images(node_id)
        self._local: dict[str, float] = {}  # without Redis

    async def arrived(self, image: str, when: float | None = None) -> None:
        """`image` is on this node now (pulled, or found at start-up)."""
        await self.used(image, when)

    async def used(self, image: str, when: float | None = None) -> None:
        """A container was made from `image` (its LRU time moves to now)."""
        when = time.time() if when is None else when
        self._local[image] = when
        if self.redis is None:
            return
        pipe = self.redis.pipeline(transaction=True)
        pipe.hset(self.mine, image, f"{when:.3f}")
        pipe.hset(self.keys.image_nodes(image), self.node_id, READY)
        await pipe.execute()

    async def left(self, image: str) -> None:
        """`image` was removed from this node (evicted)."""
        self._local.pop(image, None)
        if self.redis is None:
            return
        pipe = self.redis.pipeline(transaction=True)
        pipe.hdel(self.mine, image)
        pipe.hdel(self.keys.image_nodes(image), self.node_id)
        await pipe.execute()

    async def pull_failed(self, image: str) -> None:
        """A pull failed: withdraw the pool's `pulling` mark (a `ready` one cannot be there)."""
        if self.redis is None:
            return
        key = self.keys.image_nodes(image)
        mark = await reply(self.redis.hget(key, self.node_id))
        if mark is not None and _s(mark).startswith(PULLING):
            await reply(self.redis.hdel(key, self.node_id))

    async def last_used(self) -> dict[str, float]:
        """image -> last use (unix s) of the images this node manages."""
        if self.redis is None:
            return dict(self._local)
        raw = await reply(self.redis.hgetall(self.mine))
        return {_s(k): float(v) for k, v in raw.items()}

    async def sync(self, present: set[str]) -> None:
        """At start-up: every image tag on the engine is published `ready` (placement may use
        images loaded by hand); managed images gone meanwhile (removed by hand, a wiped engine)
        are withdrawn. Only images envd pulled or ran stay in its own record (evictable)."""
        known = await self.last_used()
        for image in set(known) - present:
            await self.left(image)
        if self.redis is None or not present:
            return
        pipe = self.redis.pipeline(transaction=False)
        for image in sorted(present):
            pipe.hset(self.keys.image_nodes(image), self.node_id, READY)
        await pipe.execute()
