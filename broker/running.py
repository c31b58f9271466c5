"""Episodes running now (owned here): the oldest policy version each may have generated with,
how long it has run, whether it is past its last turn, its tokens so far — and the durations of
the listings that ended. What the learner weighs before a step that would make a running episode
stale (learner.hold).

Sorted sets with the same members (job ids): `running:oldest` scores each by its oldest version
(the version its server held when the episode was pinned: no token of it is older),
`running:seen` by when its actor last refreshed it, `running:started` by when it was listed,
`running:last_turn` by when its last turn was generated (absent while it generates),
`running:tokens` by the tokens generated so far (times: Redis' own clock, ms, so actors on hosts
with skewed clocks agree). An actor adds an episode once it is pinned, marks its last turn,
refreshes its episodes (and their tokens) with its version poll (about once a second), and
removes one after its samples were written (or it ended without them), saying whether it ran to
its end. Each removal appends the listing's durations to `running:ended` (the newest
ENDED_KEPT): a stopped one is kept as censored — it lasted at least that long. An actor that dies
leaves entries that stop being refreshed: the reader drops entries older than `ttl_s` before
answering, so a killed actor delays the learner by at most that long."""

from __future__ import annotations

from dataclasses import dataclass

import redis.asyncio as aioredis

from broker.connection import reply
from broker.keys import Keys

# an entry not refreshed for this long belongs to a dead actor (refreshes come about every 1 s)
RUNNING_TTL_S = 10.0
ENDED_KEPT = 500  # the recent durations the learner's hold rule weighs

_NOW_MS = "local t = redis.call('TIME'); local now = t[1] * 1000 + math.floor(t[2] / 1000)\n"
# KEYS[1..5]: oldest, seen, started, last_turn, tokens; ARGV[1]: ttl ms. A dead actor's entries go.
_DROP_DEAD = """
local dead = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now - tonumber(ARGV[1]))
for i = 1, #dead do
  for k = 1, 5 do redis.call('ZREM', KEYS[k], dead[i]) end
end
"""


@dataclass(frozen=True)
class Running:
    """A live running episode, as the learner's hold rule sees it."""

    job_id: str
    version: int  # its oldest version
    elapsed_s: float  # since it was listed
    graded_for_s: float | None  # since its last turn; None: still generating
    tokens: int  # generated so far (as of its actor's last refresh)


