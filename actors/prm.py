"""Step scores from a process reward model (the seed's --prm-enable, swe_prm.py).

After each executed step the agent hands the step to a `StepJudge`; it starts one asyncio task
that renders the judge prompt (configs/prompts/prm_judge.yaml) and sends m votes to a judge
server's /v1/chat/completions, while the agent goes on with its next step. At the end of the
episode `collect()` waits for the outstanding tasks, at most prm.timeout_s. A vote scores +1 or
-1 only from a strict `\\boxed{+1}` / `\\boxed{-1}`; an unparseable vote is counted and left out;
a step whose votes all failed (HTTP error, timeout, judge down) or were unparseable is
unscored — never -1, and the episode never waits past the bound.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from jinja2 import Template

from actors.config import PrmConfig
from actors.context import head_tail
from actors.templates import TemplateError, read_template_mapping, strict_env, template_file
from common.logs import get_logger

log = get_logger("actors.prm")

DEFAULT_TEMPLATE = Path(__file__).resolve().parent.parent / "configs" / "prompts" / "prm_judge.yaml"

# The seed's rule: the first \boxed{...} of the answer, whose content is exactly a number equal
# to +1 or -1 ("+1", "-1", "1", "1.0"); anything else is no vote.
_BOXED = re.compile(r"\\boxed\{((?:[^{}]|\{[^{}]*\})*)\}", re.DOTALL)
_NUMBER = re.compile(r"\s*([-+]?\d+(?:\.\d+)?)\s*")


def parse_vote(text: str) -> int | None:
    """+1 or -1 from the judge's answer, None when it carries no valid score."""
    m = _BOXED.search(text or "")
    if m is None:
        return None
    num = _NUMBER.fullmatch(m.group(1))
    if num is None:
        return None
    value = float(num.group(1))
    return 1 if value == 1.0 else -1 if value == -1.0 else None


class JudgeTemplates:
    """The judge's system and user templates (Jinja2 in YAML, StrictUndefined)."""

    def __init__(self, path: str | Path | None = None) -> None:
        p = template_file(path, DEFAULT_TEMPLATE)
        try:
            doc = read_template_mapping(p, ("system", "user"))
            env = strict_env()
            self._t: dict[str, Template] = {k: env.from_string(str(doc[k])) for k in ("system", "user")}
        except TemplateError as e:  # names the file already
            raise ValueError(f"prm.template: {e}") from e
        except Exception as e:  # jinja2 raises several types
            raise ValueError(f"prm.template: {p}: {e}") from e

    def messages(self, **variables: Any) -> list[dict[str, str]]:
        return [{"role": k, "content": self._t[k].render(**variables).strip("\n")} for k in ("system", "user")]


def elide(text: str, limit: int) -> str:
    """Head and tail of a long output, with the count of characters left out between."""
    if len(text) <= limit:
        return text
    half = limit // 2
    return f"{text[:half]}\n... ({len(text) - 2 * half} characters omitted) ...\n{text[-half:]}"


@dataclass
class StepView:
    """What the judge sees of one executed step."""

    index: int          # 0-based step index in the episode
    response: str       # the agent's full answer
    action: str
    returncode: int | None
    output: str         # the raw command output


@dataclass
class StepScore:
    index: int
    votes: list[int | None] = field(default_factory=list)  # one per vote answered (None: unparseable)
    failed: int = 0            # votes whose call failed or timed out
    status: str = "pending"    # scored | unscored
    reason: str = ""           # why unscored: judge_failed | no_valid_vote | timeout | cancelled
    latency_s: float = 0.0

    @property
    def valid(self) -> list[int]:
        return [v for v in self.votes if v is not None]

    @property
    def score(self) -> float | None:
        """Mean of the valid votes; None when unscored."""
        return sum(self.valid) / len(self.valid) if self.status == "scored" and self.valid else None

    def to_dict(self) -> dict[str, Any]:
        return {"step": self.index, "score": self.score, "votes": self.votes, "failed": self.failed,
                "status": self.status, "reason": self.reason, "latency_s": round(self.latency_s, 3)}


class JudgeClient(Protocol):
    async def chat(self, messages: list[dict[str, str]], cfg: PrmConfig) -> str: ...


class HttpJudge:
    """Votes over /v1/chat/completions of the judge servers, round-robin; `urls` gives the
    current list (static, or the registry's prm pool)."""

    def __init__(self, urls: Callable[[], Awaitable[list[str]]], api_key: str | None, timeout_s: float) -> None:
        import httpx

        from common.http import tls_context

        self._urls = urls
        self._rr = itertools.count()
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.http = httpx.AsyncClient(headers=headers, timeout=httpx.Timeout(timeout_s, connect=10.0),
                                      verify=tls_context())

    async def chat(self, messages: list[dict[str, str]], cfg: PrmConfig) -> str:
        urls = await self._urls()
        if not urls:
            raise RuntimeError("no judge server (prm.urls empty and no ready server of role prm)")
        url = urls[next(self._rr) % len(urls)].rstrip("/")
        r = await self.http.post(f"{url}/v1/chat/completions", json={
            "model": cfg.model, "messages": messages, "temperature": cfg.temperature,
            "max_tokens": cfg.max_tokens})
        if r.status_code != 200:
            raise RuntimeError(f"{url}: HTTP {r.status_code}: {r.text[:200]}")
        return str(r.json()["choices"][0]["message"]["content"] or "")

    async def aclose(self) -> None:
        await self.http.aclose()


