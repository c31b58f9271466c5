"""Admission control (the staleness bound), decided atomically in Redis:
a rollout may start only while started < (max_staleness + current_version + 1) * per_version,
per_version being the episodes the learner trains per policy version: batch_size, times
learner.update_every when a version spans several steps (the learner records it in Redis, so
actors need not share its config; without it a second step of a version waited forever for
rollouts admission would not start). Any number of actors share the counter, so none of them
can overshoot.

Admission is by group: the first of a group's episodes to start reserves slots for all
n_samples of them at once (when they fit), and its siblings start on that reservation. The
learner trains whole groups, and arq does not hand out jobs in enqueue order (two workers
racing for a job can both skip it), so admitting single episodes could fill a version's quota
with the first members of five groups for a batch of four: at max_staleness 0 no group then
completed and the learner waited forever. A group's reservation (one key per group, owned
here) is handed back with `forfeit` when the learner closes the group before all its members
started; `forfeit` also marks the group closed, so that actors stop (or never start) the members
whose samples the learner could only drop (`closed`)."""

from __future__ import annotations

from typing import Literal

import redis.asyncio as aioredis

from broker.config import AdmissionConfig
from broker.keys import Keys

# a group's reservation outlives any wait for its members; it only keeps Redis clean
GROUP_TTL_S = 24 * 3600


# KEYS[last] is the group's closed mark, checked first when ARGV[1] is '1' (a closed group's
# members never start: their samples could only be dropped); -1 then. Same call as the slot, so
# a waiting actor polls once, and no slot is taken after the group closed.
_UNLESS_CLOSED = """
if ARGV[1] == '1' and redis.call('EXISTS', KEYS[#KEYS]) == 1 then return -1 end
"""
Admitted = Literal["started", "wait", "closed"]
_OUTCOME: dict[int, Admitted] = {1: "started", 0: "wait", -1: "closed"}


class Admission:
    # KEYS: started, current, per_version, closed mark; ARGV: unless_closed, max_staleness, batch_size
    _TRY = _UNLESS_CLOSED + """
    local v = tonumber(redis.call('GET', KEYS[2]) or '0')
    local started = tonumber(redis.call('GET', KEYS[1]) or '0')
    local per = tonumber(redis.call('GET', KEYS[3]) or ARGV[3])
    local cap = (tonumber(ARGV[2]) + v + 1) * per
    if started < cap then redis.call('INCR', KEYS[1]); return 1 end
    return 0
    """
    # KEYS: started, current, per_version, the group's reservation, its closed mark; ARGV:
    # unless_closed, max_staleness, batch_size, group size, ttl. A reservation of 0 (used up)
    # means a member runs again (a retry after it gave its slot back): it takes one slot like a
    # single episode.
    _TRY_GROUP = _UNLESS_CLOSED + """
    local left = tonumber(redis.call('GET', KEYS[4]) or '-1')
    if left > 0 then redis.call('DECR', KEYS[4]); return 1 end
    local v = tonumber(redis.call('GET', KEYS[2]) or '0')
    local started = tonumber(redis.call('GET', KEYS[1]) or '0')
    local per = tonumber(redis.call('GET', KEYS[3]) or ARGV[3])
    local cap = (tonumber(ARGV[2]) + v + 1) * per
    local g = tonumber(ARGV[4])
    if left < 0 then
      if started + math.min(g, per) > cap then return 0 end
      redis.call('INCRBY', KEYS[1], g)
      redis.call('SET', KEYS[4], g - 1, 'EX', ARGV[5])
      return 1
    end
    if started < cap then redis.call('INCR', KEYS[1]); return 1 end
    return 0
    """
    # KEYS: started, the group's reservation, its closed mark; ARGV: ttl. The slots of members
    # that never started go back.
    _FORFEIT = """
    redis.call('SET', KEYS[3], 1, 'EX', ARGV[1])
    local left = tonumber(redis.call('GET', KEYS[2]) or '0')
    if left <= 0 then return 0 end
    redis.call('SET', KEYS[2], 0, 'KEEPTTL')
    local n = tonumber(redis.call('GET', KEYS[1]) or '0')
    local k = math.min(n, left)
    if k > 0 then redis.call('DECRBY', KEYS[1], k) end
    return k
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
        self._try_group = redis.register_script(self._TRY_GROUP)
        self._forfeit = redis.register_script(self._FORFEIT)

    async def try_start(self, group_id: str | None = None, group_size: int = 1) -> bool:
        """Take a slot for one rollout; with `group_id` and `group_size` > 1, by group (see above)."""
        return await self.admit(group_id, group_size) == "started"

    async def admit(self, group_id: str | None = None, group_size: int = 1,
                    unless_closed: bool = False) -> Admitted:
        """try_start in one call that also answers "closed" (no slot taken) when `unless_closed`
        and the learner has closed `group_id`; "wait": no slot free yet."""
        closed = self.keys.admission_closed(group_id or "")
        if not self.cfg.enabled:
            if unless_closed and group_id is not None and await self.redis.exists(closed):
                return "closed"
            await self.redis.incr(self.keys.admission_started)
            return "started"
        flag = "1" if unless_closed and group_id is not None else "0"
        if group_id is not None and group_size > 1:
            got = await self._try_group(
                keys=[self.keys.admission_started, self.keys.policy_current,
                      self.keys.admission_per_version, self.keys.admission_group(group_id), closed],
                args=[flag, self.cfg.max_staleness, self.cfg.batch_size, group_size, GROUP_TTL_S])
        else:
            got = await self._try(keys=[self.keys.admission_started, self.keys.policy_current,
                                        self.keys.admission_per_version, closed],
                                  args=[flag, self.cfg.max_staleness, self.cfg.batch_size])
        return _OUTCOME[int(got)]

    async def release(self, n: int = 1) -> None:
        """Give `n` slots back: rollouts that ended without trainable samples (the actor), or
        whose samples the learner dropped untrained (stale, incomplete, too small a group)."""
        if n > 0:
            await self._release(keys=[self.keys.admission_started], args=[n])

    async def forfeit(self, group_id: str) -> int:
        """The learner closed `group_id` before all its members arrived: it is marked closed, and
        the slots reserved for members that never started go back. Returns how many."""
        return int(await self._forfeit(keys=[self.keys.admission_started,
                                             self.keys.admission_group(group_id),
                                             self.keys.admission_closed(group_id)],
                                       args=[GROUP_TTL_S]))

    async def closed(self, group_ids: list[str]) -> set[str]:
        """Which of `group_ids` the learner has closed (one MGET)."""
        if not group_ids:
            return set()
        marks = await self.redis.mget([self.keys.admission_closed(g) for g in group_ids])
        return {g for g, m in zip(group_ids, marks, strict=True) if m is not None}

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
