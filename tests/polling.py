"""Waiting in tests: poll a condition until it holds, bounded, failing with what was awaited.

One sync and one async form for every test (five hand-rolled loops before, each with its own
timeout message or none). `what` may be a callable, read only when the wait fails (the last
state worth printing). `check` runs every round and raises when waiting is pointless (a child
process that died)."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Callable
from typing import Any

Text = str | Callable[[], str]


def _text(what: Text) -> str:
    return what() if callable(what) else what


def wait_until(cond: Callable[[], Any], within_s: float = 20.0, what: Text = "the condition",
               every: float = 0.2, check: Callable[[], None] | None = None) -> Any:
    """Poll `cond()` until it gives something true (returned), at most `within_s` seconds."""
    deadline = time.monotonic() + within_s
    while True:
        if value := cond():
            return value
        if check is not None:
            check()
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {within_s:.0f} s waiting for {_text(what)}")
        time.sleep(every)


async def wait_for(cond: Callable[[], Any], within_s: float = 20.0, what: Text = "the condition",
                   every: float = 0.1) -> Any:
    """`wait_until` for the event loop: `cond()` may be plain or async."""
    deadline = time.monotonic() + within_s
    while True:
        value = cond()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {within_s:.0f} s waiting for {_text(what)}")
        await asyncio.sleep(every)
