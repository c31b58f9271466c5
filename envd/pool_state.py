"""The lease pool's state in Redis (Keys.pool_nodes, pool_leases, pool_lease, pool_load) and the
Lua scripts that change it.

All state lives here, so the pool can restart or run as several processes without losing or
leaking a container. Capacity is reserved by one Lua script: it checks the overall cap (the
lease count) and the per-node cap (pool_load, each node's lease count, which the reserve and
release scripts keep in step with the leases) and picks the least-loaded healthy active node,
so two pools never exceed the caps together. Every key a script touches comes in KEYS (one hash
slot: the run id is a hash tag). An expired lease is claimed by whichever process removes it
from the sorted set first (ZREM is the claim). The scheduler and HTTP app over this state are
envd/pool.py.
"""

from __future__ import annotations

import json
import time
from typing import Any

import redis.asyncio as aioredis

from broker.config import RedisConfig
from broker.connection import connect, reply
from broker.keys import Keys
from envd.config import PoolConfig

# KEYS: nodes hash, leases zset, load hash, the new lease's hash, the image's nodes hash.
# ARGV: lease_id, now, expiry, max_total, max_per_node, stale_s, image, instance_id, owner,
#       affinity (1/0), pulling_stale_s.
# Placement: among healthy active nodes under the per-node cap, one that holds the image
# (`ready`, or `pulling` since less than pulling_stale_s) wins; ties and the rest go to the
# least loaded. A node chosen without the image is marked `pulling`, so the leases that follow
# in the same burst join its pull instead of starting one elsewhere.
_RESERVE = """
if redis.call('ZCARD', KEYS[2]) >= tonumber(ARGV[4]) then return {'full', 'all ' .. ARGV[4] .. ' leases in use'} end
local now, stale, cap = tonumber(ARGV[2]), tonumber(ARGV[6]), tonumber(ARGV[5])
local affinity, pulling_stale = ARGV[10] == '1', tonumber(ARGV[11])
local nodes = redis.call('HGETALL', KEYS[1])
local best, best_load, best_has, best_id, eligible = nil, nil, false, nil, 0
for i = 1, #nodes, 2 do
  local info = cjson.decode(nodes[i + 1])
  if info.state == 'active' and info.healthy == true and now - (info.checked or 0) <= stale then
    eligible = eligible + 1
    local l = tonumber(redis.call('HGET', KEYS[3], nodes[i]) or '0')
    if l < cap then
      local has = false
      local nid = info.node_id
      if affinity and type(nid) == 'string' and nid ~= '' then
        local v = redis.call('HGET', KEYS[5], nid)
        if v == 'ready' then has = true
        elseif v and string.sub(v, 1, 8) == 'pulling:' then
          has = now - (tonumber(string.sub(v, 9)) or 0) <= pulling_stale
        end
      end
      if best == nil or (has and not best_has) or (has == best_has and l < best_load) then
        best, best_load, best_has, best_id = nodes[i], l, has, nid
      end
    end
  end
end
if best == nil then
  if eligible == 0 then return {'no_nodes', 'no healthy active node'} end
  return {'full', 'every healthy node has ' .. ARGV[5] .. ' leases'}
end
if affinity and not best_has and type(best_id) == 'string' and best_id ~= '' then
  redis.call('HSET', KEYS[5], best_id, 'pulling:' .. ARGV[2])
end
redis.call('HSET', KEYS[4], 'node_url', best, 'state', 'creating', 'container_id', '',
           'image', ARGV[7], 'instance_id', ARGV[8], 'owner', ARGV[9], 'created', ARGV[2])
redis.call('ZADD', KEYS[2], ARGV[3], ARGV[1])
redis.call('HINCRBY', KEYS[3], best, 1)
return {'ok', best}
"""

# KEYS: nodes hash, the image's nodes hash.  ARGV: node url.
# A create that failed on a node leaves no `pulling` mark there (a `ready` one stays).
_UNMARK_PULLING = """
local v = redis.call('HGET', KEYS[1], ARGV[1])
if not v then return 0 end
local nid = cjson.decode(v).node_id
if type(nid) ~= 'string' or nid == '' then return 0 end
local mark = redis.call('HGET', KEYS[2], nid)
if mark and string.sub(mark, 1, 8) == 'pulling:' then redis.call('HDEL', KEYS[2], nid) return 1 end
return 0
"""

