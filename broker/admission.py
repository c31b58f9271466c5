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
whose samples the learner could only drop (`closed`).

A job holds its slot across its tries: `admit` records the job (one key per admitted job, owned
here) and a job that runs again finds its record and starts on the slot it already holds. So a
retry after an error, a timeout, a hand-back on SIGTERM or a SIGKILLed actor neither waits for a
slot nor takes a second one, and no job of another group takes its place meanwhile (at
max_staleness 0 that left a batch one member short until learner.group_timeout_s). The slot
goes back once (`release_job`, idempotent) when the job ends without trainable samples, or its
group was closed; `finished` drops the record of a job whose samples were written."""

from __future__ import annotations

from typing import Literal

import redis.asyncio as aioredis

from broker.config import AdmissionConfig
from broker.connection import reply
from broker.keys import ARQ_IN_PROGRESS_PREFIX, Keys

# a group's reservation outlives any wait for its members; it only keeps Redis clean
GROUP_TTL_S = 24 * 3600


# One rule for a job of a group of size g, shared by admit (which takes the slot) and
# admissible (which only looks): `left` is the group's reservation (-1: no member started yet).
# Returns the slots to add to `started` (-1: no room now) and the reservation after.
_DECIDE = """
local function decide(left, g, started, cap, per)
  if left > 0 then return 0, left - 1 end
  if left < 0 and g > 1 then
    if started + math.min(g, per) > cap then return -1, left end
    return g, g - 1
  end
  if started < cap then return 1, left end
  return -1, left
end
local function capacity(current, per_version, max_staleness, batch_size)
  local per = tonumber(redis.call('GET', per_version) or batch_size)
  return (tonumber(max_staleness) + tonumber(redis.call('GET', current) or '0') + 1) * per, per
end
"""
# A job's slot goes back once: only while its record exists (shared by admit and release_job).
_GIVE_BACK = """
local function give_back(started, record)
  if redis.call('DEL', record) == 0 then return 0 end
  if tonumber(redis.call('GET', started) or '0') > 0 then redis.call('DECR', started) end
  return 1