class RunningEpisodes:
    # KEYS: oldest, seen, started, last_turn, tokens; ARGV: job id, version
    _ADD = _NOW_MS + """
    redis.call('ZADD', KEYS[1], ARGV[2], ARGV[1])
    redis.call('ZADD', KEYS[2], now, ARGV[1])
    redis.call('ZADD', KEYS[3], now, ARGV[1])
    redis.call('ZREM', KEYS[4], ARGV[1])
    redis.call('ZADD', KEYS[5], 0, ARGV[1])
    return 1
    """
    # KEYS: oldest, seen, tokens; ARGV: pairs (job id, tokens or ''). Only entries still there
    # (one removed meanwhile stays out).
    _REFRESH = _NOW_MS + """
    local n = 0
    for i = 1, #ARGV, 2 do
      if redis.call('ZSCORE', KEYS[1], ARGV[i]) then
        redis.call('ZADD', KEYS[2], 'XX', now, ARGV[i])
        if ARGV[i + 1] ~= '' then redis.call('ZADD', KEYS[3], ARGV[i + 1], ARGV[i]) end
        n = n + 1
      end
    end
    return n
    """
    # KEYS: oldest, last_turn; ARGV: job id
    _LAST_TURN = _NOW_MS + """
    if not redis.call('ZSCORE', KEYS[1], ARGV[1]) then return 0 end
    redis.call('ZADD', KEYS[2], now, ARGV[1])
    return 1
    """
    # KEYS: oldest, seen, started, last_turn, tokens, ended; ARGV: job id, ended (1/0), kept
    _REMOVE = _NOW_MS + """
    local started = redis.call('ZSCORE', KEYS[3], ARGV[1])
    if started then
      local last = redis.call('ZSCORE', KEYS[4], ARGV[1])
      local grading = -1
      if last then grading = now - tonumber(last) end
      redis.call('LPUSH', KEYS[6], (now - tonumber(started)) .. ' ' .. grading .. ' ' .. ARGV[2])
      redis.call('LTRIM', KEYS[6], 0, tonumber(ARGV[3]) - 1)
    end
    for k = 1, 5 do redis.call('ZREM', KEYS[k], ARGV[1]) end
    return started and 1 or 0
    """
    # KEYS: oldest, seen, started, last_turn, tokens; ARGV: ttl ms, due version. Drops dead
    # entries, then returns {episodes with oldest version <= due, the oldest version or -1}.
    _AT_RISK = _NOW_MS + _DROP_DEAD + """
    local n = redis.call('ZCOUNT', KEYS[1], '-inf', ARGV[2])
    local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
    local oldest = -1
    if #first > 0 then oldest = tonumber(first[2]) end
    return {n, oldest}
    """
    # KEYS: oldest, seen, started, last_turn, tokens; ARGV: ttl ms. Drops dead entries, then
    # returns {now, then per live episode: job id, version, started, last turn or -1, tokens}.
    _SNAPSHOT = _NOW_MS + _DROP_DEAD + """
    local out = {now}
    local all = redis.call('ZRANGE', KEYS[1], 0, -1, 'WITHSCORES')
    for i = 1, #all, 2 do
      local job = all[i]
      out[#out + 1] = job
      out[#out + 1] = all[i + 1]
      out[#out + 1] = redis.call('ZSCORE', KEYS[3], job) or '-1'
      out[#out + 1] = redis.call('ZSCORE', KEYS[4], job) or '-1'
      out[#out + 1] = redis.call('ZSCORE', KEYS[5], job) or '0'
    end
    return out
    """

    def __init__(self, redis: aioredis.Redis, keys: Keys, ttl_s: float = RUNNING_TTL_S) -> None:
        self.redis, self.keys, self.ttl_s = redis, keys, ttl_s
        self._add = redis.register_script(self._ADD)
        self._refresh = redis.register_script(self._REFRESH)
        self._last_turn = redis.register_script(self._LAST_TURN)
        self._remove = redis.register_script(self._REMOVE)
        self._at_risk = redis.register_script(self._AT_RISK)
        self._snapshot = redis.register_script(self._SNAPSHOT)

    def _keys(self) -> list[str]:
        k = self.keys
        return [k.running_oldest, k.running_seen, k.running_started, k.running_last_turn, k.running_tokens]

    async def add(self, job_id: str, version: int) -> None:
        """`job_id` runs from now on, none of its tokens older than `version`."""
        await self._add(keys=self._keys(), args=[job_id, version])

    async def refresh(self, job_ids: list[str], tokens: dict[str, int] | None = None) -> int:
        """These episodes still run (their actor is alive), with the tokens each has generated
        so far where known; returns how many are listed."""
        if not job_ids:
            return 0
        tokens = tokens or {}
        args = [x for j in job_ids for x in (j, str(tokens[j]) if j in tokens else "")]
        return int(await self._refresh(keys=[self.keys.running_oldest, self.keys.running_seen,
                                             self.keys.running_tokens], args=args))

    async def last_turn(self, job_id: str) -> bool:
        """The episode's last turn is generated: it grades from now on (False: not listed)."""
        return bool(await self._last_turn(keys=[self.keys.running_oldest, self.keys.running_last_turn],
                                          args=[job_id]))

    async def remove(self, job_id: str, ended: bool = True) -> None:
        """The episode is over: it ran to its end (`ended`), or it was stopped (stale, its group
        closed, an error, a shutdown: its duration is only a lower bound)."""
        await self._remove(keys=[*self._keys(), self.keys.running_ended],
                           args=[job_id, int(ended), ENDED_KEPT])

    async def at_risk(self, due: int) -> tuple[int, int | None]:
        """(how many live episodes have an oldest version <= `due`, the oldest version of any
        live episode or None)."""
        n, oldest = await self._at_risk(keys=self._keys(), args=[int(self.ttl_s * 1000), due])
        return int(n), (None if int(oldest) < 0 else int(oldest))

    async def snapshot(self) -> list[Running]:
        """Every live running episode (a dead actor's entries are dropped first)."""
        raw = await self._snapshot(keys=self._keys(), args=[int(self.ttl_s * 1000)])
        now, out = float(raw[0]), []
        for i in range(1, len(raw), 5):
            job, v, started, last, tokens = raw[i:i + 5]
            started_f, last_f = float(started), float(last)
            out.append(Running(job.decode() if isinstance(job, bytes) else str(job), int(float(v)),
                               max(0.0, (now - started_f) / 1000) if started_f >= 0 else 0.0,
                               max(0.0, (now - last_f) / 1000) if last_f >= 0 else None,
                               int(float(tokens))))
        return out

    async def ended(self) -> list[tuple[float, float | None, bool]]:
        """The recent listings that ended, newest first: (seconds listed, seconds from the last
        turn or None, ran to its end)."""
        out = []
        for raw in await reply(self.redis.lrange(self.keys.running_ended, 0, ENDED_KEPT - 1)):
            total, grading, ended = (raw.decode() if isinstance(raw, bytes) else str(raw)).split()
            out.append((int(total) / 1000, None if int(grading) < 0 else int(grading) / 1000, ended == "1"))
        return out

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
