"""The protocols over the real services: a pinned SGLang-API server (inference.client) and a
pool lease (envd.client). Every infrastructure failure becomes InfraError (never a -1); what
the agent did to its own container is not one."""

from __future__ import annotations

import asyncio
from typing import Any

from actors.protocols import EvalOutcome, ExecOutput, Generation, InfraError
from common.logs import get_logger

log = get_logger("actors.backends")


class ServerPolicy:
    """Policy over one inference server (the pinned one)."""

    def __init__(self, url: str, api_key: str | None, timeout_s: float = 600.0) -> None:
        from inference.client import SGLangClient

        self.client = SGLangClient(url, api_key=api_key, timeout_s=timeout_s)
        self.url = url
        self.generated = 0  # tokens the server generated for this episode (aborted turns too)

    async def generate(self, input_ids: list[int], sampling: dict[str, Any],
                       rid: str | None = None) -> Generation:
        from inference.client import InferenceError

        try:
            r = await self.client.generate(input_ids, sampling, rid=rid, return_logprob=True)
        except InferenceError as e:
            raise InfraError("inference_error", f"{self.url}: {e}") from e
        except Exception as e:  # connection errors after the client's own retries
            raise InfraError("inference_unreachable", f"{self.url}: {type(e).__name__}: {e}") from e
        self.generated += len(r.output_ids)
        finish = (r.finish_reason or {}).get("type", "stop") if isinstance(r.finish_reason, dict) \
            else str(r.finish_reason or "stop")
        return Generation(list(r.output_ids), [float(x) for x in r.output_logprobs], finish,
                          str(r.weight_version), r.text, r.token_versions)

    async def model_info(self) -> dict[str, Any]:
        try:
            return await self.client.get_model_info()
        except Exception as e:
            raise InfraError("inference_unreachable", f"{self.url}: {e}") from e

    async def aclose(self) -> None:
        await self.client.aclose()


class PoolEnv:
    """Env over a pool lease; evaluation runs in a fresh container with SWE-bench grading.

    `lease` may still be on its way (a task: actor.lease_ahead): the first call waits for it and
    raises its InfraError if the allocation failed."""

    def __init__(self, pool: Any, lease: Any, instance: dict[str, Any], cwd: str,
                 exec_env: dict[str, str]) -> None:
        self.pool, self.lease, self.instance = pool, lease, instance
        self.cwd, self.exec_env = cwd, exec_env

    async def lease_id(self) -> str:
        if isinstance(self.lease, asyncio.Future):
            # shielded: an episode cancelled while it waits must not cancel the allocation, whose
            # lease the episode's owner still closes
            self.lease = await asyncio.shield(self.lease)
        return str(self.lease.lease_id)

    async def exec(self, command: str, timeout_s: float) -> ExecOutput:
        lease_id = await self.lease_id()
        try:
            r = await self.pool.exec(lease_id, command, cwd=self.cwd, timeout=timeout_s,
                                     env=self.exec_env)
        except Exception as e:
            raise InfraError("env_exec", f"{type(e).__name__}: {e}") from e
        return ExecOutput(r.returncode, r.output, r.timed_out, r.duration_s)

    async def diff(self) -> str:
        from envd.client import DiffFailed

        lease_id = await self.lease_id()
        try:
            return await self.pool.diff(lease_id, cwd=self.cwd)
        except DiffFailed as e:
            # The container answered and git failed in it: the agent broke its own repository
            # (rm -rf /, a fork bomb holding every pid, .git deleted). That is the agent's
            # doing, so no patch (reward_unresolved), not an infrastructure failure that would
            # spare it the penalty.
            log.warning("diff_failed_in_container", lease=lease_id,
                        returncode=e.returncode, error=e.error[:200])
            return ""
        except Exception as e:
            raise InfraError("env_diff", f"{type(e).__name__}: {e}") from e

    async def evaluate(self, patch: str, timeout_s: float) -> EvalOutcome:
        lease_id = await self.lease_id()
        try:
            r = await self.pool.evaluate(lease_id, patch, instance=self.instance,
                                         timeout=timeout_s, cwd=self.cwd)
        except Exception as e:
            raise InfraError("env_evaluate", f"{type(e).__name__}: {e}") from e
        return EvalOutcome(r.resolved, r.error, r.timed_out, r.output,
                           {"tests_status": r.tests_status, "fail_to_pass": r.fail_to_pass,
                            "pass_to_pass": r.pass_to_pass, "returncode": r.returncode,
                            "reward_hack": r.reward_hack, "cached": r.cached})
