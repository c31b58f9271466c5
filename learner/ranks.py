"""The learner's processes under torchrun: rank 0 leads, every rank trains.

Rank 0 alone talks to Redis (reads, assembly, the staleness rule, acks, the learner state) and
checkpoints the learner state and publishes versions. The other ranks only train: they wait for
rank 0's commands on a gloo group of their own (whatever backend training uses, commands are
small Python objects on CPU), carry each one out and answer. Every answer also says whether that
rank was asked to stop (SIGTERM/SIGINT), so a signal to any rank stops all of them after the
current command. A rank that fails exits; its peers' sockets close, their collectives fail, and
torchrun ends the job with the failed rank named.

The channel carries small objects only: `gather_object` pickles every rank's answer and pads
them all to the largest, so a model-sized answer would cost its size times the world on rank 0.
Tensors (publishing, learner.trainer) move over tensor collectives instead, and an answer over
MAX_REPLY_BYTES is refused with an error naming the command.
"""

from __future__ import annotations

import os
import pickle
import signal
import threading
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import torch

from common.logs import get_logger

log = get_logger("learner.ranks")

TRAIN, SAVE, LOAD, WEIGHTS, TICK, STOP = "train", "save", "load", "weights", "tick", "stop"
# a step's statistics are a few hundred bytes; a reply this large is a tensor that should have
# gone over a tensor collective
MAX_REPLY_BYTES = 16 << 20


class ReplyTooLarge(ValueError):
    """An answer too large for the command channel (see the module docstring)."""


@dataclass
class Reply:
    result: Any = None
    stop: bool = False  # the rank was signalled to stop


@dataclass
class Ranks:
    rank: int
    world: int
    local_rank: int
    group: Any = None  # the command group (None on a single process)
    stop_requested: threading.Event = field(default_factory=threading.Event)

    @property
    def leader(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world > 1


def init_ranks(timeout_s: float) -> Ranks:
    """torch.distributed from torchrun's environment (RANK, WORLD_SIZE, LOCAL_RANK,
    MASTER_ADDR/PORT), NCCL for training on GPUs and gloo on CPU; one rank without torchrun."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return Ranks(0, 1, 0)
    import torch.distributed as dist

    rank, local = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
    timeout = timedelta(seconds=timeout_s)
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(local)
    if not dist.is_initialized():
        dist.init_process_group("nccl" if cuda else "gloo", timeout=timeout)
    group = dist.new_group(backend="gloo", timeout=timeout) if cuda else dist.group.WORLD
    log.info("ranks_ready", rank=rank, world=world, local_rank=local,
             training_backend="nccl" if cuda else "gloo")
    return Ranks(rank, world, local, group)


def catch_stop_signals(ranks: Ranks) -> None:
    """A follower notes SIGTERM/SIGINT and tells rank 0 in its next answer (rank 0's own
    signals are handled by its event loop)."""
    def note(signum: int, _frame: Any) -> None:
        log.info("stop_requested", rank=ranks.rank, signal=signum)
        ranks.stop_requested.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, note)


class Channel:
    """Commands from rank 0 to every rank, and every rank's answer back."""

    def __init__(self, ranks: Ranks) -> None:
        self.ranks = ranks

    def send(self, cmd: str, payloads: list[Any]) -> Any:
        """Rank 0: hand rank r `payloads[r]`; returns rank 0's own payload."""
        import torch.distributed as dist

        assert len(payloads) == self.ranks.world
        out: list[Any] = [None]
        dist.scatter_object_list(out, [(cmd, p) for p in payloads], src=0, group=self.ranks.group)
        return out[0][1]

    def collect(self, mine: Any) -> list[Reply]:
        """Rank 0: every rank's answer (rank 0's is `mine`), in rank order."""
        import torch.distributed as dist

        got: list[Any] = [None] * self.ranks.world
        dist.gather_object(_small(Reply(mine, self.ranks.stop_requested.is_set())), got, dst=0,
                           group=self.ranks.group)
        return got

    def receive(self) -> tuple[str, Any]:
        """Any other rank: the next command and this rank's payload."""
        import torch.distributed as dist

        out: list[Any] = [None]
        dist.scatter_object_list(out, None, src=0, group=self.ranks.group)
        cmd, payload = out[0]
        return cmd, payload

    def answer(self, result: Any) -> None:
        import torch.distributed as dist

        dist.gather_object(_small(Reply(result, self.ranks.stop_requested.is_set())), None, dst=0,
                           group=self.ranks.group)

    def all_gather(self, mine: Any) -> list[Any]:
        """Every rank: every rank's `mine` (start-up facts such as data-parallel indices)."""
        import torch.distributed as dist

        got: list[Any] = [None] * self.ranks.world
        dist.all_gather_object(got, mine, group=self.ranks.group)
        return got


def _small(reply: Reply) -> Reply:
    n = len(pickle.dumps(reply))
    if n > MAX_REPLY_BYTES:
        raise ReplyTooLarge(f"a learner rank's answer of {n} bytes (over {MAX_REPLY_BYTES}) through "
                            f"the command channel: {type(reply.result).__name__} is too large to pickle "
                            "and gather; tensors go over tensor collectives (learner.trainer)")
    return reply


def shutdown(ranks: Ranks, clean: bool) -> None:
    """Tear the process group down. After a clean stop every rank meets at a barrier first, so
    none closes its sockets while a peer still uses them; and whatever held the group (the DDP
    wrapper) is collected before it, not at interpreter exit (a gloo thread destroyed then
    aborts the process). After a failure no barrier: a peer may be dead."""
    if not ranks.distributed:
        return
    import gc

    import torch.distributed as dist

    if not dist.is_initialized():
        return
    gc.collect()
    if clean:
        try:
            dist.barrier(group=ranks.group)
        except RuntimeError as e:  # a peer gone meanwhile: tear down anyway
            log.warning("shutdown_barrier_failed", rank=ranks.rank, error=str(e))
    dist.destroy_process_group()
