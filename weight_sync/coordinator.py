"""The rolling update: bring every live inference server to the newest policy version, a few
at a time, so rollout never stops as a whole and no pinned episode sees its version change.

Per server: draining (the pin script skips it) → wait until its pins reach 0 (or
drain_timeout_s: "wait" longer, or "proceed" and count the episodes that change version) →
updating → load (disk, or its distributed group) → /get_weight_version must equal the target →
ready at the target. A server that registers or restarts ("starting") is loaded from the newest
verified checkpoint before it is ready. A checkpoint that fails verification is refused before
any server is touched. A failed update leaves the server at its old version: "ready" with the
error when the server answered that it kept its old weights, else "failed"; either way it is
tried again after retry_failed_s, and the run goes on.

Distributed transport and rolling: the broadcast is collective over a group's members, so every
server gets a group of its own (trainer rank 0 + that server's tp ranks) that lives as long as
the server does. Each server is then drained and updated independently of the others, exactly
as with the disk transport; a group is destroyed when its server leaves, restarts or fails, and
made again at its next update. A server joining mid-run is first seeded from disk.

The coordinator runs in the learner process on a thread of its own (CoordinatorThread) with its
own event loop and Redis connection, so training steps never stall it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from broker.keys import Keys
from broker.registry import PolicyRegistry, ServerInfo, ServerRegistry
from common.logs import get_logger
from weight_sync import disk
from weight_sync.config import WeightSyncConfig
from weight_sync.distributed import UpdateGroup

log = get_logger("weight_sync")

ClientFactory = Callable[[str], Any]


class RefusedError(RuntimeError):
    """The server answered success=false and kept its old weights."""


@dataclass
class Snapshot:
    """A version's tensors held in memory for the distributed transport."""

    version: int
    tensors: list[tuple[str, torch.Tensor]]
    device: str = "cpu"  # where the learner's tensors live (cuda → nccl with backend auto)

    @classmethod
    def take(cls, version: int, named: Any) -> Snapshot:
        """Copies on the CPU: GPU memory is not held for the length of a rollout (NCCL sends
        move one bucket at a time back to the GPU)."""
        out, device = [], "cpu"
        for n, t in named:
            if t.device.type != "cpu":
                device = t.device.type
            out.append((n, t.detach().to("cpu", copy=True)))
        return cls(version, out, device)


@dataclass
class UpdateResult:
    server: str
    version: int
    ok: bool
    transport: str
    duration_s: float
    drain_s: float = 0.0
    bytes: int = 0
    pins_at_update: int = 0
    error: str = ""
    time: float = field(default_factory=time.time)


def default_client_factory(api_key: str | None, timeout_s: float) -> ClientFactory:
    def make(url: str) -> Any:
        from inference.client import SGLangClient

        return SGLangClient(url, api_key=api_key, timeout_s=timeout_s, retries=1)

    return make


