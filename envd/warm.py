"""Warm containers: started ahead of the create that will want them (envd.warm_per_image).

A create (a lease's container, or the fresh container an evaluation grades in) costs a Docker
create and start: most of a second on an idle node, seconds on a busy one, and it sits on the
episode's critical path. envd keeps up to `warm_per_image` started containers of every image it
was asked for in the last `warm_idle_s` (at most `warm_max` in all: at that bound the image
wanted least recently gives one up) and hands one out instead of creating. A warm container is
exactly what a create makes (same image, limits, entrypoint; nothing ran in it), only made
earlier, when the node had time; so grading in a "fresh" container keeps its meaning. A take
starts the image's refill, one create at a time per image. Warm containers hold no lease: a
crash leaves them to the next start-up's orphan sweep.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from common.logs import get_logger

log = get_logger("envd.warm")


@dataclass
class WarmContainer:
    id: str
    name: str
    labels: dict[str, str]


class WarmPool:
    def __init__(self, per_image: int, max_total: int, idle_s: float,
                 make: Callable[[str], Awaitable[tuple[str, str, dict[str, str]] | None]],
                 destroy: Callable[[str], Awaitable[Any]]) -> None:
        self.per_image, self.max_total, self.idle_s = per_image, max_total, idle_s
        self._make, self._destroy = make, destroy
        self.ready: dict[str, list[WarmContainer]] = {}
        self._filling: dict[str, asyncio.Task[None]] = {}
        self._wanted: dict[str, float] = {}  # image -> when a create last asked for it
        self._closing = False

    @property
    def enabled(self) -> bool:
        return self.per_image > 0 and self.max_total > 0

    def count(self) -> int:
        return sum(len(v) for v in self.ready.values())

    def take(self, image: str) -> WarmContainer | None:
        """A warm container of `image` (the oldest), or None; either way the image is wanted."""
        got = self.ready.get(image)
        w = got.pop(0) if got else None
        self.want(image)
        return w

    def want(self, image: str) -> None:
        if not self.enabled or self._closing:
            return
        self._wanted[image] = time.monotonic()
        if image not in self._filling:
            self._filling[image] = asyncio.create_task(self._fill(image), name=f"warm-{image}")

    async def _fill(self, image: str) -> None:
        try:
            while not self._closing and len(self.ready.get(image, [])) < self.per_image:
                if self.count() + len(self._filling) - 1 >= self.max_total and not await self._evict_for(image):
                    return
                made = await self._make(image)
                if made is None:
                    return  # the image is not on the node (a create pulls it; a refill does not)
                w = WarmContainer(*made)
                if self._closing:
                    await self._destroy(w.id)
                    return
                self.ready.setdefault(image, []).append(w)
        except Exception as e:  # the next take tries again; creates never depend on the pool
            log.warning("warm_fill_failed", image=image, error=repr(e))
        finally:
            self._filling.pop(image, None)

    async def _evict_for(self, image: str) -> bool:
        """At warm_max: make room for `image` by destroying a warm container of the image wanted
        least recently, if that was before `image` (else `image` waits for room)."""
        others = [i for i, ws in self.ready.items() if ws and i != image]
        if not others:
            return False
        victim = min(others, key=lambda i: self._wanted.get(i, 0.0))
        if self._wanted.get(victim, 0.0) >= self._wanted.get(image, 0.0):
            return False
        w = self.ready[victim].pop(0)
        with contextlib.suppress(Exception):
            await self._destroy(w.id)
        return True

    async def sweep(self) -> None:
        """Destroy the warm containers of images no create asked for in `idle_s`."""
        now = time.monotonic()
        for image in list(self.ready):
            if now - self._wanted.get(image, 0.0) > self.idle_s:
                for w in self.ready.pop(image):
                    with contextlib.suppress(Exception):
                        await self._destroy(w.id)

    async def close(self) -> None:
        """Stop refilling (a create in flight finishes and is destroyed) and destroy them all."""
        self._closing = True
        await asyncio.gather(*self._filling.values(), return_exceptions=True)
        ready, self.ready = [w for v in self.ready.values() for w in v], {}
        await asyncio.gather(*(self._destroy(w.id) for w in ready), return_exceptions=True)
