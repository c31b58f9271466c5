"""Rank 0 of a weight-update group: the trainer's side of SGLang's distributed weight update.

A group is made the way an SGLang server expects its trainer to make it: a TCP rendezvous at
master_address:master_port, the store wrapped in PrefixStore(group_name), and a ProcessGroup of
its own — never the default group, so a learner that uses torch.distributed for training is not
disturbed, and many groups can live and die in one process. Rank layout: the trainer is rank 0,
server i joins at rank_offset = 1 + the tp sizes of the servers before it (its tensor-parallel
ranks at rank_offset + tp_rank), world_size = 1 + all tp sizes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, cast

import torch

from common.logs import get_logger
from common.services import free_port
from weight_sync.protocols import ServerClient

log = get_logger("weight_sync")


def init_custom_process_group(
    backend: str,
    init_method: str,
    world_size: int,
    rank: int,
    group_name: str,
    timeout: timedelta = timedelta(seconds=60),
    prefix_store: bool = True,
) -> Any:
    """A ProcessGroup outside the default group, on a TCP store at `init_method`
    (tcp://host:port) that rank 0 hosts. Both sides must build the store alike: the receiving
    servers wrap it in PrefixStore(group_name).

    The store is made here rather than by torch's rendezvous(): under torchrun, rendezvous()
    makes every TCP store a client of the torchrun agent's store (TORCHELASTIC_USE_AGENT_STORE),
    so a learner started by torchrun would never host its weight-update group."""
    from urllib.parse import urlparse

    from torch.distributed import TCPStore
    from torch.distributed import distributed_c10d as c10d

    url = urlparse(init_method)
    if url.scheme != "tcp" or not url.hostname or not url.port:
        raise ValueError(f"init_method {init_method!r}: expected tcp://host:port")
    store: Any = TCPStore(url.hostname, url.port, world_size, is_master=rank == 0, timeout=timeout,
                          wait_for_workers=False)
    if prefix_store:
        store = c10d.PrefixStore(group_name, store)
    pg, _ = c10d._new_process_group_helper(
        world_size, rank, [], c10d.Backend(backend), store,
        group_name=cast("c10d.GroupName", group_name), backend_options=None, timeout=timeout,
    )
    c10d._world.pg_group_ranks[pg] = {i: i for i in range(world_size)}
    return pg


def destroy_process_group(pg: Any) -> None:
    import torch.distributed as dist

    try:
        dist.destroy_process_group(pg)
    except Exception as e:  # a peer that died leaves nothing to tear down cleanly
        log.warning("destroy_group_failed", error=str(e))


def rank_layout(tp_sizes: Sequence[int]) -> tuple[list[int], int]:
    """rank_offset per server and world_size for one trainer rank plus these servers."""
    offsets, nxt = [], 1
    for tp in tp_sizes:
        offsets.append(nxt)
        nxt += tp
    return offsets, nxt


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def buckets(named: Iterable[tuple[str, torch.Tensor]], bucket_bytes: int
            ) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """Consecutive runs of tensors of at most bucket_bytes (a larger tensor goes alone)."""
    cur: list[tuple[str, torch.Tensor]] = []
    size = 0
    for name, t in named:
        n = t.numel() * t.element_size()
        if cur and size + n > bucket_bytes:
            yield cur
            cur, size = [], 0
        cur.append((name, t))
        size += n
    if cur:
        yield cur


@dataclass
class UpdateGroup:
    """Rank 0 of one weight-update group over `members` (server ids with their clients)."""

    name: str
    members: list[str]
    clients: list[ServerClient]
    tp_sizes: list[int]
    backend: str = "gloo"
    master_address: str = "127.0.0.1"
    timeout_s: float = 60.0
    device: str = "cpu"
    prefix_store: bool = True
    pg: Any = None

    async def connect(self) -> None:
        """Every server's /init_weights_update_group runs while rank 0 joins (SGLang's order)."""
        offsets, world = rank_layout(self.tp_sizes)
        port = free_port(self.master_address)
        init = f"tcp://{self.master_address}:{port}"
        calls = [
            asyncio.create_task(c.init_weights_update_group(
                master_address=self.master_address, master_port=port, rank_offset=off,
                world_size=world, group_name=self.name, backend=self.backend))
            for c, off in zip(self.clients, offsets, strict=True)
        ]
        try:
            self.pg = await asyncio.wait_for(asyncio.to_thread(
                init_custom_process_group, self.backend, init, world, 0, self.name,
                timedelta(seconds=self.timeout_s), self.prefix_store), self.timeout_s + 5)
            answers = await asyncio.wait_for(asyncio.gather(*calls), self.timeout_s)
        except BaseException:
            for t in calls:
                t.cancel()
            await asyncio.gather(*calls, return_exceptions=True)
            if self.pg is not None:
                destroy_process_group(self.pg)
                self.pg = None
            raise
        for member, ans in zip(self.members, answers, strict=True):
            if isinstance(ans, dict) and ans.get("success") is False:
                await self.close()
                raise RuntimeError(f"server {member}: init_weights_update_group: {ans.get('message')}")
        log.info("group_made", group=self.name, members=self.members, world_size=world,
                 backend=self.backend)

    def _broadcast(self, tensors: list[torch.Tensor]) -> None:
        import torch.distributed as dist

        works = [dist.broadcast(t, 0, group=self.pg, async_op=True) for t in tensors]
        for w in works:
            w.wait(timedelta(seconds=self.timeout_s))

    async def send(self, named: Iterable[tuple[str, torch.Tensor]], version: int,
                   bucket_bytes: int) -> int:
        """Send all tensors bucket by bucket: POST the bucket's metadata to every member and
        broadcast its tensors at the same time; weight_version rides on the last bucket only,
        so a server reports the new version once it holds all of it. Returns bytes sent."""
        if self.pg is None:
            raise RuntimeError(f"group {self.name} is not connected")
        sent = 0
        pending: list[tuple[str, torch.Tensor]] | None = None
        for bucket in buckets(named, bucket_bytes):
            if pending is not None:
                sent += await self._send_bucket(pending, None)
            pending = bucket
        if pending is None:
            raise RuntimeError("no tensors to send")
        sent += await self._send_bucket(pending, version)
        return sent

    async def _send_bucket(self, bucket: list[tuple[str, torch.Tensor]], version: int | None) -> int:
        tensors = [t.detach().to(self.device).contiguous() for _, t in bucket]
        last = version is not None
        calls = [
            asyncio.create_task(c.update_weights_from_distributed(
                names=[n for n, _ in bucket], dtypes=[dtype_name(t.dtype) for t in tensors],
                shapes=[list(t.shape) for t in tensors], group_name=self.name,
                flush_cache=last, weight_version=str(version) if last else None))
            for c in self.clients
        ]
        try:
            await asyncio.wait_for(asyncio.to_thread(self._broadcast, tensors), self.timeout_s + 5)
            answers = await asyncio.wait_for(asyncio.gather(*calls), self.timeout_s)
        except BaseException:
            for t in calls:
                t.cancel()
            await asyncio.gather(*calls, return_exceptions=True)
            raise
        for member, ans in zip(self.members, answers, strict=True):
            if isinstance(ans, dict) and ans.get("success") is False:
                raise RuntimeError(f"server {member}: update_weights_from_distributed: "
                                   f"{ans.get('message')}")
        return sum(t.numel() * t.element_size() for t in tensors)

    async def close(self) -> None:
        """Destroy the group on the servers (best effort: one may be gone) and here."""
        res = await asyncio.gather(*[
            asyncio.wait_for(c.destroy_weights_update_group(group_name=self.name), 10)
            for c in self.clients], return_exceptions=True)
        for member, r in zip(self.members, res, strict=True):
            if isinstance(r, BaseException):
                log.warning("destroy_group_on_server_failed", group=self.name, server=member,
                            error=repr(r))
        if self.pg is not None:
            pg, self.pg = self.pg, None
            await asyncio.to_thread(destroy_process_group, pg)
