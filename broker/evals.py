"""Evaluation during training, its Redis state (owned here): which policy versions are due for
an evaluation, which eval worker runs which version on which eval server, and one result per
version.

- `schedule(current, every)`: every `every`-th version up to the published one is added to the
  pending set once (a marker remembers how far the schedule has looked), unless it has a result.
- `take(owner)`: the oldest pending version no live worker holds is claimed (a TTL'd claim,
  renewed while the worker runs it); a dead worker's claim lapses and another takes the version.
- `record(version, owner, result)`: the result is written and the version leaves the pending set
  in one Lua call, only by the claim's holder (or when no one holds it) and only once: a
  restarted worker never runs a finished version again.
- `reopen(version, result)`: a version published again with other weights (a learner resumed
  from an earlier checkpoint reuses the numbers after it) is due again.
- `claim_server` / `release_server`: an eval server is loaded by one worker only.
Every multi-key change is one Lua call."""

from __future__ import annotations

import json
from typing import Any

import redis.asyncio as aioredis

from broker.connection import reply
from broker.keys import EVAL_CLAIM_TTL_S, Keys

RESULT_STATUSES = ("done", "skipped", "failed")


def _s(x: Any) -> str:
    return x.decode() if isinstance(x, bytes) else str(x)


class EvalBoard:
    # KEYS: marker, pending, results. ARGV: current, every. Returns the versions added.
    _SCHEDULE = """
    local last = tonumber(redis.call('GET', KEYS[1]) or '0')
    local cur, every = tonumber(ARGV[1]), tonumber(ARGV[2])
    local added = {}
    if cur <= last then return added end
    for v = (math.floor(last / every) + 1) * every, cur, every do
      if redis.call('HEXISTS', KEYS[3], tostring(v)) == 0 then
        redis.call('ZADD', KEYS[2], 'NX', v, tostring(v))
        table.insert(added, v)
      end
    end
    redis.call('SET', KEYS[1], tostring(cur))
    return added
    """
    # KEYS: pending, results, then the claims of the candidates (oldest first).
    # ARGV: owner, ttl_s, then the candidates' versions. Returns the version claimed, or false.
    _TAKE = """
    for i = 3, #ARGV do
      local v = ARGV[i]
      if redis.call('HEXISTS', KEYS[2], v) == 1 then
        redis.call('ZREM', KEYS[1], v)
      elseif redis.call('ZSCORE', KEYS[1], v) and
             redis.call('SET', KEYS[i], ARGV[1], 'NX', 'EX', tonumber(ARGV[2])) then
        return tonumber(v)
      end
    end
    return false
    """
    # KEYS: a claim. ARGV: owner, ttl_s. 1 when the owner holds it (renewed).
    _RENEW = """
    if redis.call('GET', KEYS[1]) == ARGV[1] then
      redis.call('EXPIRE', KEYS[1], tonumber(ARGV[2]))
      return 1
    end
    return 0
    """
    # KEYS: a claim. ARGV: owner. Deleted only by its holder.
    _RELEASE = """
    if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
    return 0
    """
    # KEYS: a server claim. ARGV: owner, ttl_s. 1 when taken or already the owner's (renewed).
    _CLAIM_SERVER = """
    local holder = redis.call('GET', KEYS[1])
    if holder and holder ~= ARGV[1] then return 0 end
    redis.call('SET', KEYS[1], ARGV[1], 'EX', tonumber(ARGV[2]))
    return 1
    """
    # KEYS: pending, results, the version's claim. ARGV: version, owner, result JSON.
    # 1: recorded; 0: the version already has a result, or another worker holds it now.
    _RECORD = """
    if redis.call('HEXISTS', KEYS[2], ARGV[1]) == 1 then return 0 end
    local holder = redis.call('GET', KEYS[3])
    if holder and holder ~= ARGV[2] then return 0 end
    redis.call('HSET', KEYS[2], ARGV[1], ARGV[3])
    redis.call('ZREM', KEYS[1], ARGV[1])
    redis.call('DEL', KEYS[3])
    return 1
    """

    # KEYS: pending, results. ARGV: version, the result as read. The version is due again (its
    # result dropped) only if the result is still the one read.
    _REOPEN = """
    if redis.call('HGET', KEYS[2], ARGV[1]) ~= ARGV[2] then return 0 end
    redis.call('HDEL', KEYS[2], ARGV[1])
    redis.call('ZADD', KEYS[1], 'NX', tonumber(ARGV[1]), ARGV[1])
    return 1
    """

    def __init__(self, redis: aioredis.Redis, keys: Keys) -> None:
        self.redis, self.keys = redis, keys
        self._schedule = redis.register_script(self._SCHEDULE)
        self._take = redis.register_script(self._TAKE)
        self._renew = redis.register_script(self._RENEW)
        self._release = redis.register_script(self._RELEASE)
        self._claim_server = redis.register_script(self._CLAIM_SERVER)
        self._record = redis.register_script(self._RECORD)
        self._reopen = redis.register_script(self._REOPEN)

    async def schedule(self, current: int, every: int) -> list[int]:
        """Add every `every`-th version up to `current` that the schedule has not looked at yet
        (and that has no result) to the pending set; returns the versions added."""
        if every < 1:
            raise ValueError(f"eval.every_versions: must be >= 1 to schedule, got {every}")
        k = self.keys
        added = await self._schedule(keys=[k.eval_scheduled, k.eval_pending, k.eval_results],
                                     args=[int(current), int(every)])
        return [int(v) for v in added or []]

    async def pending(self) -> list[int]:
        """Versions due and without a result, oldest first."""
        return [int(_s(v)) for v in await reply(self.redis.zrange(self.keys.eval_pending, 0, -1))]

    async def take(self, owner: str, ttl_s: float = EVAL_CLAIM_TTL_S) -> int | None:
        """Claim the oldest pending version nobody holds (None: there is none)."""
        versions = await self.pending()
        if not versions:
            return None
        k = self.keys
        got = await self._take(keys=[k.eval_pending, k.eval_results, *(k.eval_claim(v) for v in versions)],
                               args=[owner, max(1, int(ttl_s)), *versions])
        return int(got) if got is not None and got is not False else None

    async def begin_try(self, version: int) -> int:
        """Count a try of `version` (a weight load begun); returns the tries so far."""
        return int(await reply(self.redis.hincrby(self.keys.eval_tries, str(version), 1)))

    async def renew(self, version: int, owner: str, ttl_s: float = EVAL_CLAIM_TTL_S) -> bool:
        return bool(await self._renew(keys=[self.keys.eval_claim(version)], args=[owner, max(1, int(ttl_s))]))

    async def release(self, version: int, owner: str) -> None:
        """Give the version back (it stays pending): a try that ended without a result."""
        await self._release(keys=[self.keys.eval_claim(version)], args=[owner])

    async def record(self, version: int, owner: str, result: dict[str, Any]) -> bool:
        """Write the version's one result and take it off the pending set; False (nothing
        written) when it already has one or another worker holds it now."""
        if result.get("status") not in RESULT_STATUSES:
            raise ValueError(f"result.status: must be one of {RESULT_STATUSES}, got {result.get('status')!r}")
        k = self.keys
        doc = json.dumps({"version": version, **result})
        return bool(await self._record(keys=[k.eval_pending, k.eval_results, k.eval_claim(version)],
                                       args=[version, owner, doc]))

    async def results(self) -> dict[int, dict[str, Any]]:
        raw = await reply(self.redis.hgetall(self.keys.eval_results))
        return {int(_s(v)): json.loads(doc) for v, doc in sorted(raw.items(), key=lambda kv: int(_s(kv[0])))}

    async def reopen(self, version: int, was: dict[str, Any]) -> bool:
        """Make `version` due again, dropping its result `was` (as `results()` returned it): the
        version was published again with other weights (a learner resumed from an earlier
        checkpoint). False when the result changed meanwhile. Its tries start over."""
        k = self.keys
        raw = await reply(self.redis.hget(k.eval_results, str(version)))
        if raw is None or json.loads(raw) != was:
            return False
        if not await self._reopen(keys=[k.eval_pending, k.eval_results], args=[version, _s(raw)]):
            return False
        await reply(self.redis.hdel(k.eval_tries, str(version)))
        return True

    async def tries(self, version: int) -> int:
        return int(await reply(self.redis.hget(self.keys.eval_tries, str(version))) or 0)

    async def running(self) -> dict[int, str]:
        """Pending versions a worker holds now -> the worker's id."""
        versions = await self.pending()
        if not versions:
            return {}
        holders = await reply(self.redis.mget([self.keys.eval_claim(v) for v in versions]))
        return {v: _s(h) for v, h in zip(versions, holders, strict=True) if h is not None}

    async def claim_server(self, server_id: str, owner: str, ttl_s: float = EVAL_CLAIM_TTL_S) -> bool:
        """Take (or renew) eval server `server_id` for `owner`; False when another worker has it."""
        return bool(await self._claim_server(keys=[self.keys.eval_server_claim(server_id)],
                                             args=[owner, max(1, int(ttl_s))]))

    async def release_server(self, server_id: str, owner: str) -> None:
        await self._release(keys=[self.keys.eval_server_claim(server_id)], args=[owner])
