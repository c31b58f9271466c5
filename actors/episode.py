"""One episode on the protocols: agent loop → evaluation of the patch → reward → samples.
No Redis, Docker or HTTP here (actors/leased.py runs it on a pool lease)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from actors.agent import Agent, AgentResult, StepRecord
from actors.config import ActorConfig
from actors.encoding import ChatEncoder
from actors.metrics import episode_metrics
from actors.prm import StepJudge, StepScore, prm_metrics
from actors.protocols import Env, EvalOutcome, Policy
from actors.reward import outcome_reward, prm_episode_reward, prm_step_rewards
from actors.templates import PromptTemplates
from broker.wire import Sample

LIMIT_ENDINGS = ("step", "context", "time")


def image_of(instance: dict[str, Any]) -> str:
    """The row's `image_name`: fixed once, when the data is prepared or enqueued."""
    name = instance.get("image_name")
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"{instance.get('instance_id')}: instance.image_name: missing (rows get "
                         "their image at data prepare / enqueue)")
    return name


@dataclass(frozen=True)
class EpisodeJob:
    """The arq job payload (broker.tasks.Job.payload) as the episode uses it."""

    job_id: str
    instance: dict[str, Any]
    group_id: str
    sample_index: int
    n_samples: int = 1
    # sent as SGLang's sampling_seed with every turn: evaluations pass one per (task, sample)
    # so that two policies meet the same random draws (common random numbers); None in training
    sampling_seed: int | None = None

    @classmethod
    def from_payload(cls, p: dict[str, Any], need_image: bool = True) -> EpisodeJob:
        """`need_image`: the episode runs in a container (actor.environment envd)."""
        for name in ("job_id", "instance", "group_id", "sample_index"):
            if name not in p:
                raise ValueError(f"job payload: {name}: missing")
        if not isinstance(p["instance"], dict) or "instance_id" not in p["instance"]:
            raise ValueError("job payload: instance: expected a row with instance_id")
        if need_image:
            image_of(p["instance"])  # a row without its image is refused before it takes a slot
        seed = p.get("sampling_seed")
        return cls(str(p["job_id"]), p["instance"], str(p["group_id"]), int(p["sample_index"]),
                   int(p.get("n_samples", 1)), None if seed is None else int(seed))

    @property
    def instance_id(self) -> str:
        return str(self.instance["instance_id"])

    @property
    def image(self) -> str:
        return image_of(self.instance)

    @property
    def task(self) -> str:
        return str(self.instance.get("problem_statement") or self.instance.get("prompt")
                   or self.instance.get("text") or "")


@dataclass
class EpisodeResult:
    job: EpisodeJob
    samples: list[Sample]
    agent: AgentResult
    status: str                  # completed | truncated
    reward: float
    resolved: bool
    evaluation: EvalOutcome | None
    metrics: dict[str, float]
    masked: bool = False
    mask_reason: str = ""
    traj_dir: Path | None = None   # where its trajectory was written, if it was
    outcome: float = 0.0           # the outcome reward alone (reward adds the PRM's part)
    step_rewards: list[float] | None = None  # per step (prm.reward_mode step), else None
    prm: list[StepScore] = field(default_factory=list)  # the judged steps' scores and votes


def make_agent(cfg: ActorConfig, templates: PromptTemplates, encoder: ChatEncoder, policy: Policy,
               env: Env, job: EpisodeJob, pinned_version: int | None,
               judge: StepJudge | None = None, follow_updates: bool = False) -> Agent:
    """pinned_version None: no weight-version check (slime keeps its engines in sync);
    follow_updates: the version may move under the episode (weight_sync.rollout_mode in-flight)."""
    return Agent(cfg, templates, encoder, policy, env, pinned_version, rid_prefix=f"{job.job_id}:",
                 judge=judge, sampling_seed=job.sampling_seed, follow_updates=follow_updates)


