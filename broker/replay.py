"""The replay stream (owned here): actors XADD encoded samples; the learner reads them through
a consumer group, acknowledges after the step that used them, and claims its pending entries
after a restart. Undecodable entries go to a dead-letter stream and reading goes on. The
stream is trimmed only below what every consumer group has acknowledged."""

from __future__ import annotations

import time
from dataclasses import dataclass

import redis.asyncio as aioredis
from redis.exceptions import ResponseError

from broker.connection import reply
from broker.keys import Keys
from broker.wire import Sample, WireError, decode, encode
from common.logs import get_logger

log = get_logger("broker.replay")
FIELD = b"s"
RATE_BUCKET_S = 60
RATE_KEEP_BUCKETS = 60


@dataclass
class Entry:
    id: str
    sample: Sample


def _sid(x: bytes | str) -> str:
    return x.decode() if isinstance(x, bytes) else x


class ReplayWriter:
    def __init__(self, redis: aioredis.Redis, keys: Keys, batch: int = 32) -> None:
        self.redis, self.keys, self.batch = redis, keys, max(1, batch)

    async def add(self, samples: list[Sample], done_job: str | None = None) -> list[str]:
        """XADD in pipelined batches (one round trip per `batch` samples); returns stream ids.

        `done_job`: the episode's samples and its job's mark in jobs:done are one MULTI/EXEC, so
        "the samples reached the stream" and "the job is done" can never be told apart by a crash,
        a cancellation or a Redis error between two writes (a re-run then skips the job instead
        of writing its samples again, and no done job lacks its samples)."""
        ids: list[str] = []
        bucket = int(time.time()) // RATE_BUCKET_S
        chunks = ([samples] if done_job is not None else
                  [samples[i : i + self.batch] for i in range(0, len(samples), self.batch)])
        for chunk in chunks:
            pipe = self.redis.pipeline(transaction=done_job is not None)
            for s in chunk:
                pipe.xadd(self.keys.replay, {FIELD: encode(s)})
            pipe.hincrby(self.keys.stats, "samples_written", len(chunk))
            pipe.hincrby(self.keys.samples_rate, str(bucket), len(chunk))
            if done_job is not None:
                pipe.sadd(self.keys.jobs_done, done_job)
            res = await pipe.execute()
            ids.extend(_sid(x) for x in res[: len(chunk)])
        if bucket % 10 == 0:  # now and then, forget old rate buckets
            old = [str(b) for b in range(bucket - RATE_KEEP_BUCKETS - 10, bucket - RATE_KEEP_BUCKETS)]
            await reply(self.redis.hdel(self.keys.samples_rate, *old))
        return ids


class ReplayReader:
    def __init__(self, redis: aioredis.Redis, keys: Keys, group: str = "learner",
                 consumer: str = "learner-0") -> None:
        self.redis, self.keys, self.group, self.consumer = redis, keys, group, consumer

    async def ensure_group(self) -> None:
        try:
            await self.redis.xgroup_create(self.keys.replay, self.group, id="0", mkstream=True)
        except ResponseError as e:
            if "BUSYGROUP" not in str(e):
                raise

    async def _decode_all(self, raw: list[tuple[bytes, dict[bytes, bytes]]]) -> list[Entry]:
        out: list[Entry] = []
        dead: list[tuple[str, str, bytes]] = []
        for eid, fields in raw:
            sid = _sid(eid)
            if fields is None:  # deleted while pending
                dead.append((sid, "entry deleted from the stream", b""))
                continue
            data = fields.get(FIELD)
            try:
                if data is None:
                    raise WireError(f"field {FIELD.decode()!r} missing (fields: {sorted(_sid(k) for k in fields)})")
                out.append(Entry(sid, decode(data)))
            except WireError as e:
                dead.append((sid, str(e), data or b""))
        if dead:
            pipe = self.redis.pipeline(transaction=True)
            for sid, err, data in dead:
                pipe.xadd(self.keys.replay_dead, {"id": sid, "error": err, "data": data,
                                                  "group": self.group})
                pipe.xack(self.keys.replay, self.group, sid)
                pipe.hincrby(self.keys.stats, "samples_dead_lettered", 1)
            await pipe.execute()
            for sid, err, _ in dead:
                log.warning("dead_lettered", id=sid, error=err)
        return out

    async def read(self, count: int = 64, block_ms: int | None = 1000) -> list[Entry]:
        """New entries for this consumer (they stay pending until acked)."""
        res = await self.redis.xreadgroup(self.group, self.consumer, {self.keys.replay: ">"},
                                          count=count, block=block_ms)
        if not res:
            return []
        _, raw = res[0]
        return await self._decode_all(raw)

    async def claim_pending(self, min_idle_ms: int = 0, count: int = 256) -> list[Entry]:
        """Take over every pending entry idle >= min_idle_ms (ours after a restart, or a dead
        consumer's), following XAUTOCLAIM's cursor to the end."""
        out: list[Entry] = []
        cursor = "0-0"
        while True:
            res = await self.redis.xautoclaim(self.keys.replay, self.group, self.consumer,
                                              min_idle_time=min_idle_ms, start_id=cursor, count=count)
            cursor, raw = _sid(res[0]), res[1]
            deleted = res[2] if len(res) > 2 else []
            raw = list(raw) + [(d, None) for d in deleted]
            out.extend(await self._decode_all(raw))
            if cursor == "0-0":
                return out

    async def ack(self, ids: list[str]) -> None:
        if ids:
            await self.redis.xack(self.keys.replay, self.group, *ids)

    async def trim_acked(self) -> int:
        """XTRIM MINID to the oldest entry some group still needs; returns entries removed."""
        groups = await self.redis.xinfo_groups(self.keys.replay)
        if not groups:
            return 0
        floor: tuple[int, int] | None = None
        for g in groups:
            name = _sid(g["name"])
            last = _parse_id(_sid(g["last-delivered-id"]))
            need = (last[0], last[1] + 1)  # everything up to last-delivered is delivered
            if g["pending"]:
                summary = await self.redis.xpending(self.keys.replay, name)
                need = min(need, _parse_id(_sid(summary["min"])))
            floor = need if floor is None else min(floor, need)
        if floor is None or floor == (0, 1):
            return 0
        return int(await self.redis.xtrim(self.keys.replay, minid=f"{floor[0]}-{floor[1]}", approximate=False))


def _parse_id(sid: str) -> tuple[int, int]:
    ms, _, seq = sid.partition("-")
    return int(ms), int(seq or 0)
