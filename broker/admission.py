"""Admission control (the staleness bound), decided atomically in Redis:
a rollout may start only while started < (max_staleness + current_version + 1) * per_version,
per_version being the episodes the learner trains per policy version: batch_size, times
learner.update_every when a version spans several steps (the learner records it in Redis, so
actors need not share its config; without it a second step of a version waited forever for
rollouts admission would not start). Any number of actors share the counter, so none of them
can overshoot."""

from __future__ import annotations

import redis.asyncio as aioredis

from broker.config import AdmissionConfig
from broker.keys import Keys


class Admission:
    _TRY = """
    local v = tonumber(redis.call('GET', KEYS[2]) or '0')
    local started = tonumber(redis.call('GET', KEYS[1]) or '0')
    local per = tonumber(redis.call('GET', KEYS[3]) or ARGV[2])
    local cap = (tonumber(ARGV[1]) + v + 1) * per
    if started < cap then redis.call('INCR', KEYS[1]); return {1, started + 1, cap} end
    return {0, started, cap}
    """
    _RELEASE = """
    local n = tonumber(redis.call('GET', KEYS[1]) or '0')
    local k = math.min(n, tonumber(ARGV[1]))
    if k > 0 then return redis.call('DECRBY', KEYS[1], k) end
    return n
    """

    def __init__(self, redis: aioredis.Redis, keys: Keys, cfg: AdmissionConfig) -> None:
        self.redis, self.keys, self.cfg = redis, keys, cfg
        self._try = redis.register_script(self._TRY)
        self._release = redis.register_script(self._RELEASE)

    async def try_start(self) -> bool:
        if not self.cfg.enabled:
            await self.redis.incr(self.keys.admission_started)
            return True
        ok, _, _ = await self._try(keys=[self.keys.admission_started, self.keys.policy_current,
                                         self.keys.admission_per_version],
                                   args=[self.cfg.max_staleness, self.cfg.batch_size])
        return bool(ok)

    async def release(self, n: int = 1) -> None:
        """Give `n` slots back: rollouts that ended without trainable samples (the actor), or
        whose samples the learner dropped untrained (stale, incomplete, too small a group)."""
        if n > 0:
            await self._release(keys=[self.keys.admission_started], args=[n])

    async def set_per_version(self, steps_per_version: int) -> None:
        """The learner: it trains batch_size x steps_per_version episodes per version."""
        await self.redis.set(self.keys.admission_per_version,
                             self.cfg.batch_size * max(1, steps_per_version))

    async def capacity(self) -> dict[str, int]:
        started, v, per = await self.redis.mget(self.keys.admission_started, self.keys.policy_current,
                                                self.keys.admission_per_version)
        started_i, v_i = int(started or 0), int(v or 0)
        per_i = int(per or self.cfg.batch_size)
        cap = (self.cfg.max_staleness + v_i + 1) * per_i
        return {"started": started_i, "capacity": cap, "version": v_i, "per_version": per_i,
                "free": max(0, cap - started_i)}
