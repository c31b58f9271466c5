"""The distributed transport: the version's tensors, held in memory, are broadcast from the
learner (rank 0) over a weight-update group of the server's own (NCCL on GPU, gloo on CPU).

The broadcast is collective over a group's members, so every server gets a group of its own
(rank 0 plus that server's tensor-parallel ranks): each server is drained and updated on its
own, as with the disk transport, and a slow or dead server cannot hold a collective for the
others. A group is made at the server's first update over this transport and kept; it is
dropped (on both sides) when the server leaves, restarts or fails, and made again at its next
update. A server joins a group only once it is serving: a server that registers mid-run is
first loaded from disk.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from dataclasses import dataclass

import torch

from broker.registry import ServerInfo
from common.logs import get_logger
from weight_sync.config import WeightSyncConfig
from weight_sync.protocols import ServerClient, VersionRefused
from weight_sync.update_group import UpdateGroup

log = get_logger("weight_sync")


@dataclass
class Snapshot:
    """A version's tensors held in memory until every live server has it."""

    version: int
    tensors: list[tuple[str, torch.Tensor]]
    device: str = "cpu"  # where the learner's tensors live (cuda → nccl with backend auto)

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
    server without valid meta to the disk transport instead (see Coordinator)."""

    name = "distributed"
    sets_version = True

    def __init__(self, cfg: WeightSyncConfig, run_id: str) -> None:
        self.cfg, self.run_id = cfg, run_id
        self.snapshot: Snapshot | None = None
        self.groups: dict[str, UpdateGroup] = {}

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
        group = self.groups.get(server.id)
        if group is None:
            group = await self._connect(server, client, payload.device)
        return await group.send(payload.tensors, version, int(self.cfg.bucket_mb * (1 << 20)))

    async def _connect(self, server: ServerInfo, client: ServerClient, device: str) -> UpdateGroup:
        if server.meta is None:  # the coordinator never sends one here: refuse to guess a size
            raise RuntimeError(f"server {server.id}: no valid meta ({server.meta_error or 'missing'}); "
                               "its tensor-parallel size, the group's world size, is unknown")
        backend = self.cfg.backend
        if backend == "auto":
            backend = "nccl" if device == "cuda" else "gloo"
        group = UpdateGroup(
            name=f"swarl-{self.run_id}-{server.id}".replace(":", "_"), members=[server.id],
            clients=[client], tp_sizes=[server.meta.tp_size], backend=backend,
            master_address=self.cfg.master_address, timeout_s=self.cfg.group_timeout_s,
            device="cuda" if backend == "nccl" else "cpu", prefix_store=self.cfg.group_store_prefix)
        await group.connect()
        self.groups[server.id] = group
        return group

    async def forget(self, server_id: str) -> None:
        group = self.groups.pop(server_id, None)
        if group is not None:
            with contextlib.suppress(Exception):  # best effort: the server may be gone
                await group.close()

    async def aclose(self) -> None:
        for sid in list(self.groups):
            await self.forget(sid)
        self.snapshot = None
