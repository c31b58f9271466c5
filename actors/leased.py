"""One leased episode, the same for the actor, `swarl eval` and the slime plug-in: a container
leased from the envd pool for the row's image → the agent loop → evaluation in a fresh container →
reward → samples. The lease is heartbeated while held and always closed; the trajectory, templates
and tokenizer are actors.runner's."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from actors.agent import Agent
from actors.backends import PoolEnv, ServerPolicy
from actors.config import ActorConfig
from actors.encoding import ChatEncoder
from actors.episode import EpisodeJob, EpisodeResult, make_agent, run_episode
from actors.prm import JudgeClient, JudgeTemplates, StepJudge
from actors.protocols import InfraError
from actors.runner import EpisodeRunner
from actors.templates import PromptTemplates
from common.logs import get_logger
from envd.client import EnvdClient, EnvError, EnvRequestError, Lease
from swe.harness import setup_script_for
from swe.schema import RowError

log = get_logger("actors.leased")


class LeasedEpisodes(EpisodeRunner):
    """Runs episodes on pool leases (actors.runner: `owner` names the leases in the pool)."""

    def __init__(self, cfg: ActorConfig, pool: EnvdClient, *, owner: str, tokenizer: str | None,
                 traj_dir: Path | None, templates: PromptTemplates | None = None,
                 judge: JudgeClient | None = None, hacks_only: bool = False) -> None:
        super().__init__(cfg, owner=owner, tokenizer=tokenizer, traj_dir=traj_dir, templates=templates,
                         hacks_only=hacks_only)
        self.pool = pool
        # with prm.enable: every episode's executed steps are judged through this client
        self.judge = judge if cfg.prm.enable else None
        self.judge_templates = JudgeTemplates(cfg.prm.template) if self.judge is not None else None

    async def _episode(self, job: EpisodeJob, policy: ServerPolicy, encoder: ChatEncoder,
                       pinned_version: int | None, on_generated: Callable[[], Awaitable[None]] | None,
                       follow_updates: bool, agents: list[Agent]) -> EpisodeResult:
        async with self._lease(job) as alloc:
            env = PoolEnv(self.pool, alloc, job.instance, self.cfg.cwd, self.cfg.exec_env)
            agent = make_agent(self.cfg, self.templates, encoder, policy, env, job, pinned_version,
                               self._step_judge(job, encoder), follow_updates=follow_updates)
            agents.append(agent)
            return await run_episode(agent, job, on_generated)

    def _step_judge(self, job: EpisodeJob, encoder: ChatEncoder) -> StepJudge | None:
        if self.judge is None or self.judge_templates is None:
            return None
        return StepJudge(self.cfg.prm, self.judge, self.judge_templates, job.task,
                         lambda text: len(encoder.tokenize(text)), self.cfg.head_ratio)

    @contextlib.asynccontextmanager
    async def _lease(self, job: EpisodeJob) -> Any:
        """Yields the task allocating the lease: with actor.lease_ahead still under way (PoolEnv
        waits for it at its first call, so the policy's first turn runs meanwhile), else done.
        Whatever was allocated is closed when the episode ends, also if it never needed it."""
        alloc = asyncio.create_task(self._allocate(job))
        if not self.cfg.lease_ahead:
            try:
                await asyncio.shield(alloc)
            except BaseException:
                await asyncio.shield(self._release(None, alloc))
                raise
        beat = asyncio.create_task(self._heartbeat(alloc))
        try:
            yield alloc
        finally:
            await asyncio.shield(self._release(beat, alloc))

    async def _allocate(self, job: EpisodeJob) -> Lease:
        image = job.image
        try:
            lease = await self.pool.allocate(image, job.instance_id, wait_s=self.cfg.allocate_wait_s,
                                             owner=self.owner)
        except (EnvError, EnvRequestError) as e:  # a missing image is infrastructure too
            pull = isinstance(e, EnvError) and e.reason == "pull_failed"
            raise InfraError("image_pull_failed" if pull else "allocate_failed", f"{image}: {e}") from e
        await self._setup(job, lease)
        return lease

    async def _setup(self, job: EpisodeJob, lease: Lease) -> None:
        """The row's setup script (its dataset adapter's: SWE-smith applies the instance's bug,
        R2E-Gym moves its test files out of reach), run before the agent's first command, the
        same script envd runs in the grading container, so the patch the agent leaves applies
        there. A failure is infrastructure: the lease is closed and the job retried."""
        if not job.instance.get("dataset_family"):
            return  # rows reach the queue validated (data prepare / enqueue name the family); a test's bare row has no setup
        try:
            script = setup_script_for(job.instance)
        except RowError as e:
            await self._close_quietly(lease)
            raise InfraError("setup_failed", f"{job.instance_id}: {e}") from e
        if not script:
            return
        try:
            r = await self.pool.exec(lease.lease_id, script, cwd="/", timeout=self.cfg.setup_timeout_s)
            error = None if r.returncode == 0 else f"exit {r.returncode}: {r.output[-2000:]}"
        except (EnvError, EnvRequestError) as e:
            error = f"{type(e).__name__}: {e}"
        if error is not None:
            await self._close_quietly(lease)
            raise InfraError("setup_failed", f"{job.instance_id}: the row's setup script failed: {error}")

    async def _close_quietly(self, lease: Lease) -> None:
        try:
            await asyncio.wait_for(self.pool.close(lease.lease_id), 30)
        except Exception as e:  # the pool reaps an unclosed lease when it expires
            log.warning("lease_close_failed", lease=lease.lease_id, error=f"{type(e).__name__}: {e}")

    async def _heartbeat(self, alloc: asyncio.Task[Lease]) -> None:
        """Every request renews the lease; this keeps it through a long generation."""
        lease = await asyncio.shield(alloc)
        while True:
            await asyncio.sleep(self.cfg.heartbeat_s)
            with contextlib.suppress(EnvError, EnvRequestError):
                await self.pool.heartbeat(lease.lease_id)

    async def _release(self, beat: asyncio.Task[None] | None, alloc: asyncio.Task[Lease]) -> None:
        if beat is not None:
            beat.cancel()
            with contextlib.suppress(BaseException):
                await beat
        try:
            # an allocation still under way is waited for (bounded by its own wait), not
            # cancelled: the pool may already have leased the container
            lease = await asyncio.wait_for(asyncio.shield(alloc), self.cfg.allocate_wait_s + 30)
        except BaseException as e:  # nothing was leased (or the pool reaps it when it expires)
            if not isinstance(e, InfraError):
                log.warning("lease_wait_failed", error=f"{type(e).__name__}: {e}")
            return
        await self._close_quietly(lease)
