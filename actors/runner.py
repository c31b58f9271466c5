"""What every kind of episode shares, whatever its environment (envd's containers:
actors/leased.py; a Python scorer in process: actors/scored.py): the prompt templates, the
tokenizer, and the trajectory, always written (when there is a directory for it), also for an
episode that failed, with its error.

The tokenizer is resolved here and nowhere else: the configured directory, else the
`tokenizer_path` the inference server reports on /get_model_info; each directory is loaded once
per process, off the event loop."""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from actors.agent import Agent
from actors.backends import ServerPolicy
from actors.config import ActorConfig
from actors.encoding import ChatEncoder
from actors.episode import EpisodeJob, EpisodeResult
from actors.protocols import InfraError
from actors.templates import PromptTemplates, load_templates
from common.logs import get_logger

log = get_logger("actors.runner")

_ENCODERS: dict[str, ChatEncoder] = {}
_ENCODERS_LOCK = threading.Lock()   # loads run in worker threads, possibly from several loops


def load_encoder(path: str) -> ChatEncoder:
    """The encoder of a tokenizer directory, loaded once per process. Blocking: call it in a
    thread (a loop blocked for seconds lets running episodes' claims and leases lapse)."""
    with _ENCODERS_LOCK:
        if path not in _ENCODERS:
            from transformers import AutoTokenizer

            _ENCODERS[path] = ChatEncoder(AutoTokenizer.from_pretrained(path))
        return _ENCODERS[path]


class EpisodeRunner:
    """Runs episodes with one config, one tokenizer and one trajectory directory; a subclass
    says what one episode is (`_episode`).

    `owner` names the episodes' holder (actor id, "swarl-eval", "slime"); `tokenizer` is the
    configured directory (None: ask the server); `traj_dir` None writes no trajectories;
    `hacks_only` writes only those of reward-hack attempts (always kept, for review)."""

    def __init__(self, cfg: ActorConfig, *, owner: str, tokenizer: str | None, traj_dir: Path | None,
                 templates: PromptTemplates | None = None, hacks_only: bool = False,
                 default_prompts: Path | None = None) -> None:
        self.cfg, self.owner = cfg, owner
        self.tokenizer = tokenizer
        self.traj_dir = traj_dir
        self.hacks_only = hacks_only
        self.templates = templates or load_templates(cfg.prompts or default_prompts)
        self._path_lock = asyncio.Lock()

    async def encoder(self, policy: ServerPolicy | None) -> ChatEncoder:
        """The episode's encoder: the configured tokenizer, else the server's (asked once)."""
        async with self._path_lock:
            if not self.tokenizer and policy is not None:
                info = await policy.model_info()
                self.tokenizer = info.get("tokenizer_path") or info.get("model_path") or None
            path = self.tokenizer
        if not path or not await asyncio.to_thread(os.path.isdir, path):
            raise InfraError("tokenizer_missing", f"no local tokenizer directory at {path!r} "
                             "(set actor.tokenizer)")
        return await asyncio.to_thread(load_encoder, path)

    async def run(self, job: EpisodeJob, policy: ServerPolicy, pinned_version: int | None,
                  meta: dict[str, Any] | None = None,
                  on_generated: Callable[[], Awaitable[None]] | None = None,
                  follow_updates: bool = False) -> EpisodeResult:
        """One episode of `job` with `policy` (pinned_version None: no weight-version check).
        InfraError for any infrastructure failure; `meta` goes to the trajectory's meta.json;
        `on_generated` is awaited between the policy's last turn and grading."""
        agents: list[Agent] = []  # the episode's agent, once made: its trajectory is written
        ep: EpisodeResult | None = None
        error: BaseException | None = None
        try:
            encoder = await self.encoder(policy)
            ep = await self._episode(job, policy, encoder, pinned_version, on_generated,
                                     follow_updates, agents)
            return ep
        except BaseException as e:
            error = e
            raise
        finally:
            hack = ep is not None and bool(ep.metrics.get("reward_hack_attempts"))
            if self.traj_dir is not None and (hack or not self.hacks_only):
                # shielded: a cancelled episode (SIGTERM) still leaves its trajectory
                path = await asyncio.shield(self._save(job, agents[0] if agents else None, ep, error,
                                                       meta or {}))
                if ep is not None:
                    ep.traj_dir = path

    async def _episode(self, job: EpisodeJob, policy: ServerPolicy, encoder: ChatEncoder,
                       pinned_version: int | None, on_generated: Callable[[], Awaitable[None]] | None,
                       follow_updates: bool, agents: list[Agent]) -> EpisodeResult:
        """One episode; the agent it makes goes into `agents` as soon as it exists."""
        raise NotImplementedError

    async def _save(self, job: EpisodeJob, agent: Agent | None, ep: EpisodeResult | None,
                    error: BaseException | None, meta: dict[str, Any]) -> Path | None:
        from actors.artifacts import write_trajectory

        assert self.traj_dir is not None
        full = {"owner": self.owner, "tokenizer": self.tokenizer,
                "weight_versions": [s.weight_version for s in agent.steps] if agent else [],
                "sampling": self.cfg.sampling.model_dump(),
                "config": self.cfg.model_dump(exclude={"inference_api_key"}), **meta}
        try:
            return await asyncio.to_thread(write_trajectory, self.traj_dir, job, agent, ep, error, full)
        except OSError as e:  # artifacts are for humans; a full disk must not lose the samples
            log.warning("trajectory_not_saved", job_id=job.job_id, error=str(e))
            return None
