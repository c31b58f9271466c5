"""Admission control (the staleness bound), decided atomically in Redis:
a rollout may start only while started < (max_staleness + current_version + 1) * batch_size.
Any number of actors share the counter, so none of them can overshoot."""

from __future__ import annotations

import redis.asyncio as aioredis

from broker.config import AdmissionConfig
from broker.keys import Keys


class Admission:
    _TRY = """
    local v = tonumber(redis.call('GET', KEYS[2]) or '0')
    local started = tonumber(redis.call('GET', KEYS[1]) or '0')
    local cap = (tonumber(ARGV[1]) + v + 1) * tonumber(ARGV[2])
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
        ok, _, _ = await self._try(keys=[self.keys.admission_started, self.keys.policy_current],
                                   args=[self.cfg.max_staleness, self.cfg.batch_size])
        return bool(ok)

    async def release(self, n: int = 1) -> None:
        """Give `n` slots back: rollouts that ended without trainable samples (the actor), or
        whose samples the learner dropped untrained (stale, incomplete, too small a group)."""
        if n > 0:
            await self._release(keys=[self.keys.admission_started], args=[n])

    async def capacity(self) -> dict[str, int]:
        started, v = await self.redis.mget(self.keys.admission_started, self.keys.policy_current)
        started_i, v_i = int(started or 0), int(v or 0)
        cap = (self.cfg.max_staleness + v_i + 1) * self.cfg.batch_size
        return {"started": started_i, "capacity": cap, "version": v_i, "free": max(0, cap - started_i)}