async def run_episode(agent: Agent, job: EpisodeJob,
                      on_generated: Callable[[], Awaitable[None]] | None = None) -> EpisodeResult:
    """The agent's loop on the job's task, then evaluation, reward and samples. On an exception
    the agent keeps what the loop did so far (its steps and messages). `on_generated` is awaited
    once the policy has written its last turn, before grading: the caller lets go of the
    inference server there (grading a patch can take minutes and needs no policy)."""
    cfg, env = agent.cfg, agent.env
    t0 = time.monotonic()
    try:
        res = await agent.run(job.task, job.instance)
        if on_generated is not None:
            await on_generated()
        evaluation, eval_time = None, 0.0
        if res.patch.strip():
            t1 = time.monotonic()
            evaluation = await env.evaluate(res.patch, cfg.eval_timeout_s)
            eval_time = time.monotonic() - t1
            # Tests that outlive actor.eval_timeout_s are the patch's doing as far as the reward
            # knows (SWE-bench's harness grades a timeout unresolved): a patch that makes the tests
            # hang must earn -1, not an infrastructure retry that ends masked. envd not answering
            # at all is still an InfraError (raised by the env).
        # the judge's last votes ran during the evaluation; wait for the rest, bounded
        scores = await agent.judge.collect() if agent.judge is not None else []
    finally:
        if agent.judge is not None:
            await asyncio.shield(agent.judge.cancel())  # nothing left judging after the episode
    resolved = bool(evaluation and evaluation.resolved)
    # A patch refused for changing how tests run or report (swe.tamper): never rewarded, counted.
    hack = bool(evaluation and evaluation.details.get("reward_hack"))
    # by kind too (swe.tamper.KINDS): agent/reward_hack_attempts/<kind> in the learner's log
    hacks = (evaluation.details.get("reward_hack") if evaluation else None) or []
    hack_kinds = sorted({str(h.get("kind")) for h in hacks})
    resolved = resolved and not hack
    outcome = reward = outcome_reward(cfg, resolved, res.format_errors)
    step_rewards = None
    if agent.judge is not None:
        step_scores = _record_scores(res.steps, scores)
        reward = prm_episode_reward(cfg.prm, outcome, step_scores)
        if cfg.prm.reward_mode == "step" and cfg.dynamic_history:
            step_rewards = prm_step_rewards(cfg.prm, outcome, step_scores)
    status = "completed" if res.ending == "submitted" else "truncated"
    masked = cfg.compact_filtering and res.ending in LIMIT_ENDINGS
    mask_reason = f"compact_filtering:{res.ending}" if masked else ""
    if not res.steps:
        masked, mask_reason = True, f"no_steps:{res.ending}"
    steps = res.steps
    metrics = episode_metrics(
        turns=len(steps), tool_calls=sum(1 for s in steps if s.action is not None),
        total_time=time.monotonic() - t0, model_times=[s.model_time for s in steps],
        env_times=[s.env_time for s in steps], eval_time=eval_time,
        resolved=float(resolved), format_errors=res.format_errors,
        context_truncations=sum(1 for s in steps if s.n_omitted),
        length_truncated_turns=sum(1 for s in steps if s.finish == "length"),
        submitted=float(res.ending == "submitted"), limit_hit=float(res.ending in LIMIT_ENDINGS),
        reward_hack_attempts=float(hack), **{f"reward_hack_attempts/{k}": 1.0 for k in hack_kinds},
        eval_timed_out=float(bool(evaluation and evaluation.timed_out)),
        eval_cached=float(bool(evaluation and evaluation.details.get("cached"))),
        masked=float(masked))
    if agent.judge is not None:
        metrics.update(prm_metrics(scores, len(steps)), outcome_reward=outcome)
    out = EpisodeResult(job, [], res, status, reward, resolved, evaluation, metrics, masked, mask_reason,
                        outcome=outcome, step_rewards=step_rewards, prm=scores)
    out.samples = build_samples(cfg, out, agent.pinned or 0)
    return out


def _record_scores(steps: list[StepRecord], scores: list[StepScore]) -> list[float | None]:
    """Each judged step's score and votes onto its record; the scores in step order."""
    for sc in scores:
        rec = steps[sc.index]
        rec.prm_score, rec.prm_votes, rec.prm_status, rec.prm_reason = sc.score, list(sc.votes), sc.status, sc.reason
    return [s.prm_score for s in steps]