# KEYS: leases zset, lease hash, load hash.  ARGV: lease_id.
# Whoever removes the lease from the set owns its cleanup.
_RELEASE = """
if redis.call('ZREM', KEYS[1], ARGV[1]) == 0 then return nil end
local node = redis.call('HGET', KEYS[2], 'node_url')
local h = redis.call('HGETALL', KEYS[2])
redis.call('DEL', KEYS[2])
if node and redis.call('HINCRBY', KEYS[3], node, -1) <= 0 then redis.call('HDEL', KEYS[3], node) end
return h
"""

# KEYS: nodes hash.  ARGV: url, healthy (0/1), checked, error, running, node_id ('' = unknown).
_HEALTH = """
local v = redis.call('HGET', KEYS[1], ARGV[1])
if not v then return 0 end
local info = cjson.decode(v)
info.healthy = ARGV[2] == '1'
info.checked = tonumber(ARGV[3])
info.error = ARGV[4]
info.running = tonumber(ARGV[5])
if ARGV[6] ~= '' then info.node_id = ARGV[6] end
redis.call('HSET', KEYS[1], ARGV[1], cjson.encode(info))
return 1
"""

# KEYS: nodes hash.  ARGV: url, state, now, create (1: add when absent).
_SET_STATE = """
local v = redis.call('HGET', KEYS[1], ARGV[1])
local info
if v then info = cjson.decode(v)
elseif ARGV[4] == '1' then info = {added = tonumber(ARGV[3]), healthy = false, checked = 0, error = '', running = 0}
else return 0 end
info.state = ARGV[2]
redis.call('HSET', KEYS[1], ARGV[1], cjson.encode(info))
return 1
"""

# KEYS: nodes hash, load hash.  ARGV: url.  A draining node leaves once no lease is on it.
_FORGET_DRAINED = """
local v = redis.call('HGET', KEYS[1], ARGV[1])
if not v or cjson.decode(v).state ~= 'draining' then return 0 end
if tonumber(redis.call('HGET', KEYS[2], ARGV[1]) or '0') > 0 then return 0 end
redis.call('HDEL', KEYS[1], ARGV[1])
return 1
"""

# KEYS: leases zset, lease hash.  ARGV: lease_id, container_id.
_ACTIVATE = """
if not redis.call('ZSCORE', KEYS[1], ARGV[1]) then return 0 end
redis.call('HSET', KEYS[2], 'container_id', ARGV[2], 'state', 'active')
return 1
"""


def _s(v: bytes | str) -> str:
    return v.decode() if isinstance(v, bytes) else v


