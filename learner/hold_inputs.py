"""What the learner's hold rule (learner.hold) weighs, read from Redis: the running episodes
(broker.running, asked before a round's read), the run's recent episode durations, admission's
free slots, the actors' generation slots, the queue, and the run's generated tokens per busy
slot second (the stats hash: actors.rollout counts both)."""

from __future__ import annotations

import time
from typing import Any

from broker.admission import Admission
from broker.connection import reply
from broker.keys import Keys
from broker.registry import ActorRegistry
from broker.running import Running, RunningEpisodes
from learner.hold import Durations, HoldInputs, Straggler

SLOW_EVERY_S = 5.0  # durations and actor slots change slowly: read at most this often


class HoldProbe:
    def __init__(self, redis: Any, keys: Keys, running: RunningEpisodes, admission: Admission) -> None:
        self.redis, self.keys, self.running, self.admission = redis, keys, running, admission
        self._slow_at = -SLOW_EVERY_S
        self._durations = Durations.of([])
        self._slots = 0

    async def inputs(self, running: list[Running], stragglers: list[Straggler], backlog: bool,
                     held_s: float) -> HoldInputs:
        """The inputs for `stragglers` (those of `running` the next step would leave behind)."""
        if time.monotonic() - self._slow_at >= SLOW_EVERY_S:
            self._durations = Durations.of(await self.running.ended())
            self._slots = sum(int(a["concurrency"]) for a in await ActorRegistry(self.redis, self.keys).list())
            self._slow_at = time.monotonic()
        generated, busy = await reply(self.redis.hmget(self.keys.stats, ["tokens_generated", "rollout_busy_s"]))
        busy_s = float(busy or 0)
        free = (await self.admission.capacity())["free"] if self.admission.cfg.enabled else 1 << 30
        return HoldInputs(
            stragglers=stragglers, durations=self._durations,
            tokens_per_slot_s=float(generated or 0) / busy_s if busy_s > 0 else 0.0,
            slots=self._slots, generating=sum(1 for r in running if r.graded_for_s is None),
            admission_free=int(free), queued=int(await reply(self.redis.zcard(self.keys.queue))),
            backlog=backlog, held_s=held_s)
