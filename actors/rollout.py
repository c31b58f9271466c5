"""One rollout job against the real services: generation slot → admission → pin → leased
episode → samples → replay stream. The pin and the generation slot are let go once the policy's
last turn is generated: grading needs no server (and a draining server waits for its pins), and
the next episode generates while this one grades (actor.grading_concurrency bounds how many grade
at once); both again in a `finally` shielded from cancellation with (when nothing trainable was
produced) the admission slot; the lease and the trajectory are the leased episode's.

An episode the learner can no longer train (the published version is more than max_staleness
past its own: versions only rise, and the learner drops such samples) is stopped
(actor.abandon_stale) rather than run to its end: with heavy-tailed episodes those are the
longest, and the slot they would hold takes a fresh episode instead. It ends as one masked
sample (reason "stale"), so its group is decided now and not at group_timeout_s. So is an
episode whose group the learner closed without it (trained at its last chance without its
straggler, or dropped: broker.admission marks it), reason "group_closed", and a job of such a
group that has not started yet never starts."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import time
from collections import Counter
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from actors.backends import ServerPolicy
from actors.episode import EpisodeJob, failure_samples
from actors.leased import LeasedEpisodes
from actors.prm import HttpJudge
from actors.protocols import InfraError
from actors.runner import EpisodeRunner
from actors.runtime import ActorRuntime
from actors.scored import ScoredEpisodes
from broker.keys import PIN_TTL_S, SERVER_TTL_S
from common.logs import get_logger
from envd.client import EnvdClient

log = get_logger("actors.rollout")
T = TypeVar("T")


class Rollouts:
    """Everything one actor process shares between its concurrent episodes."""

    def __init__(self, rt: ActorRuntime, redis: Any, actor_id: str | None = None,
                 slots: int | None = None) -> None:
        from broker.admission import Admission
        from broker.registry import PolicyRegistry, ServerRegistry
        from broker.replay import ReplayWriter
        from broker.running import RunningEpisodes

        self.rt, self.a, self.redis = rt, rt.actor, redis
        self.keys = rt.keys
        # systemd's actor@N sets SWARL_ACTOR_INSTANCE: the id then survives restarts
        instance = os.environ.get("SWARL_ACTOR_INSTANCE")
        self.actor_id = actor_id or f"{socket.gethostname()}:{instance or os.getpid()}"
        self.admission = Admission(redis, self.keys, rt.admission)
        # this process's running episodes (job id -> its policy, for the tokens so far), listed
        # in Redis with their version at pin for the learner's hold rule (learner.hold) and
        # refreshed by the version poll while they run
        self.running_eps = RunningEpisodes(redis, self.keys)
        self._listed: dict[str, ServerPolicy] = {}
        self.servers = ServerRegistry(redis, self.keys)
        self.policies = PolicyRegistry(redis, self.keys)
        self.writer = ReplayWriter(redis, self.keys, batch=rt.write_batch)
        self.api_key = self.a.inference_api_key or os.environ.get("SWARL_INFERENCE_API_KEY")
        self.judge: HttpJudge | None = None
        self._judges: tuple[float, list[str]] = (0.0, [])
        self.pool: EnvdClient | None = None
        self.episodes: EpisodeRunner
        if self.a.environment == "scored":  # answers scored in this process: no pool, no Docker
            self.episodes = ScoredEpisodes(self.a, owner=self.actor_id, tokenizer=rt.tokenizer,
                                           traj_dir=rt.traj_dir, hacks_only=not self.a.save_trajectories)
        else:
            if not rt.pool_url:
                raise ValueError("pool.url: not set (where actors reach `swarl pool serve`)")
            self.pool = EnvdClient.pool(rt.pool_url, rt.envd_token, allocate_wait_s=self.a.allocate_wait_s)
            if self.a.prm.enable:
                self.judge = HttpJudge(self._judge_urls, self.a.prm.api_key or self.api_key, self.a.prm.timeout_s)
            self.episodes = LeasedEpisodes(self.a, self.pool, owner=self.actor_id, tokenizer=rt.tokenizer,
                                           traj_dir=rt.traj_dir, hacks_only=not self.a.save_trajectories,
                                           judge=self.judge)
        self.running = 0
        # episodes generating at once (actor.concurrency, or the CLI's); arq runs up to
        # actor.grading_concurrency more jobs, which wait here or grade past their last turn
        self.slots = slots or self.a.concurrency
        self._generating = asyncio.Semaphore(self.slots)
        self.unfreed = 0  # jobs in run() that have not given their slot back (or wait for one)
        self._past_admission: set[str] = set()  # jobs in run() admission has decided
        self.totals: Counter[str] = Counter()
        # server id -> until when this actor does not pin it: it refused connections (killed?)
        # while its registry entry stays fresh for up to SERVER_TTL_S
        self.unreachable: dict[str, float] = {}
        # the published version and which running episodes' groups the learner closed, read
        # once a second by one task for all of this process's episodes (actor.abandon_stale);
        # stopped by the event, not cancelled (see _keep_pin)
        self._current = 0
        self._running_groups: Counter[str] = Counter()
        self._closed_groups: set[str] = set()
        self._version_changed = asyncio.Event()
        self._version_poll: asyncio.Task[None] | None = None
        self._stop_polling = asyncio.Event()

    async def warm_up(self) -> None:
        """Import the heavy modules and load the tokenizer off the event loop before taking
        jobs: a loop blocked for seconds would let running jobs' claims lapse."""
        import importlib

        for mod in ("transformers", "inference.client", "envd.client"):
            await asyncio.to_thread(importlib.import_module, mod)
        if self.rt.tokenizer:
            await self.episodes.encoder(None)

    async def _admit(self, job: EpisodeJob) -> bool:
        """True once admitted; False if the learner closed the job's group first (its samples
        could only be dropped). The learner's progress frees slots; the job's claim is renewed
        while we wait."""
        while True:
            got = await self.admission.admit(job.group_id, job.n_samples,
                                             unless_closed=self.a.abandon_stale, job_id=job.job_id)
            if got != "wait":
                return got == "started"
            await asyncio.sleep(0.25)  # at max_staleness 0 this poll is on every version's path

    async def _pin(self, pin_id: str) -> Any:
        current = await self.policies.current()
        min_version = max(0, current - self.rt.admission.max_staleness)
        deadline = time.monotonic() + self.a.pin_wait_s
        while True:
            now = time.monotonic()
            avoid = {sid for sid, until in self.unreachable.items() if until > now}
            server = await self.servers.pin(pin_id, min_version=min_version, ttl_s=PIN_TTL_S,
                                            exclude=avoid)
            if server is not None:
                return server
            if time.monotonic() >= deadline:
                raise InfraError("no_server", f"no ready inference server at version >= "
                                 f"{min_version} within {self.a.pin_wait_s:.0f}s")
            await asyncio.sleep(0.5)

    async def _judge_urls(self) -> list[str]:
        """prm.urls, else the ready live servers of role prm (looked up at most every 2 s)."""
        if self.a.prm.urls:
            return list(self.a.prm.urls)
        at, urls = self._judges
        if time.monotonic() - at > 2.0:
            servers = await self.servers.list(alive_only=True, role="prm")
            urls = [s.url for s in servers if s.state == "ready"]
            self._judges = (time.monotonic(), urls)
        return urls

    async def _keep_pin(self, server_id: str, pin_id: str, stop: asyncio.Event) -> None:
        # stopped by the event, not by cancel(): redis-py 5.3 with a socket timeout now and then
        # swallows a cancellation landing inside a command (redis-py #2028/#2551), and awaiting
        # the cancelled task then hung the job after its episode was done (jobs:done missing)
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), min(self.a.heartbeat_s, PIN_TTL_S / 4))
            if not stop.is_set():
                with contextlib.suppress(Exception):
                    await self.servers.renew_pin(server_id, pin_id, PIN_TTL_S)

    # -- one job -----------------------------------------------------------------------
    async def run(self, payload: dict[str, Any], job_try: int = 1) -> dict[str, Any]:
        job = EpisodeJob.from_payload(payload, need_image=self.a.environment == "envd")
        if await self.redis.sismember(self.keys.jobs_done, job.job_id):
            return {"skipped": "already done"}
        _honor_cancel()
        final_try = job_try >= self.rt.queue.max_tries
        pin_id = f"{self.actor_id}:{job.job_id}:{job_try}"
        # trainable: samples the learner can train on were written; a rollout that ends
        # without any (masked samples, a last try's error) gives its admission slot back, so at
        # max_staleness 0 another rollout of the same version takes its place in the batch; one
        # that arq will run again (retried) keeps it for that try
        admitted = trainable = retried = ended = False
        server = policy = None
        written, waste = 0, "infra"  # generated tokens in trainable samples; the rest's cause
        t_busy = 0.0
        renew: asyncio.Task[None] | None = None
        stop_renewing = asyncio.Event()
        slot = _Slot(self._generating, on_free=self._slot_freed)
        self.running += 1
        self.unfreed += 1
        try:
            await slot.take()
            admitted = await self._admit(job)
            _honor_cancel()
            self._past_admission.add(job.job_id)
            server = await self._pin(pin_id)
            _honor_cancel()
            t_busy = time.monotonic()
            renew = asyncio.create_task(self._keep_pin(server.id, pin_id, stop_renewing))
            policy = ServerPolicy(server.url, self.api_key, self.a.generate_timeout_s)
            version = server.version or 0
            pinned = server

            async def let_go() -> None:
                # the last turn is generated: the pin held the server's weights for this
                # episode's turns only; a weight update must not wait for grading too
                stop_renewing.set()
                with contextlib.suppress(Exception):  # not a cancellation: that ends the episode
                    await renew
                with contextlib.suppress(Exception):
                    await self.servers.unpin(pinned.id, pin_id)
                slot.give()  # the next episode generates while this one grades
                with contextlib.suppress(Exception):  # the learner weighs a grading one as near done
                    await self.running_eps.last_turn(job.job_id)

            if not admitted:  # its group was closed before it started
                return await self._abandoned(job, policy, version, slot.busy_s(t_busy), "group_closed")
            await self._list_running(job.job_id, version, policy)
            ep, stopped = await self._unless_stale(version, job.group_id, self.episodes.run(
                job, policy, version, on_generated=let_go, meta={
                    "server": server.url, "server_id": server.id, "policy_version": version,
                    "job_try": job_try}, follow_updates=self.rt.rollout_mode == "in-flight"))
            if ep is None:
                waste = "stale_stopped" if stopped == "stale" else stopped
                return await self._abandoned(job, policy, version, slot.busy_s(t_busy), stopped)
            await self.writer.add(ep.samples, done_job=job.job_id)
            ended = True  # ran to its end (its duration counts in broker.running's record)
            trainable = not ep.masked
            written, waste = (0, "masked") if ep.masked else \
                (sum(s.generated_tokens for s in ep.samples), "unsampled")
            self.totals["episodes"] += 1
            self.totals["resolved"] += int(ep.resolved)
            self.totals["samples"] += len(ep.samples)
            await self._stat("episodes_" + ("resolved" if ep.resolved else "unresolved"),
                             slot.busy_s(t_busy))
            if ep.metrics.get("reward_hack_attempts"):
                await self._stat("reward_hack_attempts")
                for name in sorted(k for k in ep.metrics if k.startswith("reward_hack_attempts/")):
                    await self._stat(name)  # by kind: reward_hack_attempts/<kind>
                log.warning("reward_hack_attempt", job_id=job.job_id, traj_dir=str(ep.traj_dir),
                            error=ep.evaluation.error if ep.evaluation else "")
            log.info("episode_done", job_id=job.job_id, ending=ep.agent.ending, reward=ep.reward,
                     steps=len(ep.agent.steps), version=version, server=server.id,
                     **({"outcome": ep.outcome, "prm_scored": sum(s.score is not None for s in ep.prm),
                         "prm_judged": len(ep.prm)} if self.judge is not None else {}))
            return {"reward": ep.reward, "resolved": ep.resolved, "ending": ep.agent.ending,
                    "samples": len(ep.samples), "version": version}
        except InfraError as e:
            if e.reason == "inference_unreachable" and server is not None:
                self.unreachable[server.id] = time.monotonic() + SERVER_TTL_S
            self.totals["infra_failures"] += 1
            self.totals[f"infra:{e.reason}"] += 1
            with contextlib.suppress(Exception):
                await self.redis.hincrby(self.keys.stats, "episodes_infra_retried", 1)
            log.warning("episode_infra_failure", job_id=job.job_id, reason=e.reason,
                        detail=e.detail[:300], job_try=job_try)
            if not final_try:
                retried = True
                raise  # arq runs the job again (bounded by queue.max_tries)
            # Last try: one masked sample completes the learner's group without biasing it.
            version = server.version or 0 if server is not None else await self.policies.current()
            encoder = await self.episodes.encoder(policy)
            samples = failure_samples(encoder, self.episodes.templates, self.a, job, version, e.reason)
            await self.writer.add(samples, done_job=job.job_id)
            self.totals["episodes_masked_infra"] += 1
            await self._stat("episodes_masked_infra", slot.busy_s(t_busy))
            log.warning("episode_masked_after_infra_failures", job_id=job.job_id,
                        reason=e.reason, tries=job_try)
            return {"masked": True, "reason": e.reason}
        except BaseException as e:
            retried = not final_try  # arq runs it again: an error, a timeout, a hand-back on SIGTERM
            waste = "interrupted" if isinstance(e, asyncio.CancelledError) else "error"
            raise
        finally:
            self.running -= 1
            self._past_admission.discard(job.job_id)
            slot.give()
            stop_renewing.set()
            if job.job_id in self._listed:  # after its samples were written: the learner reads them
                await asyncio.shield(self._unlist_running(job.job_id, ended))
            if policy is not None:
                with contextlib.suppress(BaseException):
                    await asyncio.shield(self._count_tokens(policy.generated, written, waste))
            await asyncio.shield(self._cleanup(renew, server, pin_id, policy, job.job_id if admitted else None,
                                               trainable, retried))

    async def admissible(self, job_ids: list[str], want: int, running: list[str]) -> list[int]:
        """Which of the queue's jobs (ids in queue order) to take: at most `want` that admission
        would start now (broker.admission.Admission.admissible). `running`: the jobs this actor
        runs; those that have not been admitted yet (just taken) count first."""
        jobs = [(j, self.keys.group_of(j)) for j in job_ids]
        taken = [(j, self.keys.group_of(j)) for j in running if j not in self._past_admission]
        return await self.admission.admissible(jobs, want, unless_closed=self.a.abandon_stale, taken=taken)

    def _slot_freed(self) -> None:
        self.unfreed -= 1

    def room(self, jobs: int) -> int:
        """How many more jobs this actor may take now: its free generation slots, `jobs` being
        all the jobs it runs (arq's count; those past their last turn hold no slot)."""
        past_last_turn = self.running - self.unfreed
        return self.slots - (jobs - past_last_turn)

    async def _unless_stale(self, version: int, group_id: str,
                            episode: Coroutine[Any, Any, T]) -> tuple[T | None, str]:
        """(the episode's result, ""), or (None, why) when it was stopped because the learner
        can no longer train it: "stale" or "group_closed" (see above)."""
        if not self.a.abandon_stale:
            return await episode, ""
        run = asyncio.ensure_future(episode)
        watch = asyncio.create_task(self._untrainable(version + self.rt.admission.max_staleness, group_id))
        self._running_groups[group_id] += 1
        try:
            await asyncio.wait({run, watch}, return_when=asyncio.FIRST_COMPLETED)
            if not run.done():
                run.cancel()
                try:
                    return await run, ""  # it ended while being stopped: kept
                except asyncio.CancelledError:
                    task = asyncio.current_task()
                    if task is not None and task.cancelling():
                        raise  # this job is cancelled itself (shutdown), not stopped as stale
                    return None, watch.result()
            return run.result(), ""
        finally:
            self._running_groups[group_id] -= 1
            if self._running_groups[group_id] <= 0:
                del self._running_groups[group_id]
                self._closed_groups.discard(group_id)
            for t in (run, watch):
                t.cancel()
            await asyncio.gather(run, watch, return_exceptions=True)  # lease, pin, trajectory

    async def _untrainable(self, last: int, group_id: str) -> str:
        """Returns why once the learner can no longer train the episode: "stale" when the
        published version is past `last`, "group_closed" when its group was closed. No Redis
        call here: this task is cancelled when its episode ends, and redis-py can swallow a
        cancellation that lands inside a command (see _keep_pin); one poller per process reads
        for all episodes instead."""
        self._start_polling()
        while True:
            if self._current > last:
                return "stale"
            if group_id in self._closed_groups:
                return "group_closed"
            await self._version_changed.wait()

    def _start_polling(self) -> None:
        if self._version_poll is None:
            self._version_poll = asyncio.create_task(self._poll_version())

    async def _list_running(self, job_id: str, version: int, policy: ServerPolicy) -> None:
        """The episode runs from `version` on (broker.running): the learner may hold a step
        that would make it stale (learner.hold). A Redis blip only costs that hold."""
        self._listed[job_id] = policy
        self._start_polling()
        with contextlib.suppress(Exception):
            await self.running_eps.add(job_id, version)

    async def _unlist_running(self, job_id: str, ended: bool) -> None:
        self._listed.pop(job_id, None)
        with contextlib.suppress(Exception):
            await self.running_eps.remove(job_id, ended=ended)

    async def _poll_version(self) -> None:
        while not self._stop_polling.is_set():
            with contextlib.suppress(Exception):
                await self.running_eps.refresh(sorted(self._listed), {
                    j: p.generated for j, p in self._listed.items()})
            with contextlib.suppress(Exception):  # a Redis blip is waited out
                current = await self.policies.current()
                closed = await self.admission.closed(sorted(self._running_groups))
                if current != self._current or not closed <= self._closed_groups:
                    self._current = current
                    self._closed_groups |= closed
                    changed, self._version_changed = self._version_changed, asyncio.Event()
                    changed.set()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop_polling.wait(), 1.0)

    async def _abandoned(self, job: EpisodeJob, policy: ServerPolicy, version: int,
                         busy_s: float, why: str) -> dict[str, Any]:
        encoder = await self.episodes.encoder(policy)
        samples = failure_samples(encoder, self.episodes.templates, self.a, job, version, why,
                                  kind="abandoned")
        await self.writer.add(samples, done_job=job.job_id)
        self.totals[f"episodes_abandoned_{why}"] += 1
        await self._stat(f"episodes_abandoned_{why}", busy_s)
        log.info("episode_abandoned", why=why, job_id=job.job_id, group_id=job.group_id,
                 version=version, current=self._current, max_staleness=self.rt.admission.max_staleness)
        return {"masked": True, "reason": why, "version": version}

    async def _cleanup(self, renew: asyncio.Task[None] | None, server: Any, pin_id: str,
                       policy: ServerPolicy | None, admitted: str | None, trainable: bool,
                       retried: bool) -> None:
        """Let go of what one try held. `admitted` (the job id, if it was): its admission slot
        stays taken if it wrote trainable samples, stays held for the next try if `retried`,
        and goes back otherwise (broker.admission: a job holds its slot across its tries)."""
        if renew is not None:
            with contextlib.suppress(BaseException):
                await renew
        if server is not None:
            with contextlib.suppress(Exception):
                await self.servers.unpin(server.id, pin_id)
        if policy is not None:
            with contextlib.suppress(Exception):
                await policy.aclose()
        if admitted is not None and not retried:
            with contextlib.suppress(Exception):
                if trainable:
                    await self.admission.finished(admitted)
                else:
                    await self.admission.release_job(admitted)

    async def _count_tokens(self, generated: int, written: int, cause: str) -> None:
        """Every token a server generated for one try of an episode: written in trainable samples
        (the learner counts them trained or dropped), or wasted here by `cause` — stale_stopped,
        group_closed (its group trained without it), masked, infra (an infrastructure failure:
        retried or masked), interrupted (cancelled: a job timeout, a hand-back on SIGTERM), error
        (any other exception), unsampled (generated, in no sample: expected 0). See
        docs/actors.md, token accounting."""
        if not generated:
            return
        written = min(written, generated)
        self.totals["tokens_generated"] += generated
        pipe = self.redis.pipeline(transaction=False)
        pipe.hincrby(self.keys.stats, "tokens_generated", generated)
        if written:
            pipe.hincrby(self.keys.stats, "tokens_written", written)
        if generated > written:
            self.totals[f"tokens_wasted/{cause}"] += generated - written
            pipe.hincrby(self.keys.stats, f"tokens_wasted/{cause}", generated - written)
        with contextlib.suppress(Exception):
            await pipe.execute()

    async def _stat(self, name: str, busy_s: float = 0.0) -> None:
        pipe = self.redis.pipeline(transaction=False)
        pipe.hincrby(self.keys.stats, name, 1)  # samples_written is counted by the writer
        if busy_s:
            # seconds a generation slot spent on an episode (from its pin to its last turn, or
            # its end): with the slots' wall time this gives the actors' idle fraction
            pipe.hincrbyfloat(self.keys.stats, "rollout_busy_s", round(busy_s, 3))
        with contextlib.suppress(Exception):
            await pipe.execute()

    async def aclose(self) -> None:
        self._stop_polling.set()
        if self._version_poll is not None:
            with contextlib.suppress(Exception):
                await self._version_poll
        if self.pool is not None:
            await self.pool.aclose()
        if self.judge is not None:
            await self.judge.aclose()


def _honor_cancel() -> None:
    """Raise CancelledError if this task was cancelled and the cancellation was swallowed: redis-py
    5.3 now and then catches a cancellation that lands inside a command (redis-py #2028/#2551; see
    _keep_pin), and the job would otherwise run its whole episode after a SIGTERM's hand-back or a
    stop. The task still counts the request (Task.cancelling)."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


class _Slot:
    """One of an actor's generation slots: taken before admission, given back at the episode's
    last turn (grading needs none) or at its end, whichever comes first (`on_free` then, once,
    also for a job cancelled while it waited for the slot)."""

    def __init__(self, sem: asyncio.Semaphore, on_free: Callable[[], None]) -> None:
        self.sem, self.on_free, self.held = sem, on_free, False
        self.freed_at: float | None = None

    async def take(self) -> None:
        await self.sem.acquire()
        self.held = True

    def give(self) -> None:
        if self.freed_at is not None:
            return
        self.freed_at = time.monotonic()
        self.on_free()
        if self.held:
            self.held = False
            self.sem.release()

    def busy_s(self, since: float) -> float:
        """Seconds the slot has worked on the episode since `since` (0: it never got that far)."""
        if not since:
            return 0.0
        return max(0.0, (self.freed_at or time.monotonic()) - since)
