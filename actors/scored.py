"""An environment that scores in process (actor.environment: scored): one answer per episode to
the row's `prompt`, scored by a Python function (actor.scorer) — no container, no pool. It is what
users with non-SWE tasks need, and what the test that the loop learns runs on (swarl/reading_task.py):
the same admission, pins, versions, samples and token accounting as a SWE episode, only the
environment differs.

A scorer is `fn(row, answer) -> bool | float`: a bool is resolved or not (actor.reward_resolved /
reward_unresolved), a float is the reward itself (resolved when >= reward_resolved). It runs in a
worker thread, bounded by actor.eval_timeout_s; a scorer that raises or times out is an
infrastructure failure (retried, then masked), never a reward.
"""

from __future__ import annotations

import asyncio
import importlib
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

from actors.agent import Agent, AgentResult
from actors.backends import ServerPolicy
from actors.config import ActorConfig
from actors.encoding import ChatEncoder
from actors.episode import EpisodeJob, EpisodeResult, build_samples, make_agent
from actors.metrics import episode_metrics
from actors.protocols import EvalOutcome, ExecOutput, InfraError
from actors.reward import outcome_reward
from actors.runner import EpisodeRunner
from actors.templates import REPO_ROOT
from swe.rows import Row, RowError, jsonl_rows

SCORED_PROMPTS = REPO_ROOT / "configs" / "prompts" / "scored.yaml"
Scorer = Callable[[dict[str, Any], str], "bool | float"]


def exact_answer(row: dict[str, Any], answer: str) -> bool:
    """The answer, stripped, equals the row's `answer` (stripped)."""
    if "answer" not in row:
        raise ValueError(f"{row.get('instance_id')}: the exact scorer needs the row's `answer`")
    return answer.strip() == str(row["answer"]).strip()


SCORERS: dict[str, Scorer] = {"exact": exact_answer}


def load_scorer(spec: str) -> Scorer:
    """A scorer by name (SCORERS) or as module:function; a clear error naming what is wrong."""
    if spec in SCORERS:
        return SCORERS[spec]
    mod, sep, name = spec.partition(":")
    if not sep or not mod or not name:
        raise ValueError(f"actor.scorer={spec!r}: expected one of {sorted(SCORERS)} or module:function")
    try:
        fn = getattr(importlib.import_module(mod), name)
    except (ImportError, AttributeError) as e:
        raise ValueError(f"actor.scorer={spec!r}: {type(e).__name__}: {e}") from e
    if not callable(fn):
        raise ValueError(f"actor.scorer={spec!r}: not callable")
    return fn


def validate_scored_row(row: Any, where: str | None = None) -> dict[str, Any]:
    """A row a scored episode can run: instance_id and prompt, non-empty strings (RowError
    naming the field otherwise)."""
    if not isinstance(row, dict):
        raise RowError("expected a JSON object", where=where)
    iid = row.get("instance_id")
    for name in ("instance_id", "prompt"):
        if not isinstance(row.get(name), str) or not row[name].strip():
            raise RowError("missing or not a non-empty string", field=name, where=where,
                           instance_id=iid if isinstance(iid, str) else None)
    return row


def read_scored_rows(path: str | Path, errors: list[RowError] | None = None) -> Iterator[Row]:
    """The valid scored rows of a JSONL file (data_source: the record's, else the file's name);
    a bad row raises its RowError, or, given `errors`, is appended there and skipped."""
    p = Path(path)
    for src in jsonl_rows(p):
        try:
            if isinstance(src, RowError):
                raise src
            yield Row(src.where, validate_scored_row(src.row, src.where), src.data_source or p.name)
        except RowError as e:
            if errors is None:
                raise
            errors.append(e)


class _NoCommands:
    """A scored episode runs no command: its environment is the scorer."""

    async def exec(self, command: str, timeout_s: float) -> ExecOutput:
        raise InfraError("no_environment", "a scored episode runs no command")

    async def diff(self) -> str:
        return ""

    async def evaluate(self, patch: str, timeout_s: float) -> EvalOutcome:
        raise InfraError("no_environment", "a scored episode is scored by actor.scorer")


class ScoredEpisodes(EpisodeRunner):
    def __init__(self, cfg: ActorConfig, *, owner: str, tokenizer: str | None, traj_dir: Path | None,
                 hacks_only: bool = False) -> None:
        super().__init__(cfg, owner=owner, tokenizer=tokenizer, traj_dir=traj_dir, hacks_only=hacks_only,
                         default_prompts=SCORED_PROMPTS)
        self.scorer = load_scorer(cfg.scorer)

    async def _episode(self, job: EpisodeJob, policy: ServerPolicy, encoder: ChatEncoder,
                       pinned_version: int | None, on_generated: Callable[[], Awaitable[None]] | None,
                       follow_updates: bool, agents: list[Agent]) -> EpisodeResult:
        cfg = self.cfg
        t0 = time.monotonic()
        agent = make_agent(cfg, self.templates, encoder, policy, _NoCommands(), job, pinned_version,
                           follow_updates=follow_updates)
        agents.append(agent)
        agent.begin(job.task, job.instance)
        rec = await agent.query()  # the one turn: pinned version checked, token-exact
        ending = "submitted" if rec.finish == "stop" else "length"
        res = agent.result = AgentResult(ending, "", agent.steps, agent.messages, agent.conv)
        if on_generated is not None:
            await on_generated()
        t1 = time.monotonic()
        try:
            score = await asyncio.wait_for(asyncio.to_thread(self.scorer, job.instance, rec.text),
                                           cfg.eval_timeout_s)
        except Exception as e:  # the scorer's failure is never the policy's reward
            raise InfraError("scorer_failed", f"{job.instance_id}: {type(e).__name__}: {e}") from e
        eval_time = time.monotonic() - t1
        if isinstance(score, bool):
            resolved, reward = score, outcome_reward(cfg, score)
        elif isinstance(score, int | float):
            reward = float(score)
            resolved = reward >= cfg.reward_resolved
        else:
            raise InfraError("scorer_failed", f"{job.instance_id}: actor.scorer returned "
                             f"{type(score).__name__}, not a bool or a number")
        metrics = episode_metrics(
            turns=1, tool_calls=0, total_time=time.monotonic() - t0, model_times=[rec.model_time],
            env_times=[], eval_time=eval_time, resolved=float(resolved), format_errors=0,
            submitted=float(ending == "submitted"), length_truncated_turns=float(rec.finish == "length"),
            masked=0.0)
        status = "completed" if ending == "submitted" else "truncated"
        out = EpisodeResult(job, [], res, status, reward, resolved,
                            EvalOutcome(resolved, details={"score": float(score)}), metrics, outcome=reward)
        out.samples = build_samples(cfg, out, agent.pinned or 0)
        return out
