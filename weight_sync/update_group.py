"""Rank 0 of a weight-update group: the trainer's side of SGLang's distributed weight update.

A group is made the way an SGLang server expects its trainer to make it: a TCP rendezvous at
master_address:master_port, the store wrapped in PrefixStore(group_name), and a ProcessGroup of
its own — never the default group, so a learner that uses torch.distributed for training is not
disturbed, and many groups can live and die in one process. Rank layout: the trainer is rank 0,
server i joins at rank_offset = 1 + the tp sizes of the servers before it (its tensor-parallel
ranks at rank_offset + tp_rank), world_size = 1 + all tp sizes.

What SGLang 0.5.23 requires, and the order this module keeps:
1. `session()`: /begin_weight_update, answered once the server holds its model-update lock (its
   requests in flight have ended); update_weights_from_distributed is refused outside a session.
   The answer is read before rank 0 touches any collective; a refusal or a slow answer ends
   the update there (ServerRefused: the server kept its old weights). /end_weight_update closes
   the session on every way out.
2. `connect()`: /init_weights_update_group while rank 0 makes its side of the group.
3. `send()`: per bucket, /update_weights_from_distributed (the metadata) while rank 0
   broadcasts. SGLang loads each bucket into the live model as it arrives and takes the
   version only with the last, so a failure after the first bucket's call went out may leave a
   mix of two versions (anything but ServerRefused says so; the coordinator then keeps
   generation paused until a reload from disk).
In 2 and 3 the HTTP answers and rank 0's collective are awaited together, each bounded by
timeout_s: the first refusal, error or timeout ends the update at once instead of leaving rank 0
in the collective. A bucket counts as delivered only when both are in: the server's answer, and
rank 0's collective completed. Under gloo the two mean the same; under NCCL the server answers
once its receive is queued (its wait() orders streams only), so rank 0 polls its own kernels'
completion (`_broadcast`). A group given up on is broken: its teardown (NCCL: abort(), then
destroy) runs on a thread of its own once rank 0's thread is done, never on the event loop, and
counts in `running` until it ends.

What bounds rank 0's thread. gloo: the group's own timeout is timeout_s, so its set-up and every
wait end within the bound. NCCL: the communicator is set up lazily, inside the first broadcast,
where it waits for the server's first receive. With a blocking communicator that wait is inside
NCCL's init, which nothing bounds or ends. The communicator is therefore non-blocking
(`nccl_nonblocking_options`): torch (2.11, NCCLUtils.cpp NCCLComm::getNcclComm -> waitReady)
then polls the set-up while holding the communicator's lock, until it is ready or
TORCH_NCCL_NONBLOCKING_TIMEOUT seconds have passed, and raises. abort() does not end that wait:
NCCLComm::abort takes the same lock, so it waits behind it, and ProcessGroupNCCL::abort blocks
its caller until then (it waits for its own abort thread). That timeout is the set-up's only
bound, and torch reads it once per process, at the first NCCL operation: `nccl_setup_bound` sets
it to the group's bound unless the user did, and must run before the process's first NCCL
operation (a learner that trains over NCCL calls it at start; UpdateGroup calls it too, which
is in time only in a process that has not used NCCL yet). Torch counts whole seconds, so rank 0's
thread ends about a second past timeout_s. After the set-up, kernels that stall are polled
within the bound and ended by the abort. The group's own timeout is twice timeout_s, so this
module gives up before NCCL's watchdog (whose default action ends the learner) would act.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import time
from collections.abc import AsyncIterator, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, cast

import torch

from common.logs import get_logger
from common.services import free_port
from weight_sync.protocols import ServerClient, ServerRefused

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
        group_name=cast("c10d.GroupName", group_name),
        backend_options=nccl_nonblocking_options() if backend == "nccl" else None, timeout=timeout,
    )
    c10d._world.pg_group_ranks[pg] = {i: i for i in range(world_size)}
    return pg


def nccl_nonblocking_options() -> Any:
    """NCCL options for rank 0's group: a non-blocking communicator. NCCL sets its
    communicator up lazily, inside the first collective, which waits there for every peer (an
    SGLang server joins at its first receive). Blocking, that wait is inside NCCL's init and
    nothing bounds or ends it, so a server that refused or died first would leave rank 0's
    thread, and the group, behind for good. Non-blocking, torch polls the set-up and gives up
    after TORCH_NCCL_NONBLOCKING_TIMEOUT seconds (`nccl_setup_bound`; abort() does not end that
    wait, see the module doc). None (a blocking one, logged) where this torch has no such
    option."""
    try:
        from torch.distributed import ProcessGroupNCCL

        opts = ProcessGroupNCCL.Options()
        opts.config.blocking = 0
    except (ImportError, AttributeError) as e:
        log.warning("nccl_nonblocking_unavailable", error=repr(e))
        return None
    return opts


NONBLOCKING_TIMEOUT_ENV = "TORCH_NCCL_NONBLOCKING_TIMEOUT"


def nccl_setup_bound(timeout_s: float) -> int:
    """Bound the lazy set-up of rank 0's non-blocking NCCL communicator at timeout_s: set
    TORCH_NCCL_NONBLOCKING_TIMEOUT (whole seconds, at least 1) unless it is set already, and
    return the bound in force. Torch reads the variable into a static at the process's first
    NCCL operation (NCCLUtils.cpp nccl_nonblocking_timeout(); its default is 1800 s), so this
    must run before any, training's included: later it changes nothing (logged when the
    process already has an NCCL group). The variable bounds every non-blocking wait of the
    process; blocking communicators (torch's default for training) never wait on it."""
    want = max(1, math.ceil(timeout_s))
    cur = os.environ.get(NONBLOCKING_TIMEOUT_ENV, "").strip()
    if cur:
        try:
            have = int(cur)
        except ValueError:
            log.warning("nccl_setup_bound_unreadable", value=cur)
            return want
        if have > want:
            log.warning("nccl_setup_bound_above_the_group_bound", env=NONBLOCKING_TIMEOUT_ENV,
                        value=have, group_timeout_s=timeout_s)
        return have
    os.environ[NONBLOCKING_TIMEOUT_ENV] = str(want)
    if _nccl_in_use():
        log.warning("nccl_setup_bound_maybe_late", env=NONBLOCKING_TIMEOUT_ENV, value=want,
                    why="this process already has an NCCL group: torch may have read the variable "
                        "(default 1800 s); call nccl_setup_bound before its first NCCL operation")
    return want


def _nccl_in_use() -> bool:
    try:
        import torch.distributed as dist

        return bool(dist.is_available() and dist.is_initialized() and "nccl" in str(dist.get_backend()))
    except Exception:
        return False


def destroy_process_group(pg: Any) -> None:
    import torch.distributed as dist

    try:
        dist.destroy_process_group(pg)
    except Exception as e:  # a peer that died leaves nothing to tear down cleanly
        log.warning("destroy_group_failed", error=str(e))


def resolve_backend(backend: str, cuda_available: bool | None = None) -> str:
    """The group's backend: `auto` is nccl when this process (the learner's rank 0) has CUDA,
    gloo otherwise; nccl and gloo are taken as asked."""
    if backend not in ("auto", "nccl", "gloo"):
        raise ValueError(f"weight_sync.backend: expected auto, nccl or gloo, got {backend!r}")
    if backend != "auto":
        return backend
    if cuda_available is None:
        cuda_available = torch.cuda.is_available()
    return "nccl" if cuda_available else "gloo"


def send_device(backend: str) -> str:
    """Where rank 0's tensors must be for the backend: NCCL sends from this rank's GPU (one
    bucket at a time is moved there), gloo from the CPU."""
    if backend != "nccl":
        return "cpu"
    return f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}"


