"""Trajectory artifacts, one directory per episode attempt: <dir>/<instance_id>__<ts>/traj.json
(the conversation + per-step debug; for a failed attempt what it did until then, and its
error), patch.diff, meta.json (model, sampling params, versions). A reward-hack attempt (a patch
envd refused for changing how tests run or report) is also listed in <dir>/reward_hacks.jsonl,
and its trajectory is written even when trajectories are otherwise off."""

from __future__ import annotations

import json
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from actors.agent import Agent
from actors.episode import EpisodeJob, EpisodeResult
from actors.protocols import InfraError


def _error(error: BaseException) -> dict[str, str]:
    if isinstance(error, InfraError):
        return {"type": "InfraError", "reason": error.reason, "detail": error.detail}
    return {"type": type(error).__name__, "reason": type(error).__name__, "detail": str(error)}


def write_trajectory(root: str | Path, job: EpisodeJob, agent: Agent | None, ep: EpisodeResult | None,
                     error: BaseException | None, meta: dict[str, Any]) -> Path:
    """`agent` None: the attempt failed before its loop started (e.g. no container)."""
    ts = time.strftime("%Y%m%d_%H%M%S", time.gmtime()) + f"_{time.time_ns() % 10**6:06d}"
    d = Path(root) / f"{job.instance_id.replace('/', '_')}__{ts}"
    d.mkdir(parents=True, exist_ok=True)
    steps = []
    for k, s in enumerate(agent.steps if agent else []):
        rec = asdict(s)
        rec.pop("prompt_ids")  # big and recoverable from the samples; keep lengths
        rec["step"] = k
        rec["prompt_tokens"] = len(s.prompt_ids)
        steps.append(rec)
    result = agent.result if agent else None
    traj: dict[str, Any] = {
        "instance_id": job.instance_id, "job_id": job.job_id, "group_id": job.group_id,
        "sample_index": job.sample_index, "messages": agent.messages if agent else [],
        "step_debug": steps, "ending": result.ending if result else "error",
        "error": None if error is None else _error(error),
    }
    if ep is not None:
        traj.update(status=ep.status, reward=ep.reward, resolved=ep.resolved, masked=ep.masked,
                    mask_reason=ep.mask_reason, metrics=ep.metrics,
                    evaluation=None if ep.evaluation is None else asdict(ep.evaluation))
        if ep.prm:  # the PRM's judgement: per step its score, votes and why a step is unscored
            traj["prm"] = {"outcome_reward": ep.outcome, "step_rewards": ep.step_rewards,
                           "steps": [sc.to_dict() for sc in ep.prm]}
    hack = (ep.evaluation.details.get("reward_hack") if ep is not None and ep.evaluation else None) or []
    traj["reward_hack"] = hack
    (d / "traj.json").write_text(json.dumps(traj, indent=1, ensure_ascii=False, default=str))
    if hack:  # one line per attempt: where to find it and what it tried
        with (Path(root) / "reward_hacks.jsonl").open("a") as f:
            f.write(json.dumps({"dir": d.name, "instance_id": job.instance_id, "job_id": job.job_id,
                                "kinds": sorted({h.get("kind", "") for h in hack}),
                                "reasons": [h.get("reason", "") for h in hack]}) + "\n")
    (d / "patch.diff").write_text(result.patch if result else "")
    (d / "meta.json").write_text(json.dumps(meta, indent=1, ensure_ascii=False, default=str))
    return d
