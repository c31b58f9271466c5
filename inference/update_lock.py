"""The CPU server's model-update lock and weight-update session, as SGLang 0.5.23 has them.

Every generate request holds the lock shared from admission to answer; a weight update
(update_weights_from_disk, update_weights_from_distributed, begin/end_weight_update) takes it
exclusive, so it starts only once the requests in flight have ended, and requests that arrive
while it waits queue behind it (writers first). While generation is paused the updates skip
the lock, as SGLang's do: whoever paused the engine owns it.

The session: update_weights_from_distributed is refused outside begin_weight_update ..
end_weight_update; a second begin before end is refused, and so is an end with none open.
Refusals carry SGLang's own messages.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

SESSION_OPEN = "a weight-update session is already open; call end_weight_update() first"
NO_SESSION = "no weight-update session is open; call begin_weight_update() first"
OUTSIDE_SESSION = ("update_weights_from_distributed must run between begin_weight_update() and "
                   "end_weight_update()")


class UpdateLock:
    """An asyncio reader/writer lock that prefers writers (SGLang's aio_rwlock.RWLock)."""

    def __init__(self) -> None:
        self._cond = asyncio.Condition()
        self._readers = 0
        self._writer = False
        self._writers_waiting = 0

    @contextlib.asynccontextmanager
    async def shared(self) -> AsyncIterator[None]:
        async with self._cond:
            await self._cond.wait_for(lambda: not self._writer and not self._writers_waiting)
            self._readers += 1
        try:
            yield
        finally:
            async with self._cond:
                self._readers -= 1
                if not self._readers:
                    self._cond.notify_all()

    @contextlib.asynccontextmanager
    async def exclusive(self) -> AsyncIterator[None]:
        async with self._cond:
            self._writers_waiting += 1
            try:
                await self._cond.wait_for(lambda: not self._writer and not self._readers)
            finally:
                self._writers_waiting -= 1
            self._writer = True
        try:
            yield
        finally:
            async with self._cond:
                self._writer = False
                self._cond.notify_all()

    @property
    def readers(self) -> int:
        return self._readers


class Session:
    """Whether a weight-update session is open, and for which runners (SGLang's selector)."""

    def __init__(self) -> None:
        self.selector: str | None = None

    @property
    def open(self) -> bool:
        return self.selector is not None

    def begin(self, selector: str) -> str:
        """"" when opened, else why not."""
        if self.selector is not None:
            return SESSION_OPEN
        self.selector = selector
        return ""

    def end(self) -> str:
        if self.selector is None:
            return NO_SESSION
        self.selector = None
        return ""
