"""The CPU server's side of a weight-update group: the trainer is rank 0 and broadcasts every
tensor; a server of tensor-parallel size N is N members, at ranks rank_offset + tp_rank.

That is SGLang's layout: each tensor-parallel worker of an SGLang server joins the group on its
own (rank = rank_offset + tp_rank; world_size = 1 + the tp sizes of all servers) and receives
every tensor in full before loading its shard. The CPU server plays all N workers in one
process, one thread per rank, so the rank arithmetic of a fleet of tp-N servers is exercised
over gloo on any machine.

The trainer makes its group as SGLang's `init_custom_process_group` does: a TCP rendezvous at
master_address:master_port, the store wrapped in PrefixStore(group_name), and torch's
process-group helper with that name, which keeps its keys under `<group_name>/cpu/`. torch
registers one group per name per process, so the N members here are gloo backends built
directly on that same store layout: to the trainer they are N ordinary members.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from common.logs import get_logger

if TYPE_CHECKING:
    import torch

log = get_logger("inference")


def join_member(master_address: str, master_port: int, rank: int, world_size: int, group_name: str,
                timeout_s: float) -> Any:
    """One gloo member of the group at `rank`; blocks until every rank has joined."""
    from torch.distributed import PrefixStore, ProcessGroupGloo
    from torch.distributed.rendezvous import rendezvous

    timeout = timedelta(seconds=timeout_s)
    store, _, _ = next(rendezvous(f"tcp://{master_address}:{master_port}", rank, world_size,
                                  timeout=timeout))
    store.set_timeout(timeout)
    # PrefixStore(group_name) as SGLang wraps it; then the `<name>/` and `cpu/` prefixes that
    # torch's process-group helper adds on the trainer's side.
    keys = PrefixStore("cpu/", PrefixStore(f"{group_name}/", PrefixStore(group_name, store)))
    return ProcessGroupGloo(keys, rank, world_size, timeout)


def broadcast(member: Any, tensor: torch.Tensor, src: int = 0) -> None:
    """Receive (or send, at `src`) `tensor` in place."""
    from torch.distributed import BroadcastOptions

    opts = BroadcastOptions()
    opts.rootRank = src
    member.broadcast([tensor], opts).wait()


def leave(member: Any) -> None:
    """Release a member's connections (a peer that died leaves nothing to close cleanly)."""
    shutdown = getattr(member, "shutdown", None)
    if shutdown is not None:
        with contextlib.suppress(RuntimeError):
            shutdown()


class GroupError(RuntimeError):
    """A group that cannot be used; the message says why."""


@dataclass
class ReceivingGroup:
    """This server's `tp_size` ranks in one weight-update group."""

    name: str
    master_address: str
    master_port: int
    rank_offset: int
    world_size: int
    tp_size: int
    timeout_s: float
    members: list[Any] = field(default_factory=list)
    error: str = ""
    joined: threading.Event = field(default_factory=threading.Event)
    closed: bool = False
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def ranks(self) -> range:
        return range(self.rank_offset, self.rank_offset + self.tp_size)

    @staticmethod
    def check_layout(rank_offset: int, world_size: int, tp_size: int) -> str:
        """Why these ranks cannot be this server's ("" when they can)."""
        if rank_offset < 1:
            return f"rank_offset {rank_offset} must be at least 1 (rank 0 is the trainer)"
        if rank_offset + tp_size > world_size:
            return (f"rank_offset {rank_offset} + tp_size {tp_size} exceeds world_size {world_size}: "
                    f"this server's ranks {rank_offset}..{rank_offset + tp_size - 1} must lie in "
                    f"1..{world_size - 1} (world_size = 1 trainer rank + the tp sizes of all servers)")
        return ""

    def start_join(self) -> None:
        """Join with every rank at once, in the background (the trainer joins concurrently)."""
        threading.Thread(target=self._join, name=f"join-{self.name}", daemon=True).start()

    def _join(self) -> None:
        try:
            members, errors = [], []
            with ThreadPoolExecutor(self.tp_size, thread_name_prefix=f"rank-{self.name}") as pool:
                futures = [pool.submit(join_member, self.master_address, self.master_port, rank,
                                       self.world_size, self.name, self.timeout_s) for rank in self.ranks]
                for rank, fut in zip(self.ranks, futures, strict=True):
                    try:
                        members.append(fut.result())
                    except Exception as e:
                        errors.append(f"rank {rank}: {type(e).__name__}: {e}")
            with self._lock:
                if self.closed and not errors:  # destroyed while joining
                    errors.append("destroyed while joining")
                if errors:
                    self.error = "; ".join(errors)
                    for m in members:
                        leave(m)
                else:
                    self.members = members
            if errors:
                log.warning("weight_group_join_failed", group=self.name, error=self.error)
            else:
                log.info("weight_group_joined", group=self.name, ranks=f"{self.ranks[0]}..{self.ranks[-1]}",
                         world_size=self.world_size)
        finally:
            self.joined.set()

    def wait_joined(self) -> None:
        """Block until joined (at most timeout_s); GroupError when it failed or took too long."""
        if not self.joined.wait(self.timeout_s):
            raise GroupError(f"group {self.name!r}: still joining after {self.timeout_s:.0f}s")
        if self.error:
            raise GroupError(f"group {self.name!r} failed to initialise: {self.error}")

    def receive(self, dtypes: Sequence[torch.dtype], shapes: Sequence[Sequence[int]]) -> list[list[torch.Tensor]]:
        """Every rank receives every tensor, in order; one list of tensors per rank."""
        import torch

        def one_rank(member: Any) -> list[torch.Tensor]:
            out = []
            for dt, shape in zip(dtypes, shapes, strict=True):
                t = torch.empty(list(shape), dtype=dt)
                broadcast(member, t, src=0)
                out.append(t)
            return out

        members = list(self.members)
        if not members:
            raise GroupError(f"group {self.name!r} has no joined ranks (destroyed, or its join failed)")
        with ThreadPoolExecutor(len(members), thread_name_prefix=f"recv-{self.name}") as pool:
            return list(pool.map(one_rank, members))

    def close(self) -> None:
        with self._lock:
            self.closed = True
            members, self.members = self.members, []
        for m in members:
            leave(m)


def first_difference(names: Sequence[str], per_rank: Sequence[Sequence[torch.Tensor]],
                     ranks: Sequence[int]) -> str:
    """Where the ranks' copies differ in any byte ("" when every rank holds the same bytes)."""
    if not per_rank:
        return ""
    first = per_rank[0]
    for rank, tensors in zip(ranks[1:], per_rank[1:], strict=True):
        for name, a, b in zip(names, first, tensors, strict=True):
            if a.dtype != b.dtype or a.shape != b.shape or not _same_bytes(a, b):
                return f"{name}: rank {rank} received other bytes than rank {ranks[0]}"
    return ""


def _same_bytes(a: torch.Tensor, b: torch.Tensor) -> bool:
    import torch

    return torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8))