end
"""
# KEYS: started, the job's record.
_RELEASE_JOB = _GIVE_BACK + "return give_back(KEYS[1], KEYS[2])"
Admitted = Literal["started", "wait", "closed"]
_OUTCOME: dict[int, Admitted] = {1: "started", 0: "wait", -1: "closed"}


class Admission:
    # KEYS: started, current, per_version, the group's reservation, its closed mark, the job's
    # record; ARGV: unless_closed, max_staleness, batch_size, group size, ttl, has_group,
    # has_job. A job with a record holds its slot already (it runs again); if its group was
    # closed meanwhile that slot goes back. A closed group's members never start (-1, checked in
    # the same call so a waiting actor polls once). A reservation left for the group is used
    # first.
    _ADMIT = _DECIDE + _GIVE_BACK + """
    local grouped, has_job = ARGV[6] == '1', ARGV[7] == '1'
    local closed = grouped and ARGV[1] == '1' and redis.call('EXISTS', KEYS[5]) == 1
    if has_job and redis.call('EXISTS', KEYS[6]) == 1 then
      if not closed then return 1 end
      give_back(KEYS[1], KEYS[6])
      return -1
    end
    if closed then return -1 end
    local left = -1
    if grouped then left = tonumber(redis.call('GET', KEYS[4]) or '-1') end
    local started = tonumber(redis.call('GET', KEYS[1]) or '0')
    local cap, per = capacity(KEYS[2], KEYS[3], ARGV[2], ARGV[3])
    local take, after = decide(left, tonumber(ARGV[4]), started, cap, per)
    if take < 0 then return 0 end
    if take > 0 then redis.call('INCRBY', KEYS[1], take) end
    if after ~= left then
      if left < 0 then redis.call('SET', KEYS[4], after, 'EX', ARGV[5])
      else redis.call('SET', KEYS[4], after, 'KEEPTTL') end
    end
    if has_job then redis.call('SET', KEYS[6], 1, 'EX', ARGV[5]) end
    return 1
    """
    # KEYS: started, current, per_version, group sizes, then per candidate its group's
    # reservation, closed mark, its own record and arq's in-progress mark; ARGV: unless_closed,
    # max_staleness, batch_size, how many to find, how many of the candidates lead as already
    # taken, then per candidate its group id ('' if none). Which candidates (1-based, not
    # counting the taken ones) admit would start now, in order, each one counted as started for
    # those after it. A candidate another worker runs (arq keeps it queued until it ends) is
    # counted like a taken one and never answered: arq's claim would skip it. Nothing is written.
    _ADMISSIBLE = _DECIDE + """
    local started = tonumber(redis.call('GET', KEYS[1]) or '0')
    local cap, per = capacity(KEYS[2], KEYS[3], ARGV[2], ARGV[3])
    local want, taken, found, lefts = tonumber(ARGV[4]), tonumber(ARGV[5]), {}, {}
    for c = 0, #ARGV - 6 do
      local gid, k = ARGV[6 + c], 5 + 4 * c
      local ok = redis.call('EXISTS', KEYS[k + 2]) == 1
        or (gid ~= '' and ARGV[1] == '1' and redis.call('EXISTS', KEYS[k + 1]) == 1)
      if not ok then
        local g, left = 1, -1
        if gid ~= '' then
          g = tonumber(redis.call('HGET', KEYS[4], gid) or '1')
          left = lefts[gid] or tonumber(redis.call('GET', KEYS[k]) or '-1')
        end
        local take, after = decide(left, g, started, cap, per)
        if take >= 0 then
          ok, started = true, started + take
          if gid ~= '' then lefts[gid] = after end
        end
      end
      if ok and c >= taken and redis.call('EXISTS', KEYS[k + 3]) == 0 then
        found[#found + 1] = c - taken + 1
        if #found >= want then break end
      end
    end
    return found
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
        self._admit = redis.register_script(self._ADMIT)
        self._admissible = redis.register_script(self._ADMISSIBLE)
        self._release = redis.register_script(self._RELEASE)
        self._forfeit = redis.register_script(self._FORFEIT)

    async def try_start(self, group_id: str | None = None, group_size: int = 1) -> bool:
        """Take a slot for one rollout; with `group_id` and `group_size` > 1, by group (see above)."""
        return await self.admit(group_id, group_size) == "started"

    async def admit(self, group_id: str | None = None, group_size: int = 1,
                    unless_closed: bool = False, job_id: str | None = None) -> Admitted:
        """try_start in one call that also answers "closed" (no slot taken) when `unless_closed`
        and the learner has closed `group_id`; "wait": no slot free yet. With `job_id` the job
        keeps its slot until `release_job` or `finished`, across its tries (see above)."""
        closed = self.keys.admission_closed(group_id or "")
        if not self.cfg.enabled:  # no bound: `started` is only a count (records as below)
            if unless_closed and group_id is not None and await self.redis.exists(closed):
                return "closed"
            if job_id is not None and await self.redis.exists(self.keys.admission_job(job_id)):
                return "started"
            pipe = self.redis.pipeline(transaction=True)
            pipe.incr(self.keys.admission_started)
            if job_id is not None:
                pipe.set(self.keys.admission_job(job_id), 1, ex=GROUP_TTL_S)
            await pipe.execute()
            return "started"
        got = await self._admit(
            keys=[self.keys.admission_started, self.keys.policy_current, self.keys.admission_per_version,
                  self.keys.admission_group(group_id or ""), closed, self.keys.admission_job(job_id or "")],
            args=["1" if unless_closed else "0", self.cfg.max_staleness, self.cfg.batch_size,
                  max(1, group_size), GROUP_TTL_S, "1" if group_id is not None else "0",
                  "1" if job_id is not None else "0"])
        return _OUTCOME[int(got)]

    async def admissible(self, jobs: list[tuple[str, str | None]], want: int, unless_closed: bool = False,
                         taken: list[tuple[str, str | None]] | None = None) -> list[int]:
        """Which of these queued jobs ((job id, group id), in queue order) `admit` would start
        now, at most `want` of them, each counted as started for the ones after it: an actor
        takes from the queue only jobs that can start, so none holds a job that waits while
        another could run (at max_staleness 0 a retried member of the batch would otherwise find
        every actor slot held by next-version jobs waiting for admission). `taken`: jobs the
        caller took that have not asked `admit` yet, counted first (and never answered, should
        they still be queued). Jobs another worker runs are counted where they stand and not
        answered (arq would not hand them out), so one call finds jobs this worker can claim. A
        group's size is the one `register_groups` recorded at enqueue (1 if none). Indices into
        `jobs`."""
        if want <= 0 or not jobs:
            return []
        if not self.cfg.enabled:
            return list(range(min(want, len(jobs))))
        taken = taken or []
        # the caller's own jobs are still queued (arq drops a job when it ends): counted once
        mine = {job_id for job_id, _ in taken}
        queued = [i for i, (job_id, _) in enumerate(jobs) if job_id not in mine]
        every = [*taken, *(jobs[i] for i in queued)]
        keys = [self.keys.admission_started, self.keys.policy_current, self.keys.admission_per_version,
                self.keys.group_sizes]
        for job_id, g in every:
            keys += [self.keys.admission_group(g or ""), self.keys.admission_closed(g or ""),
                     self.keys.admission_job(job_id), ARQ_IN_PROGRESS_PREFIX + job_id]
        found = await self._admissible(keys=keys, args=[
            "1" if unless_closed else "0", self.cfg.max_staleness, self.cfg.batch_size, want,
            len(taken), *(g or "" for _, g in every)])
        return [queued[int(i) - 1] for i in found]

    async def release_job(self, job_id: str) -> bool:
        """The job ended without trainable samples and will not run again (or its group was
        closed): its slot goes back, once (False: it held none)."""
        return await release_admitted(self.redis, self.keys, job_id)

    async def finished(self, job_id: str) -> None:
        """The job's samples were written: its slot stays taken; its record is dropped."""
        await self.redis.delete(self.keys.admission_job(job_id))

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


async def release_admitted(redis: aioredis.Redis, keys: Keys, job_id: str) -> bool:
    """The slot a job's tries held goes back, once (False: it held none): `Admission.release_job`,
    for a caller without an admission config (the arq wrapper, for a job whose every try died
    with its worker)."""
    return bool(await reply(redis.eval(_RELEASE_JOB, 2, keys.admission_started, keys.admission_job(job_id))))


async def register_groups(redis: aioredis.Redis, keys: Keys, sizes: dict[str, int]) -> None:
    """The enqueuer: each group's size, for `Admission.admissible` (admit takes it from the job)."""
    if sizes:
        await reply(redis.hset(keys.group_sizes, mapping=sizes))
