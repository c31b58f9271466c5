"""Episodes running now and the oldest policy version each may have generated with (owned
here): what the learner needs to hold a step that would make a running episode stale
(learner.straggler_grace_s).

Two sorted sets with the same members (job ids): `running:oldest` scores each by its oldest
version (the version its server held when the episode was pinned: no token of it is older),
`running:seen` by when its actor last refreshed it (Redis' own clock, ms, so actors on hosts
with skewed clocks agree). An actor adds an episode once it is pinned, refreshes its episodes
with its version poll (about once a second), and removes one after its samples were written
(or it ended without them). An actor that dies leaves entries that stop being refreshed: the
reader drops entries older than `ttl_s` before answering, so a killed actor delays the learner
by at most that long."""

from __future__ import annotations

import redis.asyncio as aioredis

from broker.connection import reply
from broker.keys import Keys

# an entry not refreshed for this long belongs to a dead actor (refreshes come about every 1 s)
RUNNING_TTL_S = 10.0

_NOW_MS = "local t = redis.call('TIME'); local now = t[1] * 1000 + math.floor(t[2] / 1000)\n"


class RunningEpisodes:
    # KEYS: oldest, seen; ARGV: job id, version
    _ADD = _NOW_MS + """
    redis.call('ZADD', KEYS[1], ARGV[2], ARGV[1])
    redis.call('ZADD', KEYS[2], now, ARGV[1])
    return 1
    """
    # KEYS: oldest, seen; ARGV: job ids. Only entries still there (one removed meanwhile stays out).
    _REFRESH = _NOW_MS + """
    local n = 0
    for i = 1, #ARGV do
      if redis.call('ZSCORE', KEYS[1], ARGV[i]) then
        redis.call('ZADD', KEYS[2], 'XX', now, ARGV[i])
        n = n + 1
      end
    end
    return n
    """
    # KEYS: oldest, seen; ARGV: ttl ms, due version. Drops entries not refreshed within ttl, then
    # returns {episodes with oldest version <= due, the oldest version or -1 when none runs}.
    _AT_RISK = _NOW_MS + """
    local dead = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now - tonumber(ARGV[1]))
    for i = 1, #dead do
      redis.call('ZREM', KEYS[1], dead[i])
      redis.call('ZREM', KEYS[2], dead[i])
    end
    local n = redis.call('ZCOUNT', KEYS[1], '-inf', ARGV[2])
    local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
    local oldest = -1
    if #first > 0 then oldest = tonumber(first[2]) end
    return {n, oldest}
    """

    def __init__(self, redis: aioredis.Redis, keys: Keys, ttl_s: float = RUNNING_TTL_S) -> None:
        self.redis, self.keys, self.ttl_s = redis, keys, ttl_s
        self._add = redis.register_script(self._ADD)
        self._refresh = redis.register_script(self._REFRESH)
        self._at_risk = redis.register_script(self._AT_RISK)

    def _keys(self) -> list[str]:
        return [self.keys.running_oldest, self.keys.running_seen]

    async def add(self, job_id: str, version: int) -> None:
        """`job_id` runs, none of its tokens older than `version`."""
        await self._add(keys=self._keys(), args=[job_id, version])

    async def refresh(self, job_ids: list[str]) -> int:
        """These episodes still run (their actor is alive); returns how many are listed."""
        if not job_ids:
            return 0
        return int(await self._refresh(keys=self._keys(), args=job_ids))

    async def remove(self, job_id: str) -> None:
        pipe = self.redis.pipeline(transaction=True)
        pipe.zrem(self.keys.running_oldest, job_id)
        pipe.zrem(self.keys.running_seen, job_id)
        await pipe.execute()

    async def at_risk(self, due: int) -> tuple[int, int | None]:
        """(how many live episodes have an oldest version <= `due`, the oldest version of any
        live episode or None): the learner's question before a step that publishes due +
        max_staleness + 1."""
        n, oldest = await self._at_risk(keys=self._keys(), args=[int(self.ttl_s * 1000), due])
        return int(n), (None if int(oldest) < 0 else int(oldest))

    async def count(self) -> int:
        return int(await reply(self.redis.zcard(self.keys.running_oldest)))

    async def by_version(self) -> dict[int, int]:
        """Live running episodes per oldest version (read-only: a dead actor's entries are
        left out, not removed), for `swarl status`."""
        sec, usec = await self.redis.time()
        live_since = sec * 1000 + usec // 1000 - int(self.ttl_s * 1000)
        seen = dict(await reply(self.redis.zrange(self.keys.running_seen, 0, -1, withscores=True)))
        out: dict[int, int] = {}
        for job, v in await reply(self.redis.zrange(self.keys.running_oldest, 0, -1, withscores=True)):
            if seen.get(job, 0) >= live_since:
                out[int(v)] = out.get(int(v), 0) + 1
        return out
