"""Registries (owned here): policy versions, inference servers (with episode pins), actors.

Timestamps come from Redis's own clock (TIME inside Lua), so hosts with skewed clocks agree on
what is fresh. Every multi-key change is one Lua call.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any, Literal

import redis.asyncio as aioredis
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from broker.connection import reply
from broker.keys import ACTOR_TTL_S, PIN_TTL_S, SERVER_TTL_S, Keys

SERVER_STATES = ("starting", "ready", "draining", "updating", "failed")
# What a server is for: "policy" serves the trained policy (pinned by actors, updated by weight
# sync); "prm" serves a process reward model's judge; "eval" serves the versions an eval worker
# loads into it (actors.eval_worker). Only policy servers are pinned or updated by weight sync.
ROLES = ("policy", "prm", "eval")
Role = Literal["policy", "prm", "eval"]


class ServerMeta(BaseModel):
    """What an inference server registers about itself (the `meta` field of its hash). Every
    registrar writes it and every reader validates it with this one model."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["swarl-cpu", "sglang", "scripted"] = Field(
        description="swarl's CPU server, a real SGLang server, or the scripted policy server.")
    model: str = Field("", description="The model path the server started from.")
    tp_size: int = Field(1, ge=1, description="Tensor-parallel ranks: a weight-update group gets one "
                         "receiving rank per tensor-parallel rank of the server.")
    role: Role = Field("policy", description="policy: the trained policy (pinned by actors, updated "
                       "by weight sync); prm: a process reward model's judge (neither); eval: loaded "
                       "by an eval worker with the version it evaluates (neither).")

    @model_validator(mode="after")
    def _sglang_names_its_tp_size(self) -> ServerMeta:
        if self.kind == "sglang" and "tp_size" not in self.model_fields_set:
            raise ValueError("tp_size: an SGLang server must register its tensor-parallel size "
                             "(the weight-update group's world size depends on it)")
        return self


def _s(x: Any) -> str:
    return x.decode() if isinstance(x, bytes) else ("" if x is None else str(x))


class PolicyRegistry:
    """Current policy version and one manifest per published version."""

    _PUBLISH = """
    redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
    local cur = tonumber(redis.call('GET', KEYS[1]) or '0')
    if tonumber(ARGV[1]) > cur then redis.call('SET', KEYS[1], ARGV[1]) end
    return tonumber(redis.call('GET', KEYS[1]) or '0')
    """

    def __init__(self, redis: aioredis.Redis, keys: Keys) -> None:
        self.redis, self.keys = redis, keys
        self._publish = redis.register_script(self._PUBLISH)

    async def current(self) -> int:
        v = await self.redis.get(self.keys.policy_current)
        return int(v) if v is not None else 0

    async def publish(self, version: int, manifest: dict[str, Any]) -> int:
        """Store the manifest and raise current to `version` (never lowers it)."""
        doc = {"version": version, **manifest}
        return int(await self._publish(keys=[self.keys.policy_current, self.keys.policy_manifests],
                                       args=[version, json.dumps(doc)]))

    async def manifest(self, version: int) -> dict[str, Any] | None:
        raw = await reply(self.redis.hget(self.keys.policy_manifests, str(version)))
        return json.loads(raw) if raw else None

    async def manifests(self) -> dict[int, dict[str, Any]]:
        raw = await reply(self.redis.hgetall(self.keys.policy_manifests))
        return {int(_s(k)): json.loads(v) for k, v in sorted(raw.items(), key=lambda kv: int(_s(kv[0])))}

    async def delete_manifest(self, version: int) -> None:
        await reply(self.redis.hdel(self.keys.policy_manifests, str(version)))


@dataclass
class ServerInfo:
    id: str
    url: str
    version: int | None
    state: str
    heartbeat: float
    pins: int = 0
    error: str = ""
    meta: ServerMeta | None = None  # None: missing or invalid (meta_error says why)
    meta_error: str = ""
    age_s: float = 0.0
    role: str = "policy"  # the hash's own `role` field: known even when meta is invalid
    lease_left_s: float | None = None  # a coordinator's drain/update lease: seconds left (< 0: lapsed)

    @property
    def alive(self) -> bool:
        return self.age_s <= SERVER_TTL_S

    @property
    def lapsed(self) -> bool:
        """Drained or being updated by a coordinator that stopped renewing its lease (it died):
        pinned as if ready, and taken over by the next coordinator."""
        return (self.state in ("draining", "updating") and self.lease_left_s is not None
                and self.lease_left_s < 0)


