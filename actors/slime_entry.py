"""slime entry points running swarl's episode code, so slime's RolloutManager can drive swarl
actors:  --custom-generate-function-path actors.slime_entry.generate
         --custom-rm-path actors.slime_entry.reward_func

`generate(args, sample, sampling_params)` runs one episode for `sample.metadata["instance"]`
(the seed's prepared JSONL: {"text", "metadata": {"instance": row, "data_source"}}) against the
SGLang router (`args.sglang_router_ip/port`) and the envd pool (`args.swarl_pool_url` or
SWARL_POOL_URL, token `args.swarl_envd_token` or SWARL_ENVD_TOKEN), and fills slime's Sample:
tokens, response, response_length, loss_mask and rollout_log_probs (response part),
reward, status, weight_versions, metadata["swarl"]. The whole trajectory is one sample
(slime trains one sample per prompt); swarl's own actors add dynamic history.
Optional args: swarl_config (a swarl YAML whose `actor` section is used), swarl_api_key.
"""

from __future__ import annotations

import os
from typing import Any

from actors.config import ActorConfig
from actors.protocols import InfraError

_ENCODERS: dict[str, Any] = {}


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


def _status(sample: Any, name: str) -> Any:
    st = getattr(type(sample), "Status", None)
    if st is None:
        return name
    return getattr(st, name, None) or st.ABORTED


def _encoder(path: str) -> Any:
    if path not in _ENCODERS:
        from actors.rollout import load_encoder

        _ENCODERS[path] = load_encoder(path)
    return _ENCODERS[path]


async def generate(args: Any, sample: Any, sampling_params: dict[str, Any]) -> Any:
    from actors.backends import PoolEnv, ServerPolicy
    from actors.episode import EpisodeJob, run_episode
    from actors.templates import load_templates
    from envd.client import EnvError, EnvRequestError, PoolClient
    from envd.images import image_for

    meta = sample.metadata if isinstance(sample.metadata, dict) else {}
    instance = meta.get("instance")
    if not isinstance(instance, dict) or "instance_id" not in instance:
        raise ValueError("sample.metadata.instance: expected a SWE-bench row with instance_id")
    cfg = actor_config(args, sampling_params)
    encoder = _encoder(getattr(args, "hf_checkpoint", None) or cfg.tokenizer or "")
    url = f"http://{args.sglang_router_ip}:{args.sglang_router_port}"
    api_key = getattr(args, "swarl_api_key", None) or os.environ.get("SWARL_INFERENCE_API_KEY")
    pool = PoolClient(getattr(args, "swarl_pool_url", None) or os.environ["SWARL_POOL_URL"],
                      getattr(args, "swarl_envd_token", None) or os.environ.get("SWARL_ENVD_TOKEN"),
                      allocate_wait_s=cfg.allocate_wait_s)
    policy = ServerPolicy(url, api_key, cfg.generate_timeout_s)
    idx = getattr(sample, "index", None)
    gidx = getattr(sample, "group_index", None)
    job = EpisodeJob(f"slime:{instance['instance_id']}:{gidx}:{idx}", instance,
                     f"{instance['instance_id']}:{gidx}", int(idx or 0), 1,
                     str(meta.get("data_source", "")))
    lease = None
    try:
        try:
            lease = await pool.allocate(image_for(instance, job.data_source or None),
                                        job.instance_id, owner="slime")
        except (EnvError, EnvRequestError) as e:
            raise InfraError("allocate_failed", str(e)) from e
        env = PoolEnv(pool, lease, instance, cfg.cwd, cfg.exec_env)
        ep = await run_episode(cfg, load_templates(cfg.prompts), encoder, policy, env, job,
                               pinned_version=None)  # slime keeps the engines in sync itself
    except InfraError as e:
        sample.status = _status(sample, "FAILED")
        sample.reward = 0.0
        sample.metadata = {**meta, "swarl": {"reward": 0.0, "masked": True,
                                             "mask_reason": f"infra:{e.reason}"}}
        return sample
    finally:
        if lease is not None:
            try:
                await pool.close(lease.lease_id)
            except Exception:  # the pool reaps an unclosed lease at expiry
                pass
        await policy.aclose()
        await pool.aclose()
    (s,) = ep.samples
    p = s.prompt_len
    tokens = [int(t) for t in s.tokens]
    sample.tokens = tokens
    sample.response_length = len(tokens) - p
    sample.response = encoder.tok.decode(tokens[p:], skip_special_tokens=False)
    sample.loss_mask = [int(m) for m in s.loss_mask[p:]]
    sample.rollout_log_probs = [float(x) for x in s.rollout_logprobs[p:]]
    sample.reward = ep.reward
    sample.weight_versions = list(s.weight_versions)
    sample.status = _status(sample, "COMPLETED" if ep.status == "completed" else "TRUNCATED")
    sample.metadata = {**meta, "swarl": {
        "reward": ep.reward, "resolved": ep.resolved, "ending": ep.agent.ending,
        "masked": ep.masked, "mask_reason": ep.mask_reason, "metrics": ep.metrics,
        "patch": ep.agent.patch}}
    return sample


async def reward_func(args: Any, sample: Any, **kwargs: Any) -> float:
    """The reward generate() computed (evaluation already ran in a fresh container)."""
    info = (sample.metadata or {}).get("swarl") if isinstance(sample.metadata, dict) else None
    if not info or "reward" not in info:
        raise ValueError("sample.metadata.swarl.reward: missing (run actors.slime_entry.generate first)")
    return float(info["reward"])
