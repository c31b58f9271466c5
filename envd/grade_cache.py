"""Verdicts envd has graded, answered again for the same patch (envd.grade_cache_entries).

A row's patch is graded in a fresh container of the agent's image, so its verdict is a function
of what went in: the image (by content id), the row, the eval script, the working directory, the
patch's bytes, the time bound and the grader's settings. RL asks for the same verdict many times
over: the samples of a group converge to one patch, the tiny demo policy writes a handful of
patches per task, an evaluation grades what training already graded. Each repeat cost a container
create and start, the referee's test runs and a destroy — most of the CPU a demo episode spends
(benchmarks/RESULTS.md demo_cpu_split). Here the first grading of a key runs, a grading of the
same key that arrives while it runs waits for it (a group's samples finish together), and later
ones are answered from memory.

What it trades, and why it is held where it is:
- the cache is envd's own memory, filled only with verdicts this process graded: nothing an
  actor or a container can write reaches it (a verdict cache in Redis would be writable by
  every actor that holds the broker's password);
- the key is a sha256 over every input, each length-framed (json), so a different patch, row,
  script or image is a different key — there is no near match;
- a test that is flaky is graded once per key while the entry lives (`ttl_s`): its first
  outcome is repeated, where fresh gradings would draw again. SWE-bench grades each prediction
  once too; a run that wants fresh draws sets envd.grade_cache_entries to 0;
- a verdict that the machine could have decided is never kept: a run that timed out or was
  killed by a signal (an OOM kill), a setup script that failed, an error raised by envd;
- an attack on the referee that succeeds by chance gets one draw per distinct patch, not one
  per submission.
"""

from __future__ import annotations

import asyncio
import copy
import hashlib
import json
import time
from collections.abc import Awaitable, Callable
from typing import Any

from cachetools import TTLCache

from envd.graded_run import SETUP_FAILED

__all__ = ["GradeCache", "cacheable", "grade_key"]


def grade_key(*, image_id: str, cwd: str, instance: dict[str, Any], script: str, patch: str,
              timeout_s: float, settings: Any) -> str:
    """sha256 over every input of a graded run, each framed by json (no two inputs can run
    together into the same bytes)."""
    blob = json.dumps([image_id, cwd, instance, script, patch, float(timeout_s), settings],
                      sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=repr)
    return hashlib.sha256(blob.encode("utf-8", "surrogatepass")).hexdigest()


def cacheable(result: dict[str, Any]) -> bool:
    """Whether a graded run's answer is the patch's doing alone, so that the same inputs would get
    it again: refused as a reward hack, or the tests ran to an exit of their own in time."""
    if result.get("timed_out"):
        return False
    if result.get("reward_hack"):
        return True
    rc = result.get("returncode")
    if rc is None or not 0 <= rc < 128:  # none: not run; 128+n: killed by signal n (OOM, ...)
        return False
    return not str(result.get("error", "")).startswith(SETUP_FAILED)


class GradeCache:
    """At most `max_entries` verdicts, each for `ttl_s`, least recently used dropped first; one
    grading at a time per key."""

    def __init__(self, max_entries: int, ttl_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.max_entries = max_entries
        # least recently used dropped past maxsize; an entry expires ttl_s after it was graded
        self._done: TTLCache[str, dict[str, Any]] = TTLCache(max(1, max_entries), ttl_s, timer=clock)
        self._running: dict[str, asyncio.Future[dict[str, Any] | None]] = {}

    @property
    def enabled(self) -> bool:
        return self.max_entries > 0

    def __len__(self) -> int:
        return len(self._done)

    def _get(self, key: str) -> dict[str, Any] | None:
        hit = self._done.get(key)
        return copy.deepcopy(hit) if hit is not None else None  # callers change their answers

    def _put(self, key: str, result: dict[str, Any]) -> None:
        self._done[key] = copy.deepcopy(result)

    async def grade(self, key: str, run: Callable[[], Awaitable[dict[str, Any]]]) -> tuple[dict[str, Any], str]:
        """(the verdict, how it was had: "miss" graded here, "hit" from memory, "joined" the
        grading of the same key that was running, "off" no cache). A grading that was running
        answers those that waited for it whether or not it is kept (the same inputs at the same
        moment: a timeout there is what they would have drawn). One that raised or was cancelled
        leaves nothing behind: whoever waited on it goes on as if it had come first."""
        if not self.enabled:
            return await run(), "off"
        while True:
            hit = self._get(key)
            if hit is not None:
                return hit, "hit"
            running = self._running.get(key)
            if running is None:
                break
            shared = await asyncio.shield(running)
            if shared is not None:
                return copy.deepcopy(shared), "joined"
        fut: asyncio.Future[dict[str, Any] | None] = asyncio.get_running_loop().create_future()
        self._running[key] = fut
        answer: dict[str, Any] | None = None
        try:
            result = await run()
            if cacheable(result):
                self._put(key, result)
            answer = copy.deepcopy(result)  # what the waiters get: not the object returned here
            return result, "miss"
        finally:
            del self._running[key]
            fut.set_result(answer)  # waiters wake on every exit: a result, an exception, a cancel