class Coordinator:
    def __init__(self, cfg: WeightSyncConfig, redis: Any, keys: Keys, run_dir: str,
                 client_factory: ClientFactory) -> None:
        self.cfg, self.redis, self.keys, self.run_dir = cfg, redis, keys, run_dir
        self.policy = PolicyRegistry(redis, keys)
        self.servers = ServerRegistry(redis, keys)
        self.client_factory = client_factory
        self.snapshot: Snapshot | None = None
        self.in_flight: dict[str, int | None] = {}  # server id -> target (None: draining)
        self.tasks: set[asyncio.Task[None]] = set()
        self.groups: dict[str, UpdateGroup] = {}
        self.failed_at: dict[tuple[str, int], float] = {}  # (server, version) -> time of failure
        self.attempted: dict[str, int] = {}       # server -> newest version tried (ok or not)
        self.verified: dict[int, str] = {}        # version -> verified path
        self.refused: dict[int, tuple[float, str]] = {}  # version -> (time, reason)
        self.history: deque[UpdateResult] = deque(maxlen=1000)
        self.metrics: dict[str, float] = {
            "updates_ok": 0, "updates_failed": 0, "drain_timeouts": 0,
            "episodes_version_changed": 0, "bytes_sent": 0, "versions_refused": 0,
            "versions_deleted": 0,
        }
        self._wake = asyncio.Event()
        self._offer_seen = True
        self._stop = False
        self._clients: dict[str, Any] = {}

    # -- public -------------------------------------------------------------------------
    def offer(self, snap: Snapshot) -> None:
        """Hand over the newest version's tensors (distributed transport)."""
        if self.snapshot is None or snap.version >= self.snapshot.version:
            self.snapshot = snap
            self._offer_seen = False
        self._wake.set()

    def sending(self, version: int) -> bool:
        """True until a step has seen the offer of `version`, and while updates to it are past
        their drain (broadcasting); False once only drains (or nothing) remain."""
        if self.snapshot is not None and self.snapshot.version == version and not self._offer_seen:
            return True
        return any(v == version for v in self.in_flight.values())

    def wake(self) -> None:
        self._wake.set()

    def trust(self, version: int, path: str) -> None:
        """A checkpoint this process has just written and hashed (skips re-verification)."""
        self.verified[version] = path

    async def run(self) -> None:
        log.info("coordinator_started", transport=self.cfg.transport, max_updating=self.cfg.max_updating)
        try:
            while not self._stop:
                try:
                    await self.step()
                except Exception as e:  # Redis blips etc.: log and go on
                    log.exception("coordinator_step_failed", error=repr(e))
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), self.cfg.poll_interval_s)
                self._wake.clear()
        finally:
            await self.aclose()

    def stop(self) -> None:
        self._stop = True
        self._wake.set()

    async def aclose(self) -> None:
        for t in list(self.tasks):
            t.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        for sid in list(self.groups):
            await self._drop_group(sid)
        for c in self._clients.values():
            with contextlib.suppress(Exception):
                await c.aclose()
        self._clients.clear()

    async def rolled(self, version: int) -> bool:
        """True when every live server is at >= version or has tried it (and failed)."""
        if self.in_flight:
            return False
        for s in await self.servers.list(alive_only=True):
            if (s.version or 0) >= version and s.state == "ready":
                continue
            if self.attempted.get(s.id, -1) >= version:
                continue
            if version in self.refused:
                continue
            return False
        return True

    # -- one pass -----------------------------------------------------------------------
    async def step(self) -> None:
        offered = self.snapshot
        try:
            await self._step()
        finally:
            if offered is not None and offered is self.snapshot:
                self._offer_seen = True

    async def _step(self) -> None:
        current = await self.policy.current()
        servers = await self.servers.list(alive_only=True)
        await self._forget_gone(servers)
        await self._retain(servers)
        snap = self.snapshot
        if snap is not None and (snap.version < current or (
                not self.in_flight and all((x.version or 0) >= snap.version for x in servers))):
            self.snapshot = None  # delivered (or superseded): late servers load from disk
        ready = [s for s in servers if s.state == "ready"]
        for s in servers:
            if len(self.in_flight) >= self.cfg.max_updating:
                break
            if s.id in self.in_flight:
                continue
            target, transport = self._target(s, current)
            if target is None:
                continue
            serving = s.state == "ready"
            if serving and self.in_flight:
                # Keep min_ready servers taking pins (a lone server still gets updated).
                others = [r for r in ready if r.id != s.id and r.id not in self.in_flight]
                if len(others) < self.cfg.min_ready:
                    continue
            self.in_flight[s.id] = None if serving else target
            task = asyncio.create_task(self._update(s, target, transport, serving))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)

    def _target(self, s: ServerInfo, current: int) -> tuple[int | None, str]:
        snap = self.snapshot
        if (self.cfg.transport == "distributed" and snap is not None and s.state == "ready"
                and (s.version or 0) < snap.version):
            target, transport = snap.version, "distributed"
        else:
            target, transport = current, "disk"
        have = s.version if s.version is not None else -1
        if s.state == "ready" and have >= target:
            return None, transport
        if s.state == "draining":
            # Not ours (we are not updating it): the server is shutting down (it drains itself
            # on SIGTERM) or an operator drains it. Leave it alone.
            return None, transport
        # "updating" here (not in flight) was left by a coordinator that died mid-update:
        # take it over like any server behind.
        t_fail = self.failed_at.get((s.id, target))
        if t_fail is not None and time.monotonic() - t_fail < self.cfg.retry_failed_s:
            return None, transport
        refused = self.refused.get(target)
        if transport == "disk" and refused and time.monotonic() - refused[0] < self.cfg.retry_failed_s:
            return None, transport
        if transport == "disk" and target == 0 and s.state != "ready":
            return 0, "base"  # no version published yet: the base weights the server loaded
        return target, transport

    # -- one server ---------------------------------------------------------------------
    async def _update(self, s: ServerInfo, target: int, transport: str, serving: bool) -> None:
        t0 = time.monotonic()
        result = UpdateResult(s.id, target, False, transport, 0.0)
        touched = False
        try:
            manifest_path = None
            if transport == "disk":
                manifest_path = await self._checked(target)  # refuse before touching a server
                if manifest_path is None:
                    return
            client = self._client(s)
            touched = True
            if serving:
                await self.servers.set_state(s.id, "draining", version=s.version)
                result.drain_s, result.pins_at_update = await self._drain(s.id)
            # Draining can take long: load whatever is newest now, not what was newest then.
            snap = self.snapshot
            if transport == "disk":
                cur = await self.policy.current()
                if cur > target and (newer := await self._checked(cur)) is not None:
                    target, manifest_path = cur, newer
            elif transport == "distributed" and snap is not None and snap.version > target:
                target = snap.version
            result.version = target
            self.in_flight[s.id] = target  # from now on this version is in use
            await self.servers.set_state(s.id, "updating", version=s.version)
            async with asyncio.timeout(self.cfg.update_timeout_s):
                if transport == "disk":
                    ans = await client.update_weights_from_disk(
                        model_path=manifest_path, weight_version=str(target))
                    if isinstance(ans, dict) and ans.get("success") is False:
                        raise RefusedError(f"update_weights_from_disk: {ans.get('message')}")
                    result.bytes = int((await self.policy.manifest(target) or {}).get("bytes", 0))
                elif transport == "distributed":
                    if snap is None or snap.version != target:
                        raise RuntimeError(f"version {target} is no longer held in memory")
                    result.bytes = await self._send_distributed(s, client, snap)
            got = await asyncio.wait_for(client.get_weight_version(), self.cfg.verify_timeout_s)
            if transport != "base" and str(got) != str(target):
                raise RuntimeError(f"server reports weight_version {got!r} after the update, "
                                   f"expected {target!r}")
            await self.servers.set_state(s.id, "ready", version=target)
            result.ok = True
            self.metrics["updates_ok"] += 1
            self.metrics["bytes_sent"] += result.bytes
            self.failed_at.pop((s.id, target), None)
        except asyncio.CancelledError:
            # Stopped (learner exiting) while draining: give the server back to the actors.
            if touched and self.in_flight.get(s.id) is None and serving:
                with contextlib.suppress(Exception):
                    await asyncio.shield(self.servers.set_state(s.id, "ready", version=s.version))
            raise
        except Exception as e:
            result.error = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
            self.failed_at[(s.id, target)] = time.monotonic()
            self.metrics["updates_failed"] += 1
            if transport == "distributed":
                await self._drop_group(s.id)  # remade at the next update
            # The server said it kept its old weights: it may serve them again.
            back = "ready" if isinstance(e, RefusedError) and serving else "failed"
            with contextlib.suppress(Exception):
                await self.servers.set_state(s.id, back, version=s.version, error=result.error[:500])
        finally:
            self.attempted[s.id] = max(self.attempted.get(s.id, -1), target)
            self.in_flight.pop(s.id, None)
            result.duration_s = round(time.monotonic() - t0, 4)
            if touched:  # a refused checkpoint touched no server: logged by _checked
                self.history.append(result)
                await self._record(result)
            self._wake.set()

    async def _record(self, r: UpdateResult) -> None:
        fields = dict(server=r.server, version=r.version, transport=r.transport,
                      duration_s=r.duration_s, drain_s=round(r.drain_s, 3), bytes=r.bytes,
                      pins_at_update=r.pins_at_update)
        if r.ok:
            log.info("server_updated", **fields)
        else:
            log.error("server_update_failed", **fields, error=r.error)
        with contextlib.suppress(Exception):
            pipe = self.redis.pipeline(transaction=False)
            pipe.hincrby(self.keys.stats, "weights_updates_ok" if r.ok else "weights_updates_failed", 1)
            if r.pins_at_update:
                pipe.hincrby(self.keys.stats, "weights_episodes_version_changed", r.pins_at_update)
            await pipe.execute()

    async def _drain(self, sid: str) -> tuple[float, int]:
        """Wait for the server's pins to end; returns (seconds waited, pins still held)."""
        t0 = time.monotonic()
        deadline = t0 + self.cfg.drain_timeout_s
        while True:
            n = await self.servers.pin_count(sid)
            if n == 0:
                return time.monotonic() - t0, 0
            if time.monotonic() >= deadline:
                self.metrics["drain_timeouts"] += 1
                if self.cfg.drain_timeout_action == "proceed":
                    self.metrics["episodes_version_changed"] += n
                    log.warning("drain_timeout_proceed", server=sid, pins=n)
                    return time.monotonic() - t0, n
                log.warning("drain_timeout_waiting", server=sid, pins=n,
                            waited_s=round(time.monotonic() - t0, 1))
                deadline += self.cfg.drain_timeout_s
            await asyncio.sleep(min(0.2, self.cfg.poll_interval_s))

    async def _checked(self, version: int) -> str | None:
        """The verified checkpoint path of `version`, or None (refused, logged) — checked once
        per version by this coordinator, before any server is drained."""
        if version in self.verified:
            return self.verified[version]
        manifest = await self.policy.manifest(version)
        try:
            path = await asyncio.to_thread(disk.verify, manifest, version)
        except disk.CheckpointError as e:
            if version not in self.refused:
                self.metrics["versions_refused"] += 1
            self.refused[version] = (time.monotonic(), str(e))
            log.error("checkpoint_refused", version=version, error=str(e))
            return None
        self.refused.pop(version, None)
        self.verified[version] = str(path)
        return str(path)

    # -- distributed --------------------------------------------------------------------
    async def _send_distributed(self, s: ServerInfo, client: Any, snap: Snapshot) -> int:
        group = self.groups.get(s.id)
        if group is None:
            backend = self.cfg.backend
            if backend == "auto":
                backend = "nccl" if snap.device == "cuda" else "gloo"
            group = UpdateGroup(
                name=f"swarl-{self.keys.run}-{s.id}".replace(":", "_"), members=[s.id],
                clients=[client], tp_sizes=[s.meta.tp_size if s.meta else 1], backend=backend,
                master_address=self.cfg.master_address, timeout_s=self.cfg.group_timeout_s,
                device="cuda" if backend == "nccl" else "cpu",
                prefix_store=self.cfg.group_store_prefix)
            await group.connect()
            self.groups[s.id] = group
        return await group.send(snap.tensors, snap.version, int(self.cfg.bucket_mb * (1 << 20)))

    async def _drop_group(self, sid: str) -> None:
        g = self.groups.pop(sid, None)
        if g is not None:
            with contextlib.suppress(Exception):
                await g.close()

    async def _forget_gone(self, servers: list[ServerInfo]) -> None:
        """Groups of servers that left or restarted (registered again as starting) go."""
        by_id = {s.id: s for s in servers}
        for sid in list(self.groups):
            s = by_id.get(sid)
            if sid in self.in_flight:
                continue
            if s is None or s.state in ("starting", "failed"):
                await self._drop_group(sid)
        for sid in list(self._clients):
            if sid not in by_id and sid not in self.in_flight:
                c = self._clients.pop(sid)
                with contextlib.suppress(Exception):
                    await c.aclose()

    def _client(self, s: ServerInfo) -> Any:
        c = self._clients.get(s.id)
        if c is None or getattr(c, "url", s.url) != s.url:
            c = self._clients[s.id] = self.client_factory(s.url)
        return c

    # -- retention ----------------------------------------------------------------------
    async def _retain(self, servers: list[ServerInfo]) -> None:
        """Keep the newest keep_versions checkpoints; delete older ones only when no live
        server is at them and none is being updated to them."""
        on_disk = disk.on_disk_versions(self.run_dir)
        if len(on_disk) <= self.cfg.keep_versions:
            return
        current = await self.policy.current()
        in_use = {s.version for s in servers if s.version is not None}
        in_use |= {v for v in self.in_flight.values() if v is not None}
        in_use.add(current)
        for v in on_disk[: -self.cfg.keep_versions]:
            if v in in_use:
                continue
            await self.policy.delete_manifest(v)
            await asyncio.to_thread(disk.delete_version, self.run_dir, v)
            self.verified.pop(v, None)
            self.metrics["versions_deleted"] += 1
            log.info("checkpoint_deleted", version=v)