class PoolState:
    """The pool's Redis state; every change is one command or one Lua script."""

    def __init__(self, redis: aioredis.Redis, keys: Keys, pcfg: PoolConfig) -> None:
        self.redis = redis
        self.keys = keys
        self.pcfg = pcfg
        self._reserve = redis.register_script(_RESERVE)
        self._release = redis.register_script(_RELEASE)
        self._health = redis.register_script(_HEALTH)
        self._set_state = redis.register_script(_SET_STATE)
        self._forget_drained = redis.register_script(_FORGET_DRAINED)
        self._activate = redis.register_script(_ACTIVATE)
        self._unmark_pulling = redis.register_script(_UNMARK_PULLING)

    @classmethod
    async def open(cls, pcfg: PoolConfig, redis: RedisConfig, keys: Keys) -> PoolState:
        """`redis.url` must be set."""
        assert redis.url, "the pool needs a Redis URL"
        return cls(connect(redis.url, redis), keys, pcfg)

    async def close(self) -> None:
        await self.redis.aclose()

    # -- nodes ---------------------------------------------------------------------
    async def add_node(self, url: str, only_if_absent: bool = False) -> None:
        if only_if_absent and await reply(self.redis.hexists(self.keys.pool_nodes, url)):
            return
        await self._set_state(keys=[self.keys.pool_nodes], args=[url, "active", time.time(), 1])

    async def drain_node(self, url: str) -> bool:
        return bool(await self._set_state(keys=[self.keys.pool_nodes], args=[url, "draining", time.time(), 0]))

    async def nodes(self) -> dict[str, dict[str, Any]]:
        raw = await reply(self.redis.hgetall(self.keys.pool_nodes))
        return {_s(k): json.loads(v) for k, v in raw.items()}

    async def set_health(self, url: str, healthy: bool, error: str = "", running: int = 0,
                         node_id: str = "") -> None:
        await self._health(keys=[self.keys.pool_nodes],
                           args=[url, 1 if healthy else 0, time.time(), error, running, node_id])

    async def forget_drained(self, url: str) -> bool:
        """Drop a draining node that has no lease left; False when it is not (yet) such a node."""
        return bool(await self._forget_drained(keys=[self.keys.pool_nodes, self.keys.pool_load], args=[url]))

    async def load(self) -> dict[str, int]:
        """node url -> leases on it (nodes without any are absent)."""
        raw = await reply(self.redis.hgetall(self.keys.pool_load))
        return {_s(k): int(v) for k, v in raw.items()}

    # -- leases --------------------------------------------------------------------
    async def reserve(self, lease_id: str, image: str, instance_id: str, owner: str) -> tuple[str, str]:
        """('ok', node url) or (reason, detail); with pool.image_affinity a node holding (or
        pulling) `image` is preferred while it has room."""
        now = time.time()
        status, detail = await self._reserve(
            keys=[self.keys.pool_nodes, self.keys.pool_leases, self.keys.pool_load,
                  self.keys.pool_lease(lease_id), self.keys.image_nodes(image)],
            args=[lease_id, now, now + self.pcfg.lease_ttl_s, self.pcfg.max_concurrent,
                  self.pcfg.max_per_node, self.pcfg.health_stale_s, image, instance_id, owner,
                  1 if self.pcfg.image_affinity else 0, self.pcfg.pulling_stale_s])
        return _s(status), _s(detail)

    async def unmark_pulling(self, url: str, image: str) -> bool:
        """Drop the `pulling` mark the reserve script left on node `url` for `image`."""
        return bool(await self._unmark_pulling(keys=[self.keys.pool_nodes, self.keys.image_nodes(image)],
                                               args=[url]))

    async def activate(self, lease_id: str, container_id: str) -> bool:
        """Record the lease's container; False when the lease was reaped meanwhile."""
        return bool(await self._activate(keys=[self.keys.pool_leases, self.keys.pool_lease(lease_id)],
                                         args=[lease_id, container_id]))

    async def lease(self, lease_id: str) -> dict[str, str] | None:
        """A live lease's fields (with `expires`), or None when unknown or expired."""
        pipe = self.redis.pipeline(transaction=False)
        pipe.zscore(self.keys.pool_leases, lease_id)
        pipe.hgetall(self.keys.pool_lease(lease_id))
        score, h = await pipe.execute()
        if score is None or not h or float(score) <= time.time():
            return None
        return {**{_s(k): _s(v) for k, v in h.items()}, "expires": str(score)}

    async def renew(self, lease_id: str) -> float:
        expiry = time.time() + self.pcfg.lease_ttl_s
        await self.redis.zadd(self.keys.pool_leases, {lease_id: expiry}, xx=True, gt=True)
        return expiry

    async def release(self, lease_id: str) -> dict[str, str] | None:
        """Remove a lease; its fields when this call removed it, None when it was gone."""
        flat = await self._release(keys=[self.keys.pool_leases, self.keys.pool_lease(lease_id),
                                         self.keys.pool_load], args=[lease_id])
        if flat is None:
            return None
        return {_s(flat[i]): _s(flat[i + 1]) for i in range(0, len(flat), 2)}

    async def expired(self) -> list[str]:
        return [_s(m) for m in await self.redis.zrangebyscore(self.keys.pool_leases, "-inf", time.time())]

    async def lease_ids(self) -> list[str]:
        return [_s(m) for m in await self.redis.zrange(self.keys.pool_leases, 0, -1)]

    async def count(self) -> int:
        return int(await self.redis.zcard(self.keys.pool_leases))
