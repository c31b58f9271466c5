"""The rolling update: bring every live inference server to the newest policy version, a few
at a time, so rollout never stops as a whole and no pinned episode sees its version change.

Per server: draining (the pin script skips it) → wait until its pins reach 0 (or
drain_timeout_s: "wait" longer, or "proceed" and count the episodes that change version) →
updating → load the version through a transport → the weight_version on /model_info must equal
the target → ready at the target. At most max_updating servers load at once. Draining a server that still takes
new pins (one at the newest version any ready server has) costs rollout capacity: at most
max_updating of those are under way at once, and only while min_ready others stay ready. A server
behind a ready one takes no new pins (the pin script prefers the newest version), so draining it
costs nothing and is not limited: every such server drains at once and loads as soon as it is
empty. Otherwise one straggler pinned on a server behind held every other update back (with
max_updating 1 the newest version reached its first server 5-13 s after publication at
max_staleness 2, and every episode pinned meanwhile started a version behind). Of the servers that
cost capacity, the fewest pins go first: their drain is the shortest.

weight_sync.rollout_mode in-flight: no drain. A server behind is set "updating" (no new pins),
its generation paused (PAUSE_MODE, below: its running requests wait, none is cut), the version
loaded through the transport and checked, generation continued. Episodes pinned to it go on under
the new version; their actors record the version of every token (SGLang's weight_versions spans).
max_updating and min_ready bound the servers paused at once as they bound drains. A pinned drain
that times out with drain_timeout_action "proceed" pauses the same way: SGLang loads each bucket
into the live model as it arrives, holds its writer lock per HTTP call only and labels the version
only with the last bucket, so an episode still pinned would otherwise get turns on a half-loaded
model that report the old version.

Which transport (weight_sync/transports/): a ready server behind the version held in memory gets
it over its distributed group; every other server (one that registers or restarts, one whose
update failed, every server with the disk transport) loads the newest verified checkpoint; while
nothing is published a starting server keeps its base weights. A version a transport cannot
deliver (a checkpoint that fails verification) is refused before any server is touched and
looked at again after retry_failed_s. A failed update leaves no episode running on a mix of
two versions. When the server answered that it kept its old weights (ServerRefused: a refused
session, group or first bucket) it goes back to "ready" at its old version and, if it was
paused, generation continues. Any other failure may have left some buckets loaded: the server
is "failed", and if it was paused it stays paused (held) until it has been loaded from disk,
which happens at the next step, or once a checkpoint is recorded (the base weights are no way
back); generation is continued after every good load of a server that was not serving. Either
way the run goes on. A server whose update
over its distributed group failed (it refused, died, or was slow to begin its session; see
weight_sync.update_group) is not given that version over the group again: it loads it from disk,
at once if the checkpoint is recorded, else as soon as it is.

The draining and updating states are leased (weight_sync.lease_s, renewed while this
coordinator works on the server): if the coordinator dies — the learner killed mid-publish — the
lease lapses, the pin script treats the server as ready at the version it reports, and the next
coordinator takes the server over like any server behind. No server is left draining forever.
A version is only ever loaded from a checkpoint written whole (temp dir + rename) and verified
against its manifest's sha256 (transports/disk.py), so a publish cut short loads nothing.

Only policy servers are ours: a server registered with role "prm" (a process reward model's
judge) keeps its own weights and version, and is never drained, updated or counted here.

A server whose registered meta is missing or invalid (ServerInfo.meta is None) has no known
tensor-parallel size, which is the world size of its group: it is never given a group with a
guessed size. It is updated from disk instead (the checkpoint is written either way), logged
once as an error, counted in servers_meta_invalid, and the reason is left in its registry entry.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import redis.asyncio as aioredis

from broker.evals import EvalBoard
from broker.keys import Keys
from broker.registry import PolicyRegistry, ServerInfo, ServerRegistry
from common.logs import get_logger
from weight_sync import checkpoints
from weight_sync.config import WeightSyncConfig
from weight_sync.protocols import (
    ClientFactory,
    ServerClient,
    ServerRefused,
    Transport,
    VersionRefused,
)
from weight_sync.transports.base import BaseWeights
from weight_sync.transports.disk import DiskTransport
from weight_sync.transports.distributed import DistributedTransport, Snapshot

log = get_logger("weight_sync")

# In-flight mode pauses a server around its load with SGLang 0.5.23's "retract": its running
# requests go back to the queue and stay there (none is cut), their KV cache is dropped and made
# again under the new weights when generation continues. "in_place" keeps the old KV cache, and
# the update's flush_cache then fails the call; "abort" would cut every running turn.
PAUSE_MODE = "retract"


@dataclass
class UpdateResult:
    server: str
    version: int
    ok: bool
    transport: str
    from_state: str  # the server's state when the coordinator took it ("starting": it joined)
    from_version: int | None
    duration_s: float = 0.0
    drain_s: float = 0.0
    bytes: int = 0
    pins_at_update: int = 0
    error: str = ""
    time: float = field(default_factory=time.time)


def default_client_factory(api_key: str | None, timeout_s: float) -> ClientFactory:
    def make(url: str) -> ServerClient:
        from inference.client import SGLangClient

        return SGLangClient(url, api_key=api_key, timeout_s=timeout_s, retries=1)

    return make


class Coordinator:
    def __init__(self, cfg: WeightSyncConfig, redis: aioredis.Redis, keys: Keys, run_dir: str,
                 client_factory: ClientFactory, eval_every: int = 0) -> None:
        self.cfg, self.redis, self.keys, self.run_dir = cfg, redis, keys, run_dir
        self.eval_every = eval_every  # eval.every_versions: versions due for evaluation stay on disk
        self.policy = PolicyRegistry(redis, keys)
        self.servers = ServerRegistry(redis, keys)
        self.client_factory = client_factory
        self.disk = DiskTransport(self.policy)
        self.base = BaseWeights()
        self.distributed = (DistributedTransport(cfg, keys.run, redis, keys.weight_groups)
                            if cfg.transport == "distributed" else None)
        self.in_flight: dict[str, int | None] = {}  # server id -> target (None: draining)
        self.costly: set[str] = set()  # in flight while taking pins would have cost capacity
        self._loads = asyncio.Semaphore(cfg.max_updating)
        self.tasks: set[asyncio.Task[None]] = set()
        self.failed_at: dict[tuple[str, int, str], float] = {}  # (server, version, transport) -> time
        self.dist_failed: dict[str, int] = {}     # server -> version its distributed update failed at
        self.attempted: dict[str, int] = {}       # server -> newest version tried (ok or not)
        self.refused: dict[tuple[str, int], tuple[float, str]] = {}  # (transport, version) -> (time, reason)
        self.meta_invalid: set[str] = set()       # servers told (logged) that they get no group
        self.held: set[str] = set()               # paused by us; a failed load keeps them so (_paused)
        self.history: deque[UpdateResult] = deque(maxlen=1000)
        self.metrics: dict[str, float] = {
            "updates_ok": 0, "updates_failed": 0, "drain_timeouts": 0,
            "episodes_version_changed": 0, "bytes_sent": 0, "versions_refused": 0,
            "versions_deleted": 0, "servers_meta_invalid": 0, "paused_s": 0.0, "pause_max_s": 0.0,
            "held_paused": 0,
        }
        self._wake = asyncio.Event()
        self._unseen_offer: int | None = None  # offered, not yet looked at by a step
        self._stop = False
        self._clients: dict[str, ServerClient] = {}

    @property
    def transports(self) -> list[Transport[Any]]:
        return [t for t in (self.disk, self.base, self.distributed) if t is not None]

    # -- public -------------------------------------------------------------------------
    def offer(self, snap: Snapshot) -> None:
        """Hand over the newest version's tensors (distributed transport)."""
        if self.distributed is None:
            raise RuntimeError("offer(): weight_sync.transport is disk; only the distributed "
                               "transport holds versions in memory")
        if self.distributed.offer(snap):
            self._unseen_offer = snap.version
        self._wake.set()

    def sending(self, version: int) -> bool:
        """True until a step has seen the offer of `version`, and while updates to it are past
        their drain (loading); False once only drains (or nothing) remain."""
        return self._unseen_offer == version or any(v == version for v in self.in_flight.values())

    def wake(self) -> None:
        self._wake.set()

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
        for transport in self.transports:
            await transport.aclose()
        for c in self._clients.values():
            with contextlib.suppress(Exception):
                await c.aclose()
        self._clients.clear()

    async def rolled(self, version: int) -> bool:
        """True when every live server is at >= version or has tried it (and failed), or the
        version was refused."""
        if self.in_flight:
            return False
        refused = any(v == version for _, v in self.refused)
        for s in await self.servers.list(alive_only=True, role="policy"):
            if (s.version or 0) >= version and s.state == "ready":
                continue
            if self.attempted.get(s.id, -1) >= version or refused:
                continue
            return False
        return True

    # -- one pass -----------------------------------------------------------------------
    async def step(self) -> None:
        unseen = self._unseen_offer
        try:
            await self._step()
        finally:
            if unseen is not None and self._unseen_offer == unseen:
                self._unseen_offer = None

    async def _step(self) -> None:
        current = await self.policy.current()
        servers = await self.servers.list(alive_only=True, role="policy")
        await self._forget(servers)
        await self._retain(servers)
        self._release_delivered(servers, current)
        ready = [s for s in servers if s.state == "ready"]
        # the newest version a ready server offers new pins (see the module doc)
        top = max((_version(r) for r in ready if r.id not in self.in_flight), default=-1)
        # the fewest pins first (the shortest drain), then the furthest behind
        for s in sorted(servers, key=lambda s: (s.pins, _version(s))):
            if s.id in self.in_flight:
                continue
            plan = self._plan(s, current)
            if plan is None:
                continue
            transport, target = plan
            serving = s.state == "ready"
            costly = serving and _version(s) >= top
            if costly:
                if len(self.costly) >= self.cfg.max_updating:
                    continue
                if self.in_flight:
                    # Keep min_ready servers taking pins (a lone server still gets updated).
                    others = [r for r in ready if r.id != s.id and r.id not in self.in_flight]
                    if len(others) < self.cfg.min_ready:
                        continue
                self.costly.add(s.id)
            self.in_flight[s.id] = None if serving else target
            task = asyncio.create_task(self._update(s, transport, target, serving))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)

    def _plan(self, s: ServerInfo, current: int) -> tuple[Transport[Any], int] | None:
        """The transport and version that bring `s` forward now; None when it is up to date,
        not ours to update, or waiting out a failure or a refusal."""
        if s.state == "draining" and not s.lapsed:
            # Not ours (we are not updating it): the server is shutting down (it drains itself
            # on SIGTERM) or an operator drains it. Leave it alone. A lapsed drain was a dead
            # coordinator's: taken over below.
            return None
        # "updating" here (not in flight) was left by a coordinator that died mid-update:
        # take it over like any server behind.
        transport, target = self._transport_for(s, current)
        if transport is self.base and s.id in self.held:
            return None  # held paused on mixed weights: only a checkpoint can bring it back
        have = s.version if s.version is not None else -1
        if s.state == "ready" and have >= target:
            return None
        now = time.monotonic()
        t_fail = self.failed_at.get((s.id, target, transport.name))
        if t_fail is not None and now - t_fail < self.cfg.retry_failed_s:
            return None
        refused = self.refused.get((transport.name, target))
        if refused is not None and now - refused[0] < self.cfg.retry_failed_s:
            return None
        return transport, target

    def _transport_for(self, s: ServerInfo, current: int) -> tuple[Transport[Any], int]:
        dist = self.distributed
        held = dist.held if dist is not None else None
        if dist is not None and held is not None and s.state == "ready" and (s.version or 0) < held \
                and self.dist_failed.get(s.id) != held:
            if s.meta is not None:
                return dist, held
            self._no_group(s)
        if current == 0 and s.state != "ready":
            return self.base, 0  # nothing published yet: the base weights the server loaded
        return self.disk, current

    def _no_group(self, s: ServerInfo) -> None:
        if s.id in self.meta_invalid:
            return
        self.meta_invalid.add(s.id)
        self.metrics["servers_meta_invalid"] += 1
        log.error("server_meta_invalid", server=s.id, error=s.meta_error or "no meta",
                  action="updated from disk: no distributed group without its tp_size")

    def _release_delivered(self, servers: list[ServerInfo], current: int) -> None:
        dist = self.distributed
        held = dist.held if dist is not None else None
        if dist is None or held is None:
            return
        if held < current or (not self.in_flight and all((s.version or 0) >= held for s in servers)):
            dist.release()  # delivered (or superseded): later servers load from disk

    # -- one server ---------------------------------------------------------------------
    async def _update(self, s: ServerInfo, transport: Transport[Any], target: int, serving: bool) -> None:
        t0 = time.monotonic()
        result = UpdateResult(s.id, target, False, transport.name, s.state, s.version)
        touched = False
        if s.lapsed:
            log.warning("server_lease_lapsed_taken_over", server=s.id, state=s.state, version=s.version)
        done = asyncio.Event()
        lease = asyncio.create_task(self._keep_lease(s.id, done))
        try:
            try:
                payload = await self._prepare(transport, target)  # before touching the server
            except VersionRefused:
                return
            client = self._client(s)
            touched = True
            in_flight = serving and self.cfg.rollout_mode == "in-flight"
            if serving and not in_flight:
                await self.servers.set_state(s.id, "draining", version=s.version, lease_s=self.cfg.lease_s)
                result.drain_s, result.pins_at_update = await self._drain(s.id)
            # Episodes still pinned (in-flight, or a drain that timed out with "proceed") would
            # otherwise get turns between two buckets, on a half-loaded model: SGLang holds its
            # writer lock per call only, and generate needs only the reader lock.
            pause = in_flight or result.pins_at_update > 0
            async with self._loads:  # at most max_updating loads at once
                # Draining can take long: load whatever is newest now, not what was newest then.
                newest = await transport.newest()
                if newest is not None and newest > target:
                    with contextlib.suppress(VersionRefused):
                        payload, target = await self._prepare(transport, newest), newest
                result.version = target
                self.in_flight[s.id] = target  # from now on this version is in use
                # verified and "ready" (or marked failed) before the next load starts: a server
                # is "updating" (out of service) until then, and max_updating bounds those
                try:
                    await self.servers.set_state(s.id, "updating", version=s.version,
                                                 lease_s=self.cfg.lease_s)
                    async with self._paused(s.id, client, pause):
                        if in_flight:
                            result.pins_at_update = await self.servers.pin_count(s.id)
                        async with asyncio.timeout(self.cfg.update_timeout_s):
                            result.bytes = await transport.load(s, client, target, payload)
                        got = await asyncio.wait_for(client.get_weight_version(), self.cfg.verify_timeout_s)
                    if transport.sets_version and str(got) != str(target):
                        raise RuntimeError(f"server reports weight_version {got!r} after the update, "
                                           f"expected {target!r}")
                    note = ""
                    if s.id in self.meta_invalid:
                        note = f"loaded from disk, not over distributed: {s.meta_error or 'no meta'}"
                    if not serving:
                        await self._resume(s.id, client)
                    await self.servers.set_state(s.id, "ready", version=target, error=note[:500])
                except Exception as e:
                    await self._failed(s, transport, target, serving, result, e)
                    return
            result.ok = True
            self.metrics["updates_ok"] += 1
            self.metrics["bytes_sent"] += result.bytes
            self.failed_at.pop((s.id, target, transport.name), None)
            if transport is self.distributed:
                self.dist_failed.pop(s.id, None)
        except asyncio.CancelledError:
            # Stopped (learner exiting) while draining: give the server back to the actors.
            if touched and self.in_flight.get(s.id) is None and serving:
                with contextlib.suppress(Exception):
                    await asyncio.shield(self.servers.set_state(s.id, "ready", version=s.version))
            raise
        except Exception as e:  # while draining (the load's own failures are handled in its slot)
            await self._failed(s, transport, target, serving, result, e)
        finally:
            done.set()  # stopped by the event, not cancel(): see broker.tasks._renew_claim
            with contextlib.suppress(BaseException):
                await asyncio.shield(lease)
            self.attempted[s.id] = max(self.attempted.get(s.id, -1), target)
            self.in_flight.pop(s.id, None)
            self.costly.discard(s.id)
            result.duration_s = round(time.monotonic() - t0, 4)
            if touched:  # a refused version touched no server: logged by _prepare
                self.history.append(result)
                await self._record(result)
            self._wake.set()

    @contextlib.asynccontextmanager
    async def _paused(self, sid: str, client: ServerClient, pause: bool) -> AsyncIterator[None]:
        """Generation paused around the load (PAUSE_MODE, see the module doc) while episodes are
        pinned to the server. Continued when the load succeeded, or failed with the server's
        word that it kept its old weights (ServerRefused). Any other failure may have left a mix
        of two versions in the live model (SGLang loads each bucket as it arrives, and labels
        the version only with the last): generation stays paused (`held`, counted in
        held_paused) until a load from disk succeeds (_resume). The pause is bounded by
        verify_timeout_s; a server that does not continue within it fails the update."""
        if not pause:
            yield
            return
        t0 = time.monotonic()
        await asyncio.wait_for(client.pause_generation(PAUSE_MODE), self.cfg.verify_timeout_s)
        self.held.add(sid)
        ok, resume = False, True
        try:
            yield
            ok = True
        except ServerRefused:
            raise
        except BaseException:
            resume = False
            raise
        finally:
            if resume:
                try:
                    await asyncio.shield(asyncio.wait_for(client.continue_generation(), self.cfg.verify_timeout_s))
                    self.held.discard(sid)
                except Exception as e:
                    log.error("continue_generation_failed", server=sid, error=repr(e))
                    if ok:
                        raise RuntimeError(f"continue_generation failed after the load: {e!r}") from e
            else:
                self.metrics["held_paused"] += 1
                log.error("generation_held_paused", server=sid,
                          why="the update failed after weights were sent: no turn runs on a mix of "
                              "versions; generation continues once it is loaded from disk")
            paused_s = time.monotonic() - t0
            self.metrics["paused_s"] += paused_s
            self.metrics["pause_max_s"] = max(self.metrics["pause_max_s"], paused_s)

    async def _resume(self, sid: str, client: ServerClient) -> None:
        """After a good load of a server that was not serving: continue its generation, which a
        failed update may have left paused (this coordinator's, or a dead one's: SGLang's
        continue_generation is harmless on a server that is not paused). Bounded; a server
        held paused that does not continue fails the update."""
        try:
            await asyncio.wait_for(client.continue_generation(), self.cfg.verify_timeout_s)
        except Exception as e:
            if sid in self.held:
                raise RuntimeError(f"continue_generation failed after the reload: {e!r}") from e
            log.warning("continue_generation_failed", server=sid, error=repr(e))
            return
        if sid in self.held:
            self.held.discard(sid)
            log.info("generation_continued_after_reload", server=sid)

    async def _failed(self, s: ServerInfo, transport: Transport[Any], target: int, serving: bool,
                      result: UpdateResult, e: Exception) -> None:
        """An update of `s` to `target` failed: remembered (tried again after retry_failed_s),
        and the server leaves "draining"/"updating" at its old version."""
        result.error = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
        self.failed_at[(s.id, target, transport.name)] = time.monotonic()
        if transport is self.distributed:
            self.dist_failed[s.id] = target  # this version reaches it from disk (see _transport_for)
        self.metrics["updates_failed"] += 1
        try:
            await transport.forget(s.id)  # e.g. a broken group: made again at the next update
        except Exception as fe:  # the server's state below matters more
            log.warning("transport_forget_failed", server=s.id, error=repr(fe))
        # The server said it kept its old weights: it may serve them again.
        back = "ready" if isinstance(e, ServerRefused) and serving else "failed"
        with contextlib.suppress(Exception):
            await self.servers.set_state(s.id, back, version=s.version, error=result.error[:500])

    async def _keep_lease(self, sid: str, done: asyncio.Event) -> None:
        """Renew the draining/updating lease until the update ends (a state without a lease,
        e.g. ready, ignores it)."""
        every = self.cfg.lease_s / 4
        while not done.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(done.wait(), every)
            if not done.is_set():
                with contextlib.suppress(Exception):
                    await self.servers.renew_lease(sid, self.cfg.lease_s)

    async def _prepare(self, transport: Transport[Any], version: int) -> Any:
        """What `transport` needs to load `version`; a refusal is logged, counted and
        remembered (the version is looked at again after retry_failed_s)."""
        key = (transport.name, version)
        try:
            payload = await transport.prepare(version)
        except VersionRefused as e:
            if key not in self.refused:
                self.metrics["versions_refused"] += 1
            self.refused[key] = (time.monotonic(), str(e))
            log.error("version_refused", version=version, transport=transport.name, error=str(e))
            raise
        self.refused.pop(key, None)
        return payload

    async def _record(self, r: UpdateResult) -> None:
        fields = dict(server=r.server, version=r.version, transport=r.transport,
                      from_state=r.from_state, from_version=r.from_version,
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

    async def _forget(self, servers: list[ServerInfo]) -> None:
        """What the transports keep for a server (its group) goes when the server leaves,
        restarts (registers again as starting) or fails; its client goes when it leaves."""
        by_id = {s.id: s for s in servers}
        self.meta_invalid &= {s.id for s in servers if s.meta is None}
        self.held &= {s.id for s in servers if s.state != "starting"} | set(self.in_flight)
        for sid in list(self._clients):
            if sid in self.in_flight:
                continue
            s = by_id.get(sid)
            if s is None or s.state in ("starting", "failed"):
                for transport in self.transports:
                    await transport.forget(sid)
            if s is None:
                c = self._clients.pop(sid)
                with contextlib.suppress(Exception):
                    await c.aclose()

    def _client(self, s: ServerInfo) -> ServerClient:
        c = self._clients.get(s.id)
        if c is None or c.url != s.url:
            c = self._clients[s.id] = self.client_factory(s.url)
        return c

    # -- retention ----------------------------------------------------------------------
    async def _retain(self, servers: list[ServerInfo]) -> None:
        """Keep the newest keep_versions checkpoints; delete older ones only when no live
        server is at them, none is being updated to them and (with eval.every_versions) no
        evaluation of them is due: the schedule is brought up to date first, so a due version is
        never deleted before an eval worker has seen it. A stalled eval worker thus holds every
        every_versions-th checkpoint (`swarl status` lists the pending evaluations)."""
        on_disk = checkpoints.on_disk_versions(self.run_dir)
        if len(on_disk) <= self.cfg.keep_versions:
            return
        current = await self.policy.current()
        in_use = {s.version for s in servers if s.version is not None}
        in_use |= {v for v in self.in_flight.values() if v is not None}
        in_use.add(current)
        if self.eval_every > 0:
            evals = EvalBoard(self.redis, self.keys)
            await evals.schedule(current, self.eval_every)
            in_use |= set(await evals.pending())
        for v in on_disk[: -self.cfg.keep_versions]:
            if v in in_use:
                continue
            await self.policy.delete_manifest(v)
            await asyncio.to_thread(checkpoints.delete_version, self.run_dir, v)
            self.disk.drop(v)
            self.metrics["versions_deleted"] += 1
            log.info("checkpoint_deleted", version=v)


def _version(s: ServerInfo) -> int:
    return s.version if s.version is not None else -1