class CoordinatorThread:
    """Runs a Coordinator on its own thread and event loop (inside the learner process)."""

    def __init__(self, make: Callable[[], Coordinator], redis_close: Callable[[], Any] | None = None
                 ) -> None:
        self._make = make
        self._ready = threading.Event()
        self.loop: asyncio.AbstractEventLoop | None = None
        self.coordinator: Coordinator | None = None
        self._thread = threading.Thread(target=self._main, name="weight-sync-coordinator", daemon=True)
        self._error: BaseException | None = None

    def start(self) -> None:
        self._thread.start()
        self._ready.wait(30)
        if self._error:
            raise self._error

    def _main(self) -> None:
        torch.set_num_threads(min(2, os.cpu_count() or 1))
        loop = asyncio.new_event_loop()
        self.loop = loop
        asyncio.set_event_loop(loop)
        try:
            self.coordinator = self._make()
        except BaseException as e:
            self._error = e
            self._ready.set()
            return
        self._ready.set()
        try:
            loop.run_until_complete(self.coordinator.run())
        finally:
            with contextlib.suppress(Exception):
                loop.run_until_complete(self.coordinator.redis.aclose())
            loop.close()

    def call(self, fn: Callable[[], Any]) -> None:
        assert self.loop is not None
        self.loop.call_soon_threadsafe(fn)

    def submit(self, coro: Any) -> concurrent.futures.Future[Any]:
        assert self.loop is not None
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    async def wait_rolled(self, version: int, timeout_s: float) -> bool:
        """Await (from another loop) until `version` has been tried on every live server."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            assert self.coordinator is not None
            fut = self.submit(self.coordinator.rolled(version))
            if await asyncio.wrap_future(fut):
                return True
            await asyncio.sleep(0.1)
        return False

    async def wait_quiet(self, version: int, timeout_s: float) -> None:
        """Await (from another loop) until the coordinator is not broadcasting `version`."""
        assert self.coordinator is not None and self.loop is not None
        coord, loop = self.coordinator, self.loop
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            fut = asyncio.run_coroutine_threadsafe(_call(coord.sending, version), loop)
            if not await asyncio.wrap_future(fut):
                return
            await asyncio.sleep(0.02)

    def stop(self, timeout_s: float = 30.0) -> None:
        if self.coordinator is not None and self.loop is not None and not self.loop.is_closed():
            with contextlib.suppress(RuntimeError):
                self.loop.call_soon_threadsafe(self.coordinator.stop)
        self._thread.join(timeout_s)


async def _call(fn: Callable[..., Any], *args: Any) -> Any:
    return fn(*args)
