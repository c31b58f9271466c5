"""`swarl envd serve`: the exec daemon on one Docker node: containers, exec, diff, evaluate,
with auth, leases, limits, in-container timeouts, SWE-bench grading and Prometheus metrics.

Docker SDK calls block, so each runs in a worker thread under one sized limiter: many execs
proceed at once while the event loop stays free for heartbeats and health checks.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import secrets
import socket
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import anyio
import anyio.to_thread
from fastapi import FastAPI
from fastapi.responses import Response

from broker.config import RedisConfig
from broker.connection import connect
from broker.keys import Keys
from common.logs import get_logger
from envd import graded_run, httputil, referee, verdict
from envd.config import EnvdConfig
from envd.docker_backend import (
    LABEL_CREATED,
    LABEL_LEASE,
    LABEL_TTL,
    DockerBackend,
    ExecOutcome,
    NotFound,
    exec_seconds,
)
from envd.grade_cache import GradeCache, grade_key
from envd.httputil import ApiError
from envd.image_cache import ImageCache, NotPullable, PullFailed
from envd.image_index import ImageIndex
from envd.leases import LeaseStore, MemoryLeases, RedisLeases
from envd.metrics import CONTENT_TYPE_LATEST, EnvdMetrics, generate_latest
from envd.reuse import Ready, ResetError, ReusePool, capture, repo_dir, reset
from envd.schemas import (
    DIFF_TIMEOUT_S,
    ContainerReq,
    CreateReq,
    DiffReq,
    EvaluateReq,
    ExecReq,
    PullReq,
)
from envd.warm import WarmPool
from swe import grading, harness, tamper
from swe.rows import RowError, validate_row

log = get_logger("envd")

# The patch is what follows the mark: exec merges stderr into the output, and neither the login
# shell's complaints (a container whose processes are exhausted: "/etc/profile: fork: retry") nor
# git's warnings may end up in the patch; git's stderr goes to a file, shown only on failure and
# removed either way (a container kept for reuse must hold no file outside the repository).
DIFF_MARK = "\n>>>>> swarl patch\n"
DIFF_COMMAND = ("e=/tmp/.swarl-diff.err; git add -A >/dev/null 2>$e && printf '\\n>>>>> swarl patch\\n' "
                "&& git diff --cached 2>>$e; s=$?; [ $s -eq 0 ] || cat $e; rm -f $e; exit $s")
T = TypeVar("T")
EVAL_PATH = "/tmp/swarl_eval.sh"
APPLY_TIMEOUT_S = 120
PREPARE_S = 10  # what applying the patch and restoring the infrastructure add to a grading's timeout


def default_node_id(port: int) -> str:
    return f"{socket.gethostname()}-{port}"


ENDED_GRACE_S = 3.0


def _ended_answer(why: str) -> ExecOutcome:
    """What a command in a container its own commands ended gets (exec and diff alike)."""
    return ExecOutcome(returncode=-1, output=f"[envd: {why}]\n", timed_out=False, truncated=False,
                       duration_s=0.0, via="none")


@dataclass
class Owned:
    """A container this envd owns."""

    id: str
    name: str
    image: str
    lease: str
    ttl_s: float
    created: float
    last_used: float = field(default_factory=time.time)
    labels: dict[str, str] = field(default_factory=dict)  # the create's own (not swarl's)
    made_labels: dict[str, str] = field(default_factory=dict)  # its Docker labels
    reuse_cwd: str | None = None  # the repository a reset restores (envd.reuse); None: destroyed when done
    uses: int = 1                 # leases it served, this one included
    # when its last agent commands ran (wall clock, start and answer): a container that stopped
    # during one was stopped by it (Envd._ended_by_command)
    commands: collections.deque[tuple[float, float]] = field(default_factory=lambda: collections.deque(maxlen=4))
    ended: str | None = None      # why its commands are answered without running: it was ended from inside


class Envd:
    def __init__(self, ecfg: EnvdConfig, node_id: str, docker_url: str, keys: Keys,
                 redis: RedisConfig | None = None) -> None:
        self.ecfg = ecfg
        self.redis = redis
        self.node_id = node_id
        self.docker_url = docker_url
        self.keys = keys
        self.metrics = EnvdMetrics()
        self.limiter = anyio.CapacityLimiter(self.ecfg.exec_threads)
        self.backend: DockerBackend | None = None
        self.leases: LeaseStore = MemoryLeases()
        self.owned: dict[str, Owned] = {}
        self._reaper: asyncio.Task[None] | None = None
        self.images: ImageCache | None = None
        self.warm = WarmPool(ecfg.warm_per_image, ecfg.warm_max, ecfg.warm_idle_s,
                             self._make_warm, self._destroy_warm)
        self.reuse = ReusePool(ecfg.reuse_per_image, ecfg.reuse_max, ecfg.reuse_max_uses, ecfg.reuse_idle_s,
                               self._reset_one, self._destroy_unowned, self._on_reset)
        self.grade_cache = GradeCache(ecfg.grade_cache_entries, ecfg.grade_cache_ttl_s)

    # -- lifecycle -----------------------------------------------------------------
    async def start(self) -> None:
        self.backend = DockerBackend(self.ecfg, self.node_id, self.docker_url)
        if self.redis is not None and self.redis.url and self.ecfg.leases_in_redis:
            self.leases = RedisLeases(connect(self.redis.url, self.redis), self.keys, self.node_id)
        await self.reclaim()
        index_redis = connect(self.redis.url, self.redis) if self.redis is not None and self.redis.url else None
        self.images = ImageCache(self.ecfg, self.docker_url,
                                 ImageIndex(index_redis, self.keys, self.node_id), self.metrics)
        await self.images.start()
        self._reaper = asyncio.create_task(self._reap_loop(), name="envd-reaper")
        log.info("envd_started", node_id=self.node_id, docker=self.docker_url,
                 leases="redis" if isinstance(self.leases, RedisLeases) else "memory",
                 containers=len(self.owned))
        if self.ecfg.grader_off:
            log.warning("grader_layers_off", layers=list(self.ecfg.grader_off),
                        why="for tests of the other layers; rewards graded so are not to be trained on")

    async def stop(self) -> None:
        if self._reaper:
            self._reaper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reaper
        await self.warm.close()
        await self.reuse.close()
        if isinstance(self.leases, MemoryLeases) and self.owned:
            # In-memory leases die with this process, so nobody could renew these containers:
            # destroy them now rather than at the next start-up (which may never come).
            log.info("destroying_containers_on_shutdown", count=len(self.owned))
            await asyncio.gather(*(self._destroy(cid, "shutdown") for cid in list(self.owned)),
                                 return_exceptions=True)
        await self.leases.close()
        if self.images:
            await self.images.stop()
            if self.images.index.redis is not None:
                await self.images.index.redis.aclose()
        if self.backend:
            self.backend.close()

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        return await anyio.to_thread.run_sync(fn, *args, limiter=self.limiter)

    async def reclaim(self) -> None:
        """Adopt labelled containers a live lease owns; destroy the rest (orphans of a crash)."""
        assert self.backend
        found = await self.run(self.backend.owned)
        live = await self.leases.all()
        now = time.time()
        for c in found:
            exp = live.get(c["id"])
            labels = c["labels"]
            if exp is not None and exp > now:
                self.owned[c["id"]] = Owned(c["id"], c["name"], c["image"], labels.get(LABEL_LEASE, ""),
                                            float(labels.get(LABEL_TTL, self.ecfg.lease_ttl_s)),
                                            float(labels.get(LABEL_CREATED, now)))
            else:
                await self._destroy(c["id"], "orphan")
        for cid in set(live) - {c["id"] for c in found}:
            await self.leases.remove(cid)  # its container is gone already
        self.metrics.containers.set(len(self.owned))

    async def _reap_loop(self) -> None:
        while True:
            await asyncio.sleep(self.ecfg.reap_interval_s)
            try:
                for cid in await self.leases.expired(time.time()):
                    log.info("lease_expired", container_id=cid[:12])
                    await self._destroy(cid, "expired")
                await self.warm.sweep()
                await self.reuse.sweep()
            except Exception as e:  # keep reaping whatever one round hit
                log.error("reap_failed", error=repr(e))

    async def _destroy(self, cid: str, reason: str) -> bool:
        assert self.backend
        existed = await self.run(self.backend.destroy, cid)
        await self.leases.remove(cid)
        self.owned.pop(cid, None)
        self.metrics.destroyed.labels(reason).inc()
        self.metrics.containers.set(len(self.owned))
        return existed

    async def _make_warm(self, image: str) -> tuple[str, str, dict[str, str]] | None:
        assert self.backend and self.images
        with self.images.hold(image):
            try:
                made = await self.run(self.backend.create, image, "warm", self.ecfg.lease_ttl_s, None)
            except NotFound:  # the image left the node (a create pulls it; a refill does not)
                return None
        self.metrics.created.inc()
        return made

    async def _destroy_warm(self, cid: str) -> None:
        await self._destroy_unowned(cid, "warm")

    async def _destroy_unowned(self, cid: str, reason: str) -> None:
        """A container held by no lease (warm, or kept or reset for reuse)."""
        assert self.backend
        await self.run(self.backend.destroy, cid)
        self.metrics.destroyed.labels(reason).inc()

    async def _reset_one(self, cid: str, base: Any) -> None:
        assert self.backend
        await self.run(reset, self.backend, cid, base)

    def _on_reset(self, ok: bool, seconds: float) -> None:
        self.metrics.reuse_resets.labels("ok" if ok else "failed").inc()
        self.metrics.reuse_reset_seconds.observe(seconds)

    async def release(self, c: Owned) -> None:
        """The lease of `c` ended: kept for reuse (reset in the background) when it may be, else destroyed."""
        if c.reuse_cwd is not None and self.reuse.enabled and self.reuse.give_back(
                Ready(c.id, c.name, c.made_labels, c.uses), c.image, c.reuse_cwd):
            await self.leases.remove(c.id)
            self.owned.pop(c.id, None)
            self.metrics.containers.set(len(self.owned))
            return
        await self._destroy(c.id, "destroyed")

    async def _reuse_cwd(self, req: CreateReq, cid: str, reused: bool) -> str | None:
        """The repository a reset of this container would restore, its image's fresh state
        recorded first (from this very container, before anyone ran anything in it); None: the
        container is not to be reused."""
        assert self.backend
        if not (req.reuse and self.reuse.enabled):
            return None
        try:
            cwd = repo_dir(req.cwd)
            if not reused and self.reuse.baseline(req.image, cwd) is None:
                base = await self.run(capture, self.backend, cid, cwd, int(self.ecfg.reuse_max_repo_bytes))
                self.reuse.remember(req.image, cwd, base)
        except Exception as e:  # ResetError, or Docker failing: this container is simply not reused
            log.info("not_reusable", image=req.image, reason=f"{type(e).__name__}: {e}"[:300])
            return None
        return cwd

    def lookup(self, container_id: str) -> Owned:
        c = self.owned.get(container_id)
        if c is None and len(container_id) >= 12:  # docker's short ids and names work too
            c = next((o for o in self.owned.values()
                      if o.id.startswith(container_id) or o.name == container_id), None)
        if c is None:
            raise ApiError(404, f"unknown container {container_id} (not owned by envd {self.node_id})")
        return c

    async def touch(self, c: Owned) -> float:
        c.last_used = time.time()
        expiry = c.last_used + c.ttl_s
        await self.leases.renew(c.id, expiry)
        return expiry

    # -- operations ----------------------------------------------------------------
    async def create(self, req: CreateReq, shell: bool = True) -> dict[str, Any]:
        """`shell`: an agent's container, made with envd/shell.py's server when envd.exec_shell is
        on (a grading container never is)."""
        assert self.backend
        ttl = req.ttl_s or self.ecfg.lease_ttl_s
        lease = req.lease or f"envd-{int(time.time() * 1000)}"
        images = self.images
        assert images
        with images.hold(req.image):
            try:  # a missing image is pulled first (bounded by envd.pull_timeout_s)
                pull = await images.ensure(req.image)
            except PullFailed as e:  # the registry's fault, not the request's: infrastructure
                raise ApiError(502, str(e), image=req.image, reason="pull_failed") from None
            except NotPullable as e:
                raise ApiError(404, str(e), image=req.image) from None
            t0 = time.monotonic()
            reused = None
            if req.reuse and self.reuse.enabled:  # a container an earlier lease used, reset (envd.reuse)
                with contextlib.suppress(ResetError):
                    reused = self.reuse.take(req.image, repo_dir(req.cwd), await self.run(self.backend.image_id,
                                                                                           req.image))
                self.metrics.reuse_takes.labels("hit" if reused else "miss").inc()
            # a warm container is what the create below would make, made earlier (envd.warm);
            # a started container's labels cannot change: the request's are kept in /status
            warm = self.warm.take(req.image) if self.warm.enabled and req.warm and reused is None else None
            if self.warm.enabled and reused is None:
                self.metrics.warm_takes.labels("hit" if warm else "miss").inc()
            if reused is not None:
                cid, name, labels = reused.id, reused.name, reused.labels
            elif warm is not None:
                cid, name, labels = warm.id, warm.name, warm.labels
            else:
                # Bounded by the Docker client's timeout (envd.create_timeout_s); not cancelled
                # from here, since abandoning the thread could leak the container it is creating.
                try:
                    cid, name, labels = await self.run(self.backend.create, req.image, lease, ttl, req.labels,
                                                       shell and self.ecfg.exec_shell)
                except NotFound as e:
                    raise ApiError(404, str(e), image=req.image) from None
            create_s = time.monotonic() - t0
            await images.used(req.image)
        now = time.time()
        # Lease first-class from here on: a crash now leaves a labelled container the next
        # start-up either adopts (lease live) or destroys.
        await self.leases.put(cid, now + ttl)
        self.owned[cid] = c = Owned(cid, name, req.image, lease, ttl, now, labels=dict(req.labels),
                                    made_labels=dict(labels), uses=reused.uses + 1 if reused else 1)
        c.reuse_cwd = await self._reuse_cwd(req, cid, reused is not None)
        if warm is None and reused is None:
            self.metrics.created.inc()
        self.metrics.create_seconds.observe(create_s)
        self.metrics.containers.set(len(self.owned))
        log.info("container_created", container_id=cid[:12], image=req.image, lease=lease,
                 create_s=round(create_s, 3), pull_s=round(pull.seconds, 3), warm=warm is not None,
                 reused=reused is not None)
        return {"ok": True, "container_id": cid, "name": name, "node_id": self.node_id,
                "lease": lease, "expires": now + ttl, "labels": labels,
                "pulled": pull.pulled, "pull_s": round(pull.seconds, 3), "create_s": round(create_s, 3)}

    async def exec(self, c: Owned, command: str, cwd: str | None, env: dict[str, str],
                   timeout_s: float, cap: int | None = None, stderr: bool = True,
                   via_shell: bool = False) -> ExecOutcome:
        """One command in `c`; `via_shell`: an agent's (the API's exec and diff), through the
        container's shell server when it has one (envd.exec_shell); grading's own run by docker exec."""
        backend = self.backend
        assert backend
        await self.touch(c)
        if via_shell and c.ended is not None:
            return _ended_answer(c.ended)
        exec_id = secrets.token_hex(8)
        started = time.time()
        # Watchdog on the event loop (no thread per exec): if the stream outlives the timeout
        # plus grace, sweep the exec's processes so the blocked reader returns.
        loop = asyncio.get_running_loop()
        watchdog = loop.call_later(
            exec_seconds(timeout_s) + self.ecfg.kill_grace_s,
            lambda: loop.run_in_executor(None, backend.kill_exec, c.id, exec_id))
        try:
            out = await self.run(backend.exec, c.id, command, cwd, env, timeout_s,
                                 cap or self.ecfg.output_cap_bytes, exec_id, stderr, via_shell)
        except NotFound as e:
            self.metrics.execs.labels("error").inc()
            ended = await self._ended_by_command(c) if via_shell else None
            if ended is not None:  # the agent's own doing: its episode goes on to no patch
                c.ended, c.reuse_cwd = ended, None
                self.metrics.ended_by_command.inc()
                log.warning("container_ended_by_command", container_id=c.id[:12], lease=c.lease, why=ended)
                return _ended_answer(ended)
            await self._destroy(c.id, "gone")  # removed behind envd's back: forget it
            raise ApiError(404, str(e)) from None
        finally:
            watchdog.cancel()
        if via_shell:
            c.commands.append((started, time.time()))
        await self.touch(c)
        outcome = "timeout" if out.timed_out else ("ok" if out.returncode == 0 else "nonzero")
        self.metrics.execs.labels(outcome).inc()
        self.metrics.exec_via.labels(out.via).inc()
        self.metrics.exec_seconds.observe(out.duration_s)
        return out

    async def _ended_by_command(self, c: Owned) -> str | None:
        """Why `c` (found not running) was stopped by one of its own commands, or None when nothing
        shows it was: its main process ended while an agent command that got its answer ran, and
        the engine sent it no signal then (docker stop or kill, a daemon shutdown). Anything else
        (removed, stopped between commands, a dockerd restart) stays a lost container."""
        assert self.backend
        try:
            stopped = await self.run(self.backend.stopped, c.id)
        except Exception:  # the engine cannot say: not the agent's doing as far as envd knows
            return None
        if stopped is None:
            return None
        at, code = stopped
        for n, (t0, t1) in enumerate(reversed(c.commands)):
            # the engine notes the end after it happens (never before), and may note it after the
            # command's answer: a few seconds' grace after, none before
            if t0 <= at <= t1 + ENDED_GRACE_S:
                try:
                    if await self.run(self.backend.engine_stopped, c.id, t0, t1 + ENDED_GRACE_S):
                        return None
                except Exception:
                    return None
                which = "its last command" if n == 0 else f"the command {n + 1} before this one"
                return (f"this container has stopped: {which} ended its main process (exit code {code}); "
                        f"nothing more runs in it")
        return None

    async def evaluate(self, c: Owned, req: EvaluateReq) -> dict[str, Any]:
        if req.instance is None and req.eval_script is None:
            raise ApiError(422, "field 'eval_script': required when 'instance' is not given")
        timeout = min(req.timeout, self.ecfg.eval_timeout_s)
        reason = grading.check_patch(req.patch)
        base: dict[str, Any] = {"ok": True, "resolved": False, "returncode": None, "output": "",
                                "error": "", "timed_out": False, "tests_status": {},
                                "fail_to_pass": {}, "pass_to_pass": {}, "reward_hack": [],
                                "mode": "swebench" if req.instance is not None else "script", "cached": False}
        if req.instance is not None:
            instance, script = self._instance_script(req)
        else:
            instance, script = None, req.eval_script or ""
        if reason is not None:
            self.metrics.evaluations.labels("bad_patch").inc()
            return {**base, "error": f"patch rejected: {reason}"}
        found = [] if "static" in self.ecfg.grader_off else tamper.inspect_patch(req.patch, instance)
        if found:
            return {**base, **self._refuse(c, found)}
        await self.touch(c)
        if instance is None:
            c.reuse_cwd = None  # the script and patch land in /tmp of this container: not reused
            result = await self._run_eval(c, req.patch, script, req.cwd, timeout, reset=True)
            result.pop("log", None)
            result.pop("nonce", None)
            result.pop("referee", None)
        else:
            assert self.backend
            image_id = await self.run(self.backend.image_of, c.id)
            key = grade_key(image_id=image_id, cwd=req.cwd, instance=instance, script=script, patch=req.patch,
                            timeout_s=timeout, settings=[sorted(self.ecfg.grader_off), self.ecfg.memory,
                                                         self.ecfg.cpus, self.ecfg.pids_limit])
            result, how = await self.grade_cache.grade(
                key, lambda: self._grade_fresh(c, req, instance, script, timeout, image_id))
            self.metrics.grade_cache.labels(how).inc()
            result["cached"] = how in ("hit", "joined")
            if result["cached"] and result.get("reward_hack"):  # an attempt each time, as graded ones count
                self._count_refused([t.get("kind", "") for t in result["reward_hack"]])
        if not result.get("reward_hack"):
            self.metrics.evaluations.labels("resolved" if result.get("resolved") else "unresolved").inc()
        await self.touch(c)
        return {**base, **result}

    def _refuse(self, c: Owned, found: list[tamper.Tamper]) -> dict[str, Any]:
        """The answer for a patch that tampers with how tests run or report: unresolved, why, counted."""
        self._count_refused([t.kind for t in found])
        log.warning("reward_hack_refused", container_id=c.id[:12], kinds=sorted({t.kind for t in found}),
                    paths=sorted({t.path for t in found})[:10])
        return {"resolved": False, "error": tamper.summarize(found),
                "reward_hack": [t.as_dict() for t in found]}

    def _count_refused(self, kinds: list[str]) -> None:
        """One refused evaluation, and each tamper of it by kind."""
        self.metrics.evaluations.labels("reward_hack").inc()
        for kind in kinds:
            self.metrics.reward_hacks.labels(kind).inc()

    def _instance_script(self, req: EvaluateReq) -> tuple[dict[str, Any], str]:
        try:
            instance = validate_row(req.instance)
            script = req.eval_script or harness.eval_script_for(instance)
        except RowError as e:
            raise ApiError(422, f"field 'instance{'.' + e.field if e.field else ''}': {e.msg}") from None
        except ValueError as e:
            raise ApiError(422, f"field 'instance': {e}") from None
        return instance, script

    async def _run_eval(self, c: Owned, patch: str, script: str, cwd: str, timeout_s: float,
                        reset: bool, instance: dict[str, Any] | None = None) -> dict[str, Any]:
        """Apply `patch` in c (after a reset, in script mode) and run `script`. With `instance`
        (grading in a fresh container), the row's adapter's setup script runs first, the test
        infrastructure is checked and put back to the base commit after the patch, the test
        command is run by the referee when it can be (envd.referee), and the test output is
        framed by a per-run nonce (`log`, for grading.grade with that `nonce`)."""
        assert self.backend
        setup = harness.setup_script_for(instance) if instance is not None else None
        if setup:  # the row's start state, when its image alone is not it (the adapter's say)
            ready = await self.exec(c, setup, cwd, {}, APPLY_TIMEOUT_S)
            if ready.returncode != 0:
                return {"resolved": False, "returncode": ready.returncode, "output": self._tail(ready.output),
                        "error": f"{graded_run.SETUP_FAILED}: {self._tail(ready.output, 2000)}",
                        "timed_out": ready.timed_out}
        nonce = secrets.token_hex(16) if instance is not None else None
        plan = referee.plan(instance, patch, script, off=frozenset(self.ecfg.grader_off)) \
            if instance is not None else None
        first, second = plan.scripts(script) if plan else (script, None)
        files = {grading.PATCH_PATH: (patch.encode(), 0o644),
                 EVAL_PATH: ((grading.frame_script(first) if nonce else first).encode(), 0o755)}
        if plan is not None and second is None:  # nothing of the project runs before the referee
            files.update(self._run_files(plan))
        await self.run(graded_run.put_files, self.backend.client.api, c.id, files)
        sep = secrets.token_hex(8)
        prefix = "git reset --hard -q && git clean -fdq && " if reset else ""
        prepare = graded_run.prepare_script(instance, patch, cwd, sep, prefix)
        t0 = time.monotonic()
        if instance is None:  # script mode: the patch applied, then the script
            prep = await self.exec(c, prepare, cwd, {}, APPLY_TIMEOUT_S)
            if prep.returncode != 0:
                return self._not_applied(prep)
            run = await self.exec(c, f"bash {EVAL_PATH}", cwd, {}, timeout_s, cap=8 * 1024 * 1024)
        else:  # one exec: the patch applied and the infrastructure restored, then the eval script
            # one stream (stderr into stdout in the container): docker copies the two separately, so
            # only within one are lines in the order they were written
            both = await self.exec(c, f"exec 2>&1\n{prepare}echo {sep}R\nbash {EVAL_PATH}\n", cwd, {},
                                   timeout_s + PREPARE_S, cap=8 * 1024 * 1024)
            head, marked, rest = both.output.partition(f"{sep}R\n")  # the first: before any code of the patch
            if not marked:
                if both.returncode == graded_run.RESTORE_FAILED:
                    raise ApiError(500, f"could not restore the test infrastructure: {self._tail(both.output, 2000)}")
                return self._not_applied(both)
            refused = graded_run.settings_tampers(head, sep)
            if refused:
                return {**self._refuse(c, refused), "returncode": None}
            run = dataclasses.replace(both, output=rest)
        output, found = run.output, []
        if plan is not None and second is not None and not run.timed_out:
            # the install step has run: nothing of it may be left or have reached the system
            # before the referee's files exist (envd.graded_run.install_checks)
            found = await self.run(graded_run.install_checks, self.backend.client.api, c.id)
            if not found:
                await self.run(graded_run.put_files, self.backend.client.api, c.id,
                               {**self._run_files(plan), EVAL_PATH: (grading.frame_script(second).encode(), 0o755)})
                left = max(1.0, timeout_s - (time.monotonic() - t0))
                run = await self.exec(c, f"exec 2>&1\nbash {EVAL_PATH}", cwd, {}, left, cap=8 * 1024 * 1024)
                found = referee.infra_changes(run.output)
                output += run.output
        if found:
            return {**self._refuse(c, found), "returncode": None, "output": self._tail(output)}
        shown = referee.strip_signed(output) if plan else output
        out: dict[str, Any] = {"resolved": run.returncode == 0 and not run.timed_out,
                               "returncode": run.returncode, "output": self._tail(shown),
                               "timed_out": run.timed_out,
                               "log": grading.frame_log(shown, nonce) if nonce else shown,
                               "nonce": nonce, "referee": (plan, output) if plan else None}
        if run.timed_out:
            out["error"] = f"evaluation timed out after {timeout_s:g}s"
        return out

    async def _grade_fresh(self, agent: Owned, req: EvaluateReq, instance: dict[str, Any],
                           script: str, timeout_s: float, image: str) -> dict[str, Any]:
        """Grade in a fresh container from the agent's image (its tests may be tampered with). A
        row whose test command the referee can run (envd.referee) is judged by its signed verdict
        (envd.verdict); the log cross-checks."""
        assert self.backend
        # warm containers are kept by the name creates ask for: grade from the agent's image
        # name as long as it still names that very image
        if self.warm.enabled and agent.image != image and \
                await self.run(self.backend.image_id, agent.image) == image:
            image = agent.image
        created = await self.create(CreateReq(image=image, lease=f"eval-{agent.lease}",
                                              ttl_s=timeout_s + 600), shell=False)
        fresh = self.owned[created["container_id"]]
        try:
            result = await self._run_eval(fresh, req.patch, script, req.cwd, timeout_s, reset=False,
                                          instance=instance)
            full_log, nonce = result.pop("log", ""), result.pop("nonce", None)
            ref = result.pop("referee", None)
            if result.get("returncode") is None or result.get("error", "").startswith(
                    ("patch does not apply", graded_run.SETUP_FAILED)):
                return result
            report = await anyio.to_thread.run_sync(harness.grade, instance, full_log, nonce)
            found = [tamper.Tamper("fake_results", "<test output>", f"the test output imitates the "
                                   f"harness: {why}") for why in report.forged]
            judged = None
            if ref is not None:
                judged = await anyio.to_thread.run_sync(verdict.judge, ref[0], ref[1], instance,
                                                         report.tests_status, result["timed_out"])
                found += judged.tampers
                hidden = referee.canary_ids(ref[0])  # the grader's own tests are not the row's
                report.tests_status = {t: s for t, s in report.tests_status.items() if t not in hidden}
            shown: dict[str, Any] = {"tests_status": report.tests_status, "fail_to_pass": report.fail_to_pass,
                                     "pass_to_pass": report.pass_to_pass}
            if judged is not None:
                shown["referee"] = {"statuses": judged.statuses, "isolated": judged.isolated, "runs": judged.runs}
            if found:
                result.update(self._refuse(fresh, found), **shown)
                return result
            resolved = report.resolved and not result["timed_out"]
            if judged is not None:
                f2p = report.fail_to_pass  # P2P: a log-good test the referee saw fail is a tamper above
                resolved = resolved and judged.ok and all(judged.statuses.get(t) in ("PASSED", "XFAIL")
                                                          for t in f2p)
            result.update(resolved=resolved, **shown)
            error = report.error or (judged.error if judged is not None else "")
            if error:
                result["error"] = result.get("error") or error
            return result
        finally:
            await self._destroy(fresh.id, "eval_done")

    def _not_applied(self, prep: ExecOutcome) -> dict[str, Any]:
        return {"resolved": False, "returncode": prep.returncode, "output": self._tail(prep.output),
                "error": f"patch does not apply: {self._tail(prep.output, 2000)}", "timed_out": prep.timed_out}

    @staticmethod
    def _run_files(plan: referee.RefereePlan) -> dict[str, tuple[bytes, int]]:
        return {path: (data, 0o700 if path.endswith("/") else 0o600) for path, data in plan.files().items()}

    def _tail(self, text: str, n: int | None = None) -> str:
        n = n or self.ecfg.eval_output_tail
        return text if len(text) <= n else text[-n:]


def create_app(cfg: EnvdConfig, token: str | None, node_id: str, docker_url: str, keys: Keys,
               redis: RedisConfig | None = None) -> FastAPI:
    """The envd app; with `redis` (its url set) and envd.leases_in_redis, leases live in Redis."""
    envd = Envd(cfg, node_id, docker_url, keys, redis)

    @contextlib.asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        await envd.start()
        try:
            yield
        finally:
            await envd.stop()

    app = FastAPI(title="swarl envd", lifespan=lifespan)
    app.state.envd = envd
    httputil.install(app, token, cfg.max_body_bytes,
                     on_error=lambda path, status: envd.metrics.errors.labels(path, str(status)).inc())

    @app.get("/healthz")
    async def healthz() -> dict[str, Any]:
        assert envd.backend
        try:
            with anyio.fail_after(5):
                await envd.run(envd.backend.ping)
        except Exception as e:
            raise ApiError(503, f"docker engine does not answer: {e!r}") from None
        return {"ok": True, "running_containers": len(envd.owned), "node_id": envd.node_id}

    @app.get("/images")
    async def images() -> dict[str, Any]:
        assert envd.backend and envd.images
        names = await envd.run(envd.backend.images)
        return {"ok": True, "images": names, "count": len(names), "pulls": envd.images.pulls(),
                "budget_bytes": int(cfg.image_budget)}

    @app.post("/images/pull")
    async def pull(req: PullReq) -> dict[str, Any]:
        assert envd.images
        try:
            info = await envd.images.ensure(req.image)
        except PullFailed as e:
            raise ApiError(502, str(e), image=req.image, reason="pull_failed") from None
        except NotPullable as e:
            raise ApiError(404, str(e), image=req.image) from None
        if info.pulled:
            await envd.images.used(req.image)  # prefetched: most recently used, not first evicted
        return {"ok": True, "image": req.image, "pulled": info.pulled, "pull_s": round(info.seconds, 3),
                "bytes": info.bytes, "node_id": envd.node_id}

    @app.get("/status")
    async def status() -> dict[str, Any]:
        exp = await envd.leases.all()
        now = time.time()
        containers = {
            o.id: {"name": o.name, "image": o.image, "lease": o.lease, "created": o.created,
                   "idle_s": round(now - o.last_used, 3), "expires": exp.get(o.id), "labels": o.labels}
            for o in envd.owned.values()
        }
        return {"ok": True, "active_containers": len(containers), "containers": containers,
                "node_id": envd.node_id,
                "warm": {image: len(ws) for image, ws in envd.warm.ready.items() if ws},
                "reuse": {image: len(rs) for (image, _), rs in envd.reuse.ready.items() if rs}}

    @app.post("/container/create")
    async def create(req: CreateReq) -> dict[str, Any]:
        return await envd.create(req)

    @app.post("/container/exec")
    async def exec_(req: ExecReq) -> dict[str, Any]:
        c = envd.lookup(req.container_id)
        out = await envd.exec(c, req.command, req.cwd, req.env, req.timeout, via_shell=True)
        return {"ok": True, "returncode": out.returncode, "output": out.output,
                "timed_out": out.timed_out, "truncated": out.truncated,
                "duration_s": round(out.duration_s, 4)}

    @app.post("/container/diff")
    async def diff(req: DiffReq) -> dict[str, Any]:
        c = envd.lookup(req.container_id)
        # stdout only: docker copies an exec's stdout and stderr apart, so what the login shell's
        # profile writes to stderr may arrive after the marker (DIFF_COMMAND reports git's own
        # errors on stdout)
        out = await envd.exec(c, DIFF_COMMAND, req.cwd, {}, DIFF_TIMEOUT_S, cap=cfg.max_body_bytes, stderr=False,
                              via_shell=True)
        ok = out.returncode == 0 and DIFF_MARK in out.output
        return {"ok": True, "patch": out.output.split(DIFF_MARK, 1)[1] if ok else "",
                "returncode": out.returncode if out.returncode != 0 or ok else 1,
                "error": "" if ok else out.output[-2000:]}

    @app.post("/container/evaluate")
    async def evaluate(req: EvaluateReq) -> dict[str, Any]:
        c = envd.lookup(req.container_id)
        return await envd.evaluate(c, req)

    @app.post("/container/heartbeat")
    async def heartbeat(req: ContainerReq) -> dict[str, Any]:
        c = envd.lookup(req.container_id)
        return {"ok": True, "expires": await envd.touch(c)}

    @app.post("/container/destroy")
    async def destroy(req: ContainerReq) -> dict[str, Any]:
        c = envd.lookup(req.container_id)
        await envd.release(c)  # destroyed, or reset for reuse (envd.reuse)
        log.info("container_destroyed", container_id=c.id[:12])
        return {"ok": True}

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(generate_latest(envd.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    return app