class StepJudge:
    """One episode's judging: `submit` a step (returns at once), `collect` at the end."""

    def __init__(self, cfg: PrmConfig, client: JudgeClient, templates: JudgeTemplates, issue: str,
                 count_tokens: Callable[[str], int], head_ratio: float = 0.3) -> None:
        self.cfg, self.client, self.t = cfg, client, templates
        self.issue = elide(issue, cfg.problem_chars)
        self.count_tokens, self.head_ratio = count_tokens, head_ratio
        self.history: list[dict[str, Any]] = []   # earlier executed steps as the judge sees them
        self._lengths: list[int] = []
        self.scores: dict[int, StepScore] = {}
        self.tasks: dict[int, asyncio.Task[None]] = {}

    def prompt(self, step: StepView) -> list[dict[str, str]]:
        head, tail = head_tail(self._lengths, self.cfg.history_tokens, self.head_ratio)
        shown = self.history[:head] + self.history[tail:]
        return self.t.messages(
            issue=self.issue, history=shown, n_history=len(shown), n_omitted=tail - head,
            step=step.index + 1, response=step.response,
            returncode="?" if step.returncode is None else step.returncode,
            output=elide(step.output, self.cfg.output_chars))

    def submit(self, step: StepView) -> None:
        """Start judging `step` in the background; the step joins the history of later ones."""
        messages = self.prompt(step)
        h = {"n": step.index + 1, "action": step.action,
             "returncode": "?" if step.returncode is None else step.returncode,
             "output": elide(step.output, self.cfg.history_output_chars)}
        self.history.append(h)
        self._lengths.append(self.count_tokens(f"Step {h['n']}: $ {h['action']}\n{h['output']}"))
        score = self.scores[step.index] = StepScore(step.index)
        self.tasks[step.index] = asyncio.create_task(self._judge(messages, score),
                                                     name=f"prm-step-{step.index}")

    async def _vote(self, messages: list[dict[str, str]], score: StepScore) -> None:
        try:
            text = await asyncio.wait_for(self.client.chat(messages, self.cfg), self.cfg.timeout_s)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # the judge's trouble is never the agent's: the vote is lost
            score.failed += 1
            log.debug("prm_vote_failed", step=score.index, error=f"{type(e).__name__}: {e}"[:300])
            return
        score.votes.append(parse_vote(text))

    async def _judge(self, messages: list[dict[str, str]], score: StepScore) -> None:
        t0 = time.monotonic()
        try:
            await asyncio.gather(*[self._vote(messages, score) for _ in range(self.cfg.m)])
        finally:
            score.latency_s = time.monotonic() - t0
            if score.valid:
                score.status = "scored"
            else:
                score.status = "unscored"
                score.reason = "judge_failed" if score.failed else "no_valid_vote"

    async def collect(self) -> list[StepScore]:
        """Wait (at most prm.timeout_s) for the outstanding votes; steps still out are cancelled
        and unscored. Scores in step order."""
        pending = [t for t in self.tasks.values() if not t.done()]
        if pending:
            await asyncio.wait(pending, timeout=self.cfg.timeout_s)
        for k, t in self.tasks.items():
            if not t.done():
                await _stop(t, self.scores[k], "timeout")
        return [self.scores[k] for k in sorted(self.scores)]

    async def cancel(self) -> None:
        """The episode ended otherwise (an infrastructure failure, a cancel): stop judging."""
        for k, t in self.tasks.items():
            if not t.done():
                await _stop(t, self.scores[k], "cancelled")


async def _stop(task: asyncio.Task[None], score: StepScore, reason: str) -> None:
    """Cancel a step's judging: the votes already back still count; with none it is unscored."""
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    if not score.valid:
        score.status, score.reason = "unscored", reason


def prm_metrics(scores: list[StepScore], steps_total: int) -> dict[str, float]:
    """agent/prm_* metrics of one episode."""
    votes = [v for s in scores for v in s.votes]
    scored = [s.score for s in scores if s.score is not None]
    return {
        "prm_steps_judged": float(len(scores)),
        "prm_steps_scored": float(len(scored)),
        "prm_steps_unscored": float(len(scores) - len(scored)),
        "prm_steps_not_judged": float(steps_total - len(scores)),
        "prm_votes": float(len(votes)),
        "prm_votes_invalid": float(sum(v is None for v in votes)),
        "prm_votes_failed": float(sum(s.failed for s in scores)),
        "prm_step_score_mean": sum(scored) / len(scored) if scored else 0.0,
        "prm_judge_latency_max": max((s.latency_s for s in scores), default=0.0),
    }
