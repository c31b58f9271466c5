"""slime's extension points running swarl's leased episode, so that slime's rollout drives
swarl's agent loop, envd pool and SWE grading:
    --custom-generate-function-path actors.slime_entry.generate
    --custom-rm-path actors.slime_entry.reward_func        (best with --group-rm, see below)

`generate(args, sample, sampling_params)` runs one episode for `sample.metadata["instance"]` (a
prepared row: {"text", "metadata": {"instance": row, "data_source"}}, checked by envd's row model:
a bad one is a ValueError naming the field) against the SGLang router
(`args.sglang_router_ip/port`) and the envd pool (`args.swarl_pool_url` or SWARL_POOL_URL, token
`args.swarl_envd_token` or SWARL_ENVD_TOKEN), and returns slime's Sample:
- an episode to train: tokens = prompt + response, response_length, loss_mask and
  rollout_log_probs over the response (the same length), reward, status COMPLETED (submitted) or
  TRUNCATED (a step, context or time limit), weight_versions (one per turn),
  non_generation_time, metadata["swarl"] (reward, resolved, ending, metrics, patch);
- a masked episode (actor.compact_filtering, or no step at all): remove_sample=True, so slime
  zeroes its loss mask;
- an infrastructure failure (pool, envd, server, evaluation timeout): remove_sample=True, a
  placeholder of two tokens whose one-token response has loss mask 0 and logprob 0.0 (the shape
  slime drops without training on it), and status ABORTED while tries are left
  (`actor.slime_infra_tries`, counted in metadata["swarl"]["infra_tries"] on the sample): slime's
  fully-async rollout (slime/rollout/fully_async_rollout.py) puts a group with an ABORTED sample
  back in its data buffer and runs the ABORTED ones again. The last try answers FAILED, which
  slime neither requeues nor trains (remove_sample), so a task that keeps failing ends.
slime still counts removed samples in the group's reward normalisation, so a removed sample's own
reward is never used: `reward_func` on a group (`--group-rm`) gives it the mean reward of the
group's kept samples (the group mean is unchanged, its advantage is 0); on one sample, 0.0.
One sample per episode (the whole trajectory); no pin or version check (slime syncs its engines).
Optional args: swarl_config (a swarl YAML whose `actor` section is used), swarl_api_key.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from actors.config import ActorConfig
from actors.protocols import InfraError
from common.logs import get_logger

log = get_logger("actors.slime")

# A dropped sample's tokens: two placeholders, the second being a one-token response.
_PLACEHOLDER_TOKENS = [0, 0]


def actor_config(args: Any, sampling_params: dict[str, Any]) -> ActorConfig:
    path = getattr(args, "swarl_config", None)
    if path:
        from common.settings import load_section

        cfg = load_section(ActorConfig, path, "actor")
    else:
        cfg = ActorConfig()
    sp = cfg.sampling.model_copy(update={
        k: sampling_params[k] for k in ("temperature", "top_p", "top_k", "max_new_tokens")
        if k in sampling_params})
    ctx = getattr(args, "rollout_max_context_len", None) or cfg.max_context_len
    return cfg.model_copy(update={"sampling": sp, "dynamic_history": False, "max_context_len": ctx})


def _setting(args: Any, name: str, env: str) -> str | None:
    return getattr(args, name, None) or os.environ.get(env) or None


async def generate(args: Any, sample: Any, sampling_params: dict[str, Any]) -> Any:
    from actors.backends import ServerPolicy
    from actors.episode import EpisodeJob
    from actors.leased import LeasedEpisodes
    from envd.client import EnvdClient
    from swe.rows import validate_row

    meta = sample.metadata if isinstance(sample.metadata, dict) else {}
    if not isinstance(meta.get("instance"), dict):
        raise ValueError("sample.metadata.instance: expected a SWE row (an object)")
    # checked once, as every row swarl runs is; the row's image is fixed here
    instance = validate_row(meta["instance"], meta.get("data_source"), where="sample.metadata.instance")
    pool_url = _setting(args, "swarl_pool_url", "SWARL_POOL_URL")
    if not pool_url:
        raise ValueError("swarl_pool_url: not set (args.swarl_pool_url or SWARL_POOL_URL)")
    cfg = actor_config(args, sampling_params)
    url = f"http://{args.sglang_router_ip}:{args.sglang_router_port}"
    gidx, idx = sample.group_index, sample.index
    iid = instance["instance_id"]
    job = EpisodeJob(f"slime:{iid}:{gidx}:{idx}", instance, f"{iid}:{gidx}", int(idx or 0))
    pool = EnvdClient.pool(pool_url, _setting(args, "swarl_envd_token", "SWARL_ENVD_TOKEN"),
                      allocate_wait_s=cfg.allocate_wait_s)
    policy = ServerPolicy(url, _setting(args, "swarl_api_key", "SWARL_INFERENCE_API_KEY"),
                          cfg.generate_timeout_s)
    traj_dir = Path(cfg.traj_dir) if cfg.traj_dir and cfg.save_trajectories else None
    episodes = LeasedEpisodes(cfg, pool, owner="slime", traj_dir=traj_dir,
                              tokenizer=getattr(args, "hf_checkpoint", None) or cfg.tokenizer)
    try:
        ep = await episodes.run(job, policy, None, meta={"server": url})
    except InfraError as e:
        tries = _infra_tries(meta) + 1
        final = tries >= cfg.slime_infra_tries
        log.warning("slime_episode_infra_failure", job_id=job.job_id, reason=e.reason, tries=tries,
                    final=final, detail=e.detail[:300])
        _placeholder(sample)
        status = type(sample).Status
        sample.status = status.FAILED if final else status.ABORTED
        sample.remove_sample = True
        sample.reward = 0.0
        sample.metadata = {**meta, "swarl": {"reward": 0.0, "masked": True,
                                             "mask_reason": f"infra:{e.reason}",
                                             "error": e.detail[:500], "infra_tries": tries}}
        return sample
    finally:
        await policy.aclose()
        await pool.aclose()
    (s,) = ep.samples
    p = s.prompt_len
    tokens = [int(t) for t in s.tokens]
    if len(tokens) > p:
        sample.tokens = tokens
        sample.response_length = len(tokens) - p
        sample.response = ep.agent.conversation.enc.tok.decode(tokens[p:], skip_special_tokens=False)
        sample.loss_mask = [0] * (len(tokens) - p) if ep.masked else [int(m) for m in s.loss_mask[p:]]
        sample.rollout_log_probs = [float(x) for x in s.rollout_logprobs[p:]]
    else:  # no answer at all (the prompt alone filled the context, or no time for a turn)
        _placeholder(sample)
    sample.weight_versions = list(s.weight_versions)
    status = type(sample).Status
    sample.status = status.COMPLETED if ep.status == "completed" else status.TRUNCATED
    sample.remove_sample = ep.masked
    sample.non_generation_time = max(0.0, ep.metrics["total_time"] - ep.metrics["model_query_time_sum"])
    sample.metadata = {**meta, "swarl": {
        "reward": ep.reward, "resolved": ep.resolved, "ending": ep.agent.ending,
        "masked": ep.masked, "mask_reason": ep.mask_reason, "metrics": ep.metrics,
        "patch": ep.agent.patch, "infra_tries": _infra_tries(meta)}}
    sample.reward = 0.0 if ep.masked else ep.reward
    return sample


def _infra_tries(meta: dict[str, Any]) -> int:
    """Failed tries of this sample so far (slime hands the same Sample back after ABORTED)."""
    info = meta.get("swarl")
    n = info.get("infra_tries", 0) if isinstance(info, dict) else 0
    return n if isinstance(n, int) and n >= 0 else 0


def _placeholder(sample: Any) -> None:
    sample.tokens = list(_PLACEHOLDER_TOKENS)
    sample.response = ""
    sample.response_length = 1
    sample.loss_mask = [0]
    sample.rollout_log_probs = [0.0]


def _own_reward(sample: Any) -> float | None:
    """The episode's reward; None for a removed sample (its reward must not count)."""
    info = sample.metadata.get("swarl") if isinstance(sample.metadata, dict) else None
    if not isinstance(info, dict) or "reward" not in info:
        raise ValueError("sample.metadata.swarl.reward: missing (run actors.slime_entry.generate first)")
    if sample.remove_sample or info.get("masked"):
        return None
    return float(info["reward"])


async def reward_func(args: Any, sample: Any, **kwargs: Any) -> float | list[float]:
    """The reward generate() computed (evaluation already ran in a fresh container). A list (slime's
    --group-rm) gets one reward per sample, removed ones the mean of the kept ones."""
    if isinstance(sample, list):
        if any(isinstance(s, list) for s in sample):
            raise TypeError("reward_func: expected a group of samples, got nested lists "
                            "(generate returns one sample per episode)")
        own = [_own_reward(s) for s in sample]
        kept = [r for r in own if r is not None]
        fill = sum(kept) / len(kept) if kept else 0.0
        return [fill if r is None else r for r in own]
    r = _own_reward(sample)
    return 0.0 if r is None else r