def _now_lua() -> str:
    return "local t = redis.call('TIME'); local now = tonumber(t[1]) + tonumber(t[2]) / 1e6\n"


class ServerRegistry:
    """Inference servers: url, version, state, heartbeat; pins = episodes bound to a server."""

    # KEYS: the server set, the server's hash. ARGV: id, beat (1: refresh the heartbeat),
    # create (1: register; 0: update only an entry that exists, so an update after the entry
    # vanished, e.g. Redis restarted empty, never leaves a half entry), then field/value pairs.
    # A `lease_s` pair is stored as `lease_until` = now + lease_s ('' clears it).
    _UPSERT = _now_lua() + """
    if ARGV[3] ~= '1' and redis.call('HEXISTS', KEYS[2], 'url') == 0 then return 0 end
    redis.call('SADD', KEYS[1], ARGV[1])
    for i = 4, #ARGV, 2 do
      if ARGV[i] == 'lease_s' then
        local until_ = ''
        if ARGV[i + 1] ~= '' then until_ = tostring(now + tonumber(ARGV[i + 1])) end
        redis.call('HSET', KEYS[2], 'lease_until', until_)
      else
        redis.call('HSET', KEYS[2], ARGV[i], ARGV[i + 1])
      end
    end
    if ARGV[2] == '1' then redis.call('HSET', KEYS[2], 'heartbeat', tostring(now)) end
    return 1
    """
    # KEYS[1]: the server set; then per candidate i: KEYS[2i] its hash, KEYS[2i+1] its pins.
    # ARGV: pin_id, min_version, ttl_s, stale_s, then the candidates' ids in the same order.
    # A server the weight-sync coordinator drained or was updating under a lease that lapsed
    # (the coordinator died: the learner was killed mid-publish) serves again at the version it
    # reports: a drain is never left standing forever.
    _PIN = _now_lua() + """
    local pin_id, min_v = ARGV[1], tonumber(ARGV[2])
    local ttl, stale = tonumber(ARGV[3]), tonumber(ARGV[4])
    local best, best_pins, best_v, best_n = nil, nil, -1, 0
    for i = 5, #ARGV do
      local id, h, pk = ARGV[i], KEYS[2 * (i - 4)], KEYS[2 * (i - 4) + 1]
      if redis.call('SISMEMBER', KEYS[1], id) == 1 then
        local f = redis.call('HMGET', h, 'state', 'version', 'heartbeat', 'role', 'lease_until')
        local policy = (not f[4]) or f[4] == 'policy'
        local lapsed = (f[1] == 'draining' or f[1] == 'updating') and f[5] and f[5] ~= ''
                       and tonumber(f[5]) < now
        if policy and (f[1] == 'ready' or lapsed) and f[2] and f[2] ~= '' and tonumber(f[3] or '0') >= now - stale then
          local v = tonumber(f[2])
          if v and v >= min_v then
            redis.call('ZREMRANGEBYSCORE', pk, '-inf', now)
            local n = redis.call('ZCARD', pk)
            if best == nil or v > best_v or (v == best_v and n < best_n) then
              best, best_pins, best_v, best_n = id, pk, v, n
            end
          end
        end
      end
    end
    if best == nil then return false end
    redis.call('ZADD', best_pins, now + ttl, pin_id)
    return best
    """
    _RENEW = _now_lua() + """
    redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
    return redis.call('ZADD', KEYS[1], 'XX', 'CH', now + tonumber(ARGV[2]), ARGV[1])
    """
    _COUNT = _now_lua() + """
    redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
    return redis.call('ZCARD', KEYS[1])
    """
    # KEYS[1]: the server set; then per server i: KEYS[2i] its hash, KEYS[2i+1] its pins.
    # ARGV: the servers' ids in the same order.
    _LIST = _now_lua() + """
    local out = {}
    for i = 1, #ARGV do
      local h, pk = KEYS[2 * i], KEYS[2 * i + 1]
      if redis.call('SISMEMBER', KEYS[1], ARGV[i]) == 1 then
        redis.call('ZREMRANGEBYSCORE', pk, '-inf', now)
        table.insert(out, {ARGV[i], redis.call('HGETALL', h), redis.call('ZCARD', pk)})
      end
    end
    return {tostring(now), out}
    """

    def __init__(self, redis: aioredis.Redis, keys: Keys) -> None:
        self.redis, self.keys = redis, keys
        self._upsert = redis.register_script(self._UPSERT)
        self._pin = redis.register_script(self._PIN)
        self._renew = redis.register_script(self._RENEW)
        self._count = redis.register_script(self._COUNT)
        self._list = redis.register_script(self._LIST)

    def _server_keys(self, ids: list[str]) -> list[str]:
        out = [self.keys.servers]
        for sid in ids:
            out += [self.keys.server(sid), self.keys.server_pins(sid)]
        return out

    async def _ids(self) -> list[str]:
        return sorted(_s(x) for x in await reply(self.redis.smembers(self.keys.servers)))

    async def _set(self, server_id: str, beat: bool, create: bool, **fields: Any) -> bool:
        """Write fields; only the server's own calls (beat=True) refresh its heartbeat, so a dead
        server that the coordinator marks failed still goes stale on time. Without `create`,
        False (and nothing written) when the server has no entry."""
        args: list[Any] = [server_id, "1" if beat else "0", "1" if create else "0"]
        for k, v in fields.items():
            if v is not None:
                args += [k, str(v)]
        return bool(await self._upsert(keys=[self.keys.servers, self.keys.server(server_id)], args=args))

    async def register(self, server_id: str, url: str, version: int | None, *, meta: ServerMeta,
                       state: str = "starting") -> None:
        _check_state(state)
        await self._set(server_id, True, True, url=url, version="" if version is None else version,
                        state=state, error="", meta=meta.model_dump_json(), role=meta.role,
                        host=socket.gethostname(), lease_s="")

    async def heartbeat(self, server_id: str, version: int | None = None, state: str | None = None) -> bool:
        """False when the server has no entry (it must register again)."""
        if state is not None:
            _check_state(state)
        return await self._set(server_id, True, False, version=version, state=state)

    async def set_state(self, server_id: str, state: str, version: int | None = None, error: str = "",
                        lease_s: float | None = None) -> bool:
        """False when the server has no entry (left, or its entry was lost): nothing is written.
        `lease_s` (the weight-sync coordinator's draining/updating): the state holds only while
        renewed (renew_lease) within that many seconds; without it any lease is cleared."""
        _check_state(state)
        return await self._set(server_id, False, False, state=state, version=version, error=error,
                               lease_s="" if lease_s is None else lease_s)

    async def renew_lease(self, server_id: str, lease_s: float) -> bool:
        return await self._set(server_id, False, False, lease_s=lease_s)

    async def list(self, alive_only: bool = False, role: Role | None = None) -> list[ServerInfo]:
        """Every registered server (`role`: only those of that role)."""
        ids = await self._ids()
        now_raw, rows = await self._list(keys=self._server_keys(ids), args=ids)
        now = float(_s(now_raw))
        out = []
        for sid, flat, pins in rows:
            h = {_s(flat[i]): _s(flat[i + 1]) for i in range(0, len(flat), 2)}
            if not h:
                continue
            info = _server_info(_s(sid), h, int(pins), now)
            if role is not None and info.role != role:
                continue
            if info.alive or not alive_only:
                out.append(info)
        return sorted(out, key=lambda s: s.id)

    async def get(self, server_id: str) -> ServerInfo | None:
        for s in await self.list():
            if s.id == server_id:
                return s
        return None

    async def remove(self, server_id: str) -> None:
        pipe = self.redis.pipeline(transaction=True)
        pipe.srem(self.keys.servers, server_id)
        pipe.delete(self.keys.server(server_id), self.keys.server_pins(server_id))
        await pipe.execute()

    async def pin(self, pin_id: str, min_version: int = 0, ttl_s: float = PIN_TTL_S,
                  exclude: Collection[str] = ()) -> ServerInfo | None:
        """Bind an episode to the ready policy server with the newest version (>= min_version),
        then the fewest live pins. None when no server qualifies (a prm server never does).
        `exclude`: servers the caller just found unreachable (still fresh in the registry)."""
        ids = [i for i in await self._ids() if i not in exclude]
        sid = await self._pin(keys=self._server_keys(ids),
                              args=[pin_id, min_version, ttl_s, SERVER_TTL_S, *ids])
        if not sid:
            return None
        return await self.get(_s(sid))

    async def renew_pin(self, server_id: str, pin_id: str, ttl_s: float = PIN_TTL_S) -> bool:
        """Extend a live pin; False when it had already lapsed (the holder must re-pin)."""
        return bool(await self._renew(keys=[self.keys.server_pins(server_id)], args=[pin_id, ttl_s]))

    async def unpin(self, server_id: str, pin_id: str) -> None:
        await self.redis.zrem(self.keys.server_pins(server_id), pin_id)

    async def pin_count(self, server_id: str) -> int:
        return int(await self._count(keys=[self.keys.server_pins(server_id)]))


