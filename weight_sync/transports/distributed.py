"""The distributed transport: the version's tensors, held in memory, are broadcast from the
learner (rank 0) over a weight-update group of the server's own (NCCL on GPU, gloo on CPU).

The broadcast is collective over a group's members, so every server gets a group of its own
(rank 0 plus that server's tensor-parallel ranks): each server is drained and updated on its
own, as with the disk transport, and a slow or dead server cannot hold a collective for the
others. A group is made at the server's first update over this transport and kept; it is
dropped (on both sides) when the server leaves, restarts or fails, and made again at its next
update. A server joins a group only once it is serving: a server that registers mid-run is
first loaded from disk.

Every load runs in a weight-update session (update_group.session: begin answered before any
collective, end on every way out). A group's name is unique per learner start and per group
(`swarl-<run>-<server>-<start nonce>-<n>`), and the name is recorded per server in Redis
(Keys.weight_groups) before the server joins: a learner killed without destroying its group
leaves the record, and the next learner destroys that group on the server before it makes
its own, so stale groups neither collide with new ones nor pile up.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import re
import secrets
from collections.abc import Iterable
from dataclasses import dataclass

import redis.asyncio as aioredis
import torch

from broker.connection import reply
from broker.registry import ServerInfo
from common.logs import get_logger
from weight_sync.config import WeightSyncConfig
from weight_sync.protocols import ServerClient, VersionRefused
from weight_sync.update_group import UpdateGroup, resolve_backend, send_device, session

log = get_logger("weight_sync")


@dataclass
class Snapshot:
    """A version's tensors held in memory until every live server has it."""

    version: int
    tensors: list[tuple[str, torch.Tensor]]
    device: str = "cpu"  # where the learner's tensors lived (the backend: update_group.resolve_backend)

    @classmethod
    def take(cls, version: int, named: Iterable[tuple[str, torch.Tensor]]) -> Snapshot:
        """Copies on the CPU: the learner may train on at once, and no GPU memory is held for
        the length of a rollout (NCCL sends move one bucket at a time back to the GPU)."""
        out, device = [], "cpu"
        for n, t in named:
            if t.device.type != "cpu":
                device = t.device.type
            out.append((n, t.detach().to("cpu", copy=True)))
        return cls(version, out, device)


class DistributedTransport:
    """Holds the newest offered snapshot and one UpdateGroup per server. A server's group
    needs its tensor-parallel size, read from its registered meta: the coordinator sends a
    server without valid meta to the disk transport instead (see Coordinator).
    `redis` and `groups_key` (Keys.weight_groups) keep the record of each server's group."""

    name = "distributed"
    sets_version = True

    def __init__(self, cfg: WeightSyncConfig, run_id: str, redis: aioredis.Redis | None = None,
                 groups_key: str | None = None) -> None:
        self.cfg, self.run_id = cfg, run_id
        self.redis, self.groups_key = redis, groups_key
        self.snapshot: Snapshot | None = None
        self.groups: dict[str, UpdateGroup] = {}
        self.nonce = secrets.token_hex(4)  # this learner start's: no name is ever reused
        self._serial = itertools.count(1)
        self.backend = resolve_backend(cfg.backend)

    @property
    def held(self) -> int | None:
        """The version held in memory, if any."""
        return self.snapshot.version if self.snapshot is not None else None

    def offer(self, snap: Snapshot) -> bool:
        """Hold `snap` unless a newer version is held already; True when taken."""
        if self.snapshot is not None and snap.version < self.snapshot.version:
            return False
        self.snapshot = snap
        return True

    def release(self) -> None:
        """Every live server has the version (or a newer one is on disk): servers that come
        later load it from disk."""
        self.snapshot = None

    async def newest(self) -> int | None:
        return self.held

    async def prepare(self, version: int) -> Snapshot:
        snap = self.snapshot
        if snap is None or snap.version != version:
            raise VersionRefused(f"version {version} is not held in memory (held: {self.held})")
        return snap

    async def load(self, server: ServerInfo, client: ServerClient, version: int,
                   payload: Snapshot) -> int:
        """begin_weight_update (answered before any collective) → the group (made at the
        server's first update) → every bucket → end_weight_update."""
        async with session(client, server.id, self.cfg.begin_timeout_s):
            group = self.groups.get(server.id)
            if group is None:
                group = await self._connect(server, client)
            return await group.send(payload.tensors, version, int(self.cfg.bucket_mb * (1 << 20)))

    def group_name(self, server_id: str) -> str:
        raw = f"swarl-{self.run_id}-{server_id}-{self.nonce}-{next(self._serial)}"
        return re.sub(r"[^A-Za-z0-9_.-]", "_", raw)

    async def _connect(self, server: ServerInfo, client: ServerClient) -> UpdateGroup:
        if server.meta is None:  # the coordinator never sends one here: refuse to guess a size
            raise RuntimeError(f"server {server.id}: no valid meta ({server.meta_error or 'missing'}); "
                               "its tensor-parallel size, the group's world size, is unknown")
        group = UpdateGroup(
            name=self.group_name(server.id), members=[server.id], clients=[client],
            tp_sizes=[server.meta.tp_size], backend=self.backend,
            master_address=self.cfg.master_address, timeout_s=self.cfg.group_timeout_s,
            device=send_device(self.backend), prefix_store=self.cfg.group_store_prefix)
        await self._destroy_stale(server.id, client)
        await self._record(server.id, group.name)
        self.groups[server.id] = group  # from here on forget() destroys it, whatever happens
        await group.connect()
        return group

    async def _destroy_stale(self, server_id: str, client: ServerClient) -> None:
        """Destroy, on the server, the group recorded for it by a learner that is gone (a
        server that does not know the name, e.g. restarted since, answers no harm)."""
        if self.redis is None or self.groups_key is None:
            return
        stale = await reply(self.redis.hget(self.groups_key, server_id))
        if not stale:
            return
        name = stale.decode() if isinstance(stale, bytes) else str(stale)
        try:
            ans = await asyncio.wait_for(client.destroy_weights_update_group(group_name=name), 10)
            log.info("stale_group_destroyed", server=server_id, group=name,
                     answer=ans.get("message") if isinstance(ans, dict) else ans)
        except Exception as e:  # the server may be busy or gone; the name never collides anyway
            log.warning("stale_group_destroy_failed", server=server_id, group=name, error=repr(e))
        await reply(self.redis.hdel(self.groups_key, server_id))

    async def _record(self, server_id: str, name: str | None) -> None:
        if self.redis is None or self.groups_key is None:
            return
        if name is None:
            await reply(self.redis.hdel(self.groups_key, server_id))
        else:
            await reply(self.redis.hset(self.groups_key, server_id, name))

    async def forget(self, server_id: str) -> None:
        group = self.groups.pop(server_id, None)
        if group is not None:
            with contextlib.suppress(Exception):  # best effort: the server may be gone
                if await group.close():
                    await self._record(server_id, None)  # else the next connect destroys it

    async def aclose(self) -> None:
        for sid in list(self.groups):
            await self.forget(sid)
        self.snapshot = None
