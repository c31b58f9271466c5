"""The agent loop: run() repeats step(); step() is observe(execute(query())). Endings are
exceptions carrying their payload (the wall-clock limit is asyncio's TimeoutError, ending
"time"). The loop talks only to the protocols."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

from actors.config import ActorConfig
from actors.context import ContextExceeded, TokenConversation
from actors.encoding import ChatEncoder
from actors.prm import StepJudge, StepView
from actors.protocols import Env, ExecOutput, Generation, InfraError, Policy
from actors.templates import PromptTemplates, detect_submission
from common.logs import get_logger

log = get_logger("actors.agent")


class EpisodeEnd(Exception):
    """An ending of the agent loop; `kind` names it."""

    kind = "ended"


class Submitted(EpisodeEnd):
    kind = "submitted"

    def __init__(self, patch: str) -> None:
        super().__init__("submitted")
        self.patch = patch


class LimitsExceeded(EpisodeEnd):
    def __init__(self, kind: str, detail: str = "") -> None:  # kind: step | context
        super().__init__(f"{kind} limit: {detail}")
        self.kind = kind


class FormatError(Exception):
    """Not exactly one action: answered in-loop with the format-error template."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


@dataclass
class StepRecord:
    """What one step saw and did: the training sample of the step is prompt_ids + answer."""

    prompt_ids: list[int]
    answer_ids: list[int]
    logprobs: list[float]
    closing_ids: list[int]
    finish: str
    weight_version: str
    n_omitted: int
    text: str
    token_versions: list[int] | None = None  # per answer token, where the server gave spans
    action: str | None = None
    observation: str = ""
    returncode: int | None = None
    format_error: bool = False
    model_time: float = 0.0
    env_time: float = 0.0
    prm_score: float | None = None   # the PRM's mean vote (None: not judged or unscored)
    prm_votes: list[int | None] = field(default_factory=list)
    prm_status: str = ""             # scored | unscored (prm_reason says why) | "" not judged
    prm_reason: str = ""


@dataclass
class AgentResult:
    ending: str                      # submitted | step | context | time
    patch: str
    steps: list[StepRecord]
    messages: list[dict[str, str]]
    conversation: TokenConversation
    format_errors: int = 0