def build_samples(cfg: ActorConfig, ep: EpisodeResult, policy_version: int) -> list[Sample]:
    job, steps = ep.job, ep.agent.steps
    versions = [s.weight_version for s in steps]
    # each generated token carries its turn's version (-1: not generated); a sample's
    # policy_version is its oldest trained token's, what the learner's staleness bound applies to
    turn_v = [_as_version(v, policy_version) for v in versions]
    # per answer token: the server's spans where it gave them, else the turn's version
    answer_v = [s.token_versions if s.token_versions is not None and len(s.token_versions) == len(s.answer_ids)
                else [turn_v[k]] * len(s.answer_ids) for k, s in enumerate(steps)]

    def sample(k: int, total: int, tokens: list[int], mask: list[int], lps: list[float],
               prompt_len: int, wv: list[str], tv: list[int] | None = None) -> Sample:
        metrics, reward = ep.metrics, ep.reward
        if ep.prm and total > 1:  # a step's own sample carries its score and votes
            metrics, s = dict(ep.metrics), steps[k]
            if s.prm_score is not None:
                metrics["prm_step_score"] = s.prm_score
            metrics["prm_step_votes_pos"] = float(sum(v == 1 for v in s.prm_votes))
            metrics["prm_step_votes_neg"] = float(sum(v == -1 for v in s.prm_votes))
        if ep.step_rewards is not None and total == len(ep.step_rewards):
            reward = ep.step_rewards[k]
        tva = np.asarray(tv if tv is not None else [-1] * len(tokens), np.int32)
        trained_v = tva[(np.asarray(mask) == 1) & (tva >= 0)]
        oldest = int(trained_v.min()) if trained_v.size else policy_version
        return Sample(tokens=np.asarray(tokens, np.int32), loss_mask=np.asarray(mask, np.uint8),
                      rollout_logprobs=np.asarray(lps, np.float32), prompt_len=prompt_len,
                      reward=reward, group_id=job.group_id, sample_index=job.sample_index,
                      instance_id=job.instance_id, policy_version=oldest, token_versions=tva,
                      sample_id=f"{job.job_id}:{k}", episode_id=job.job_id, weight_versions=wv,
                      status=ep.status, step_index=k, steps_total=total, masked=ep.masked,
                      mask_reason=ep.mask_reason, metrics=metrics)

    if not steps:
        p = ep.agent.conversation.prompt
        return [sample(0, 1, p, [0] * len(p), [0.0] * len(p), len(p), [])]
    # one block of the conversation per step: a garbled reply's tokens may be left out of the loss
    trained = [0 if cfg.mask_format_errors and s.format_error else 1 for s in steps]
    if cfg.dynamic_history and not one_sample(cfg, ep):
        out = []
        for k, s in enumerate(steps):
            n_p, n_a, n_c = len(s.prompt_ids), len(s.answer_ids), len(s.closing_ids)
            out.append(sample(k, len(steps), s.prompt_ids + s.answer_ids + s.closing_ids,
                              [0] * n_p + [trained[k]] * n_a + [0] * n_c,
                              [0.0] * n_p + s.logprobs + [0.0] * n_c, n_p, versions[: k + 1],
                              [-1] * n_p + answer_v[k] + [-1] * n_c))
        return out
    conv = ep.agent.conversation
    tokens, mask, lps = list(conv.prompt), [0] * len(conv.prompt), [0.0] * len(conv.prompt)
    tv = [-1] * len(conv.prompt)
    for i, b in enumerate(conv.blocks):
        obs = b.observation if i < len(conv.blocks) - 1 else []  # nothing follows the last answer
        tokens += b.gen_prompt + b.answer + b.closing + obs
        mask += [0] * len(b.gen_prompt) + [trained[i]] * len(b.answer) + [0] * (len(b.closing) + len(obs))
        lps += [0.0] * len(b.gen_prompt) + b.logprobs + [0.0] * (len(b.closing) + len(obs))
        av = answer_v[i] if len(answer_v[i]) == len(b.answer) else [turn_v[i]] * len(b.answer)
        tv += [-1] * len(b.gen_prompt) + av + [-1] * (len(b.closing) + len(obs))
    return [sample(0, 1, tokens, mask, lps, len(conv.prompt), versions, tv)]


def one_sample(cfg: ActorConfig, ep: EpisodeResult) -> bool:
    """Whether the episode's steps go into one sample (actor.sample_per auto): no step's context
    was cut, so every step saw the conversation up to it unchanged, the prompt of the last step
    holds all earlier ones, and one sample carries each trained token after the very context the
    step's sample would. Step rewards and PRM scores stay per step."""
    if cfg.sample_per != "auto" or ep.prm or ep.step_rewards is not None:
        return False
    steps, conv = ep.agent.steps, ep.agent.conversation
    if any(s.n_omitted for s in steps):
        return False
    last = steps[-1]
    full = conv.full_ids()
    end = len(full) - len(conv.blocks[-1].observation)
    # defensive: the last step's sample must be the conversation up to its answer, token for token
    return full[:end] == last.prompt_ids + last.answer_ids + last.closing_ids


def _as_version(v: str, default: int) -> int:
    """A turn's recorded weight_version as a policy version (a server that reports none, as
    slime's engines: the episode's)."""
    try:
        return int(v)
    except (TypeError, ValueError):
        return default


def failure_samples(encoder: ChatEncoder, templates: PromptTemplates, cfg: ActorConfig,
                    job: EpisodeJob, policy_version: int, reason: str, kind: str = "infra") -> list[Sample]:
    """One masked sample for an episode lost (to infrastructure, or abandoned): it completes the
    learner's group without biasing it (masked samples are excluded from loss and group statistics)."""
    variables = {"task": job.task, "instance": job.instance, "step_limit": cfg.step_limit,
                 "cwd": cfg.cwd}
    p = encoder.prompt(templates.render("system", **variables), templates.render("instance", **variables))
    return [Sample(tokens=np.asarray(p, np.int32), loss_mask=np.zeros(len(p), np.uint8),
                   rollout_logprobs=np.zeros(len(p), np.float32),
                   prompt_len=len(p), reward=0.0, group_id=job.group_id,
                   sample_index=job.sample_index, instance_id=job.instance_id,
                   policy_version=policy_version, sample_id=f"{job.job_id}:0",
                   episode_id=job.job_id, status="failed", step_index=0, steps_total=1,
                   masked=True, mask_reason=f"{kind}:{reason}")]