def _check_state(state: str) -> None:
    if state not in SERVER_STATES:
        raise ValueError(f"server state {state!r} not one of {SERVER_STATES}")


def _server_info(sid: str, h: dict[str, str], pins: int, now: float) -> ServerInfo:
    hb = float(h.get("heartbeat") or 0)
    ver = h.get("version", "")
    meta, meta_error = None, ""
    try:
        meta = ServerMeta.model_validate_json(h.get("meta") or "")
    except ValidationError as e:
        meta_error = "; ".join(".".join(["meta", *map(str, x["loc"])]) + f": {x['msg']}"
                               for x in e.errors())
    return ServerInfo(
        id=sid, url=h.get("url", ""), version=int(ver) if ver.lstrip("-").isdigit() else None,
        state=h.get("state", "starting"), heartbeat=hb, pins=pins, error=h.get("error", ""),
        meta=meta, meta_error=meta_error, age_s=max(0.0, now - hb),
        role=h.get("role") or (meta.role if meta is not None else "policy"),
        lease_left_s=float(h["lease_until"]) - now if h.get("lease_until") else None,
    )


class ActorRegistry:
    """Actor processes: a hash per actor that expires unless heartbeated."""

    def __init__(self, redis: aioredis.Redis, keys: Keys) -> None:
        self.redis, self.keys = redis, keys

    async def register(self, actor_id: str, host: str, pid: int, concurrency: int) -> None:
        now = await self._now()
        pipe = self.redis.pipeline(transaction=True)
        pipe.sadd(self.keys.actors, actor_id)
        pipe.hset(self.keys.actor(actor_id), mapping={
            "host": host, "pid": pid, "concurrency": concurrency, "started": now,
            "heartbeat": now, "running": 0, "totals": "{}"})
        pipe.expire(self.keys.actor(actor_id), ACTOR_TTL_S)
        await pipe.execute()

    async def heartbeat(self, actor_id: str, running: int, totals: dict[str, Any]) -> None:
        now = await self._now()
        pipe = self.redis.pipeline(transaction=True)
        pipe.sadd(self.keys.actors, actor_id)
        pipe.hset(self.keys.actor(actor_id), mapping={
            "heartbeat": now, "running": running, "totals": json.dumps(totals)})
        pipe.expire(self.keys.actor(actor_id), ACTOR_TTL_S)
        await pipe.execute()

    async def remove(self, actor_id: str) -> None:
        pipe = self.redis.pipeline(transaction=True)
        pipe.srem(self.keys.actors, actor_id)
        pipe.delete(self.keys.actor(actor_id))
        await pipe.execute()

    async def list(self) -> list[dict[str, Any]]:
        ids = sorted(_s(x) for x in await reply(self.redis.smembers(self.keys.actors)))
        out, gone = [], []
        for aid in ids:
            h = {_s(k): _s(v) for k, v in (await reply(self.redis.hgetall(self.keys.actor(aid)))).items()}
            if not h:
                gone.append(aid)  # TTL ran out: the actor died without deregistering
                continue
            out.append({"id": aid, "host": h.get("host"), "pid": int(h.get("pid") or 0),
                        "concurrency": int(h.get("concurrency") or 0),
                        "running": int(h.get("running") or 0),
                        "heartbeat": float(h.get("heartbeat") or 0),
                        "totals": json.loads(h.get("totals") or "{}")})
        if gone:
            await reply(self.redis.srem(self.keys.actors, *gone))
        return out

    async def _now(self) -> float:
        sec, usec = await self.redis.time()
        return sec + usec / 1e6