def _ok(ans: Any) -> bool:
    return not (isinstance(ans, dict) and ans.get("success") is False)


def _why(ans: Any) -> str:
    return str(ans.get("message")) if isinstance(ans, dict) else str(ans)


@contextlib.asynccontextmanager
async def session(client: ServerClient, member: str, timeout_s: float) -> AsyncIterator[None]:
    """A weight-update session on one server: begin (bounded; a refusal or no answer within
    timeout_s raises ServerRefused: nothing has been sent, the server keeps its weights and
    answers requests; a transport error, e.g. a dead server, propagates as it is), the body,
    then end, also when the body failed (bounded, best effort: a server that died or left it
    open is dealt with at its next begin).

    A session already open was left by a learner killed mid-update (while this coordinator
    holds the server's update lease nobody else updates it): it is ended and begun again."""
    async def begin() -> Any:
        try:
            return await asyncio.wait_for(client.begin_weight_update(), timeout_s)
        except TimeoutError:
            raise ServerRefused(f"begin_weight_update: no answer within {timeout_s:g}s (the server "
                                "waits for its requests in flight)") from None

    ans = await begin()
    if not _ok(ans) and "already open" in _why(ans):
        log.warning("stale_weight_update_session_ended", server=member)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(client.end_weight_update(), timeout_s)
        ans = await begin()
    if not _ok(ans):
        raise ServerRefused(f"begin_weight_update: {_why(ans)}")
    try:
        yield
    finally:
        try:
            ans = await asyncio.wait_for(client.end_weight_update(), timeout_s)
            if not _ok(ans):
                log.warning("end_weight_update_refused", server=member, message=_why(ans))
        except Exception as e:
            log.warning("end_weight_update_failed", server=member, error=repr(e))


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
    """Rank 0 of one weight-update group over `members` (server ids with their clients). Every
    method is bounded (see the module doc); a group whose collective was cut short is `broken`
    and must be closed and made again."""

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
    broken: str = ""
    _threads: set[asyncio.Future[Any]] = field(default_factory=set, repr=False)

    def __post_init__(self) -> None:
        if self.backend == "nccl":  # in time only if the process has not used NCCL yet (module doc)
            nccl_setup_bound(self.timeout_s)

    async def connect(self) -> None:
        """Every server's /init_weights_update_group runs while rank 0 joins (SGLang's order);
        a server that refuses ends the join at once (ServerRefused)."""
        offsets, world = rank_layout(self.tp_sizes)
        port = free_port(self.master_address)
        init = f"tcp://{self.master_address}:{port}"
        join = self._thread(init_custom_process_group, self.backend, init, world, 0, self.name,
                            timedelta(seconds=self.group_timeout_s), self.prefix_store)
        calls = [
            asyncio.ensure_future(c.init_weights_update_group(
                master_address=self.master_address, master_port=port, rank_offset=off,
                world_size=world, group_name=self.name, backend=self.backend))
            for c, off in zip(self.clients, offsets, strict=True)
        ]
        try:
            self.pg = await self._together(join, calls, "init_weights_update_group")
        except ServerRefused:
            await self.close()
            raise
        log.info("group_made", group=self.name, members=self.members, world_size=world,
                 backend=self.backend)

    async def send(self, named: Iterable[tuple[str, torch.Tensor]], version: int,
                   bucket_bytes: int) -> int:
        """Send all tensors bucket by bucket: POST the bucket's metadata to every member and
        broadcast its tensors at the same time; weight_version rides on the last bucket only,
        so a server reports the new version once it holds all of it. Returns bytes sent."""
        if self.pg is None or self.broken:
            raise RuntimeError(f"group {self.name} is not usable ({self.broken or 'not connected'})")
        sent, n = 0, 0
        pending: list[tuple[str, torch.Tensor]] | None = None
        try:
            for bucket in buckets(named, bucket_bytes):
                if pending is not None:
                    sent += await self._send_bucket(pending, None)
                    n += 1
                pending = bucket
            if pending is None:
                raise RuntimeError("no tensors to send")
            sent += await self._send_bucket(pending, version)
        except ServerRefused as e:
            if n:  # the buckets before were loaded: not the old weights any more
                raise RuntimeError(f"{e} (after {n} buckets were loaded: the server holds a mix of "
                                   "versions)") from e
            raise
        return sent

    async def _send_bucket(self, bucket: list[tuple[str, torch.Tensor]], version: int | None) -> int:
        tensors = [t.detach().to(self.device).contiguous() for _, t in bucket]
        last = version is not None
        calls = [
            asyncio.ensure_future(c.update_weights_from_distributed(
                names=[n for n, _ in bucket], dtypes=[dtype_name(t.dtype) for t in tensors],
                shapes=[list(t.shape) for t in tensors], group_name=self.name,
                flush_cache=last, weight_version=str(version) if last else None))
            for c in self.clients
        ]
        await self._together(self._thread(self._broadcast, tensors), calls,
                             "update_weights_from_distributed")
        return sum(t.numel() * t.element_size() for t in tensors)

    @property
    def group_timeout_s(self) -> float:
        """The process group's own timeout. gloo: the bound itself, so rank 0's set-up and every
        wait on its thread end within timeout_s. NCCL: twice the bound, so this module gives up
        and aborts the group before NCCL's watchdog, whose default action ends the process,
        would act."""
        return 2 * self.timeout_s if self.backend == "nccl" else self.timeout_s

    def _broadcast(self, tensors: list[torch.Tensor]) -> None:
        import torch.distributed as dist

        works = [dist.broadcast(t, 0, group=self.pg, async_op=True) for t in tensors]
        if self.backend != "nccl":
            for w in works:
                w.wait(timedelta(seconds=self.timeout_s))
            return
        # NCCL's wait() only orders streams, and an SGLang server answers once its receive is
        # queued, not done: a bucket is delivered when rank 0's kernels have completed. Polled
        # within the bound; past it the caller aborts the group, which ends the kernels.
        deadline = time.monotonic() + self.timeout_s
        while not all(w.is_completed() for w in works):
            if self.broken:
                raise RuntimeError(f"group {self.name} was given up while a broadcast ran")
            if time.monotonic() > deadline:
                raise TimeoutError(f"group {self.name}: the broadcast did not complete within "
                                   f"{self.timeout_s:g}s")
            time.sleep(0.002)

    @property
    def running(self) -> int:
        """Rank 0's threads of this group still running: a set-up, a collective, or the
        group's teardown (abort and destroy, once the collective's thread is done)."""
        return sum(not t.done() for t in self._threads)

    def _thread(self, fn: Any, *args: Any) -> asyncio.Future[Any]:
        fut = asyncio.ensure_future(asyncio.to_thread(fn, *args))
        self._threads.add(fut)
        fut.add_done_callback(self._threads.discard)
        fut.add_done_callback(_retrieved)  # a group given up on may still fail on its thread
        return fut

    async def _together(self, collective: asyncio.Future[Any], calls: Sequence[asyncio.Future[Any]],
                        what: str) -> Any:
        """Await rank 0's `collective` and the servers' answers to `what` together, at most
        timeout_s; the first refusal, error or timeout breaks the group and raises (ServerRefused
        for a refusal). Returns the collective's result."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout_s
        pending: set[asyncio.Future[Any]] = {collective, *calls}
        try:
            while pending:
                done, pending = await asyncio.wait(pending, timeout=max(0.0, deadline - loop.time()),
                                                   return_when=asyncio.FIRST_COMPLETED)
                if not done:
                    late = [m for m, c in zip(self.members, calls, strict=True) if not c.done()]
                    who = f"servers {late}" if late else "rank 0's collective"
                    raise TimeoutError(f"group {self.name}: {what}: no answer from {who} within "
                                       f"{self.timeout_s:g}s")
                for fut in done:
                    if fut is collective:
                        if fut.exception() is not None:
                            await self._refusal_first(calls, what, deadline)
                            fut.result()  # rank 0's error
                        continue
                    member = self.members[calls.index(fut)]
                    ans = fut.result()  # a transport error propagates
                    if not _ok(ans):
                        raise ServerRefused(f"server {member}: {what}: {_why(ans)}")
            return collective.result()
        except BaseException as e:
            for c in calls:
                c.cancel()
            self._break(f"{what}: {type(e).__name__}: {e}", collective)
            raise

    async def _refusal_first(self, calls: Sequence[asyncio.Future[Any]], what: str,
                             deadline: float) -> None:
        """Rank 0's collective failed: a server that refused is usually why (it left the
        group, or never entered it). Its answer, if it comes within a moment, is the error."""
        left = [c for c in calls if not c.done()]
        if left:
            await asyncio.wait(left, timeout=min(2.0, max(0.0, deadline - asyncio.get_running_loop().time())))
        for member, c in zip(self.members, calls, strict=True):
            if c.done() and not c.cancelled() and c.exception() is None and not _ok(c.result()):
                raise ServerRefused(f"server {member}: {what}: {_why(c.result())}")

    def _break(self, why: str, collective: asyncio.Future[Any]) -> None:
        """Give up on the group: its teardown (NCCL: abort, which ends kernels in flight; then
        destroy) runs on a thread once rank 0's thread is done. Nothing here blocks: torch's
        abort() waits for a set-up still polling (module doc)."""
        if not self.broken:
            self.broken = why
            log.warning("group_broken", group=self.name, why=why[:300])
        pg, self.pg = self.pg, None
        self._teardown(pg, after=collective, abort=True)

    async def close(self) -> bool:
        """Destroy the group on the servers (bounded, best effort: one may be gone) and here
        (after any collective still on rank 0's thread; waited for up to timeout_s, else left
        to finish on its thread); True when every server answered (destroyed, or never had it)."""
        res = await asyncio.gather(*[
            asyncio.wait_for(c.destroy_weights_update_group(group_name=self.name), 10)
            for c in self.clients], return_exceptions=True)
        answered = True
        for member, r in zip(self.members, res, strict=True):
            if isinstance(r, BaseException):
                answered = False
                log.warning("destroy_group_on_server_failed", group=self.name, server=member,
                            error=repr(r))
        if self.pg is not None:
            pg, self.pg = self.pg, None
            busy = [t for t in self._threads if not t.done()]
            done, _ = await asyncio.wait([self._teardown(pg, after=busy[0] if busy else None, abort=False)],
                                         timeout=self.timeout_s)
            if not done:
                log.warning("destroy_group_slow", group=self.name, timeout_s=self.timeout_s)
        return answered

    def _teardown(self, pg: Any, after: asyncio.Future[Any] | None, abort: bool) -> asyncio.Future[Any]:
        """Abort (NCCL, when `abort`) and destroy `pg` on a thread, once `after` (rank 0's
        thread) is done; with no `pg`, what `after` makes (a join still under way). Tracked in
        `running` from now until it ends."""
        async def run() -> None:
            if after is not None:
                await asyncio.wait([after])
            target = pg
            if target is None and after is not None and not after.cancelled() and after.exception() is None:
                target = after.result()  # joined as it was given up on
            if target is not None:
                await asyncio.to_thread(self._abort_and_destroy, target, abort)

        fut = asyncio.ensure_future(run())
        self._threads.add(fut)
        fut.add_done_callback(self._threads.discard)
        fut.add_done_callback(_retrieved)
        return fut

    def _abort_and_destroy(self, pg: Any, abort: bool) -> None:
        if abort and self.backend == "nccl":
            try:
                pg.abort()
            except Exception as e:
                log.warning("group_abort_failed", group=self.name, error=repr(e)[:300])
        destroy_process_group(pg)


def _retrieved(fut: asyncio.Future[Any]) -> None:
    if not fut.cancelled() and fut.exception() is not None:
        log.debug("group_thread_failed", error=repr(fut.exception()))