class Agent:
    def __init__(self, cfg: ActorConfig, templates: PromptTemplates, encoder: ChatEncoder,
                 policy: Policy, env: Env, pinned_version: int | None = None,
                 rid_prefix: str = "", judge: StepJudge | None = None,
                 sampling_seed: int | None = None, follow_updates: bool = False) -> None:
        self.cfg, self.t, self.enc, self.policy, self.env = cfg, templates, encoder, policy, env
        self.judge = judge  # a PRM judging each executed step in the background
        self.pinned = pinned_version
        # weight_sync.rollout_mode in-flight: the server may load a newer version between or
        # during turns; each turn records the oldest version that may have produced it (below)
        self.follow_updates = follow_updates
        self._reported = pinned_version  # the version the server answered last (or was pinned at)
        self.rid_prefix = rid_prefix
        # one seed for every turn: the server draws from (seed, token position), so an episode
        # replayed over the same prefix makes the same draws
        self.sampling_seed = sampling_seed
        # live while the loop runs: what a failed episode's trajectory is written from
        self.steps: list[StepRecord] = []
        self.messages: list[dict[str, str]] = []
        self.format_errors = 0
        self.result: AgentResult | None = None

    # -- the loop ----------------------------------------------------------------------
    def begin(self, task: str, instance: dict[str, Any]) -> None:
        """The conversation's start: the system and task messages."""
        variables = {"task": task, "instance": instance, "step_limit": self.cfg.step_limit,
                     "cwd": self.cfg.cwd}
        system = self.t.render("system", **variables)
        user = self.t.render("instance", **variables)
        self.messages = [{"role": "system", "content": system}, {"role": "user", "content": user}]
        self.conv = TokenConversation(
            self.enc, system, user, lambda n: self.t.render("context_marker", n_omitted=n))

    async def run(self, task: str, instance: dict[str, Any]) -> AgentResult:
        self.begin(task, instance)
        patch = ""
        try:
            async with asyncio.timeout(self.cfg.episode_timeout_s):
                while True:
                    await self.step()
        except Submitted as e:
            ending, patch = e.kind, e.patch
        except LimitsExceeded as e:
            ending = e.kind
        except TimeoutError:
            ending = "time"
        if ending != "submitted":
            patch = await self._diff()
        self.result = AgentResult(ending, patch, self.steps, self.messages, self.conv,
                                  self.format_errors)
        return self.result

    async def step(self) -> None:
        if self.cfg.step_limit and len(self.steps) >= self.cfg.step_limit:
            raise LimitsExceeded("step", f"{self.cfg.step_limit} steps")
        rec = await self.query()
        try:
            action = self.parse(rec)
        except FormatError as e:
            self.format_errors += 1
            rec.format_error = True
            self.observe(rec, e.message)
            return
        out = await self.execute(rec, action)
        if (sub := detect_submission(self.t, out.returncode, out.output)) is not None:
            raise Submitted(sub.patch)
        self.observe(rec, self.t.render("observation", output=out))
        if self.judge is not None:  # returns at once: the votes overlap the next steps
            self.judge.submit(StepView(len(self.steps) - 1, rec.text, action, out.returncode, out.output))

    # -- the parts ---------------------------------------------------------------------
    async def query(self) -> StepRecord:
        c = self.cfg
        max_input = c.max_context_len - c.sampling.max_new_tokens
        try:
            view = self.conv.context(max_input, c.head_ratio,
                                     manage=c.context_management and c.dynamic_history)
        except ContextExceeded as e:
            raise LimitsExceeded("context", str(e)) from None
        sampling = {"temperature": c.sampling.temperature, "top_p": c.sampling.top_p,
                    "top_k": c.sampling.top_k, "stop_token_ids": [self.enc.eos_id],
                    "max_new_tokens": min(c.sampling.max_new_tokens, c.max_context_len - len(view.ids)),
                    "skip_special_tokens": True, "no_stop_trim": True}
        if self.sampling_seed is not None:
            sampling["sampling_seed"] = self.sampling_seed
        t0 = time.monotonic()
        gen = await self.policy.generate(view.ids, sampling, f"{self.rid_prefix}{len(self.steps)}")
        dt = time.monotonic() - t0
        self._check(gen)
        stopped = gen.finish == "stop"
        self.conv.add_answer(gen.ids, gen.logprobs, stopped)
        text = gen.text if gen.text is not None else self.enc.tok.decode(gen.ids, skip_special_tokens=True)
        rec = StepRecord(view.ids, list(gen.ids), list(gen.logprobs), self.conv.blocks[-1].closing,
                         gen.finish, self._turn_version(gen), view.n_omitted, text, model_time=dt,
                         token_versions=self._token_versions(gen))
        self.steps.append(rec)
        self.messages.append({"role": "assistant", "content": text})
        return rec

    def _token_versions(self, gen: Generation) -> list[int] | None:
        """Each answer token's version from the server's spans (meta_info.weight_versions);
        None when it gave none, or one that is not a policy version."""
        if not self.follow_updates or gen.token_versions is None or len(gen.token_versions) != len(gen.ids):
            return None
        try:
            return [int(v) for v in gen.token_versions]
        except ValueError:
            return None

    def _turn_version(self, gen: Generation) -> str:
        """The version a turn is recorded at. Pinned: the server's (checked equal to the pin).
        In-flight: where the server says which tokens each version made (SGLang 0.5.23's
        weight_versions spans), the oldest of them. Otherwise a turn's tokens were made by
        versions from the one the server had when the turn began — at least the one it answered
        last — to the one it answers now (an update while the request waited retracted); both
        are known, not the split, so the turn counts as the older: a sample's staleness is never
        understated."""
        if not self.follow_updates:
            return gen.weight_version
        per_token = self._token_versions(gen)
        if per_token:
            self._reported = per_token[-1]
            return str(min(per_token))
        try:
            now = int(gen.weight_version)
        except ValueError:
            raise InfraError("weight_version_unknown", f"the server answered weight_version "
                             f"{gen.weight_version!r}, not a policy version") from None
        before = self._reported if self._reported is not None else now
        self._reported = now
        return str(min(before, now))

    def _check(self, gen: Generation) -> None:
        if gen.finish == "abort":
            raise InfraError("generation_aborted", "the server aborted the request")
        if self.follow_updates:
            pass  # the version may move under the episode: recorded per turn (_turn_version)
        elif self.pinned is not None and str(gen.weight_version) != str(self.pinned):
            raise InfraError("weight_version_mismatch",
                             f"pinned {self.pinned}, server answered {gen.weight_version!r}")
        if not gen.ids:
            raise InfraError("empty_generation", "the server returned no tokens")

    def parse(self, rec: StepRecord) -> str:
        actions = self.t.parse_actions(rec.text)
        if len(actions) != 1:
            raise FormatError(self.t.render("format_error", actions=actions, n_actions=len(actions)))
        rec.action = actions[0]
        return actions[0]

    async def execute(self, rec: StepRecord, action: str) -> ExecOutput:
        t0 = time.monotonic()
        out = await self.env.exec(action, self.cfg.exec_timeout_s)
        rec.env_time = time.monotonic() - t0
        rec.returncode = out.returncode
        return out

    def observe(self, rec: StepRecord, text: str) -> None:
        rec.observation = text
        self.conv.add_observation(text)
        self.messages.append({"role": "user", "content": text})

    async def _diff(self) -> str:
        try:
            return await asyncio.wait_for(self.env.diff(), timeout=max(30.0, self.cfg.exec_timeout_s))
        except InfraError:
            raise
        except Exception as e:
            raise InfraError("diff_failed", f"{type(e).__name__}: {e}") from e
