"""Config section owned by inference: the CPU server's settings (and the key every server and
client of the run shares)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from common.settings import Section


class InferenceConfig(Section):
    model: str | None = Field(None, description="HF model directory served by `swarl inference serve`.")
    host: str = Field("127.0.0.1", description="Bind address of the CPU server.")
    port: int = Field(30000, description="Port of the CPU server.")
    api_key: str | None = Field(
        None, description="Bearer token servers require and clients send (env SWARL_INFERENCE_API_KEY).")
    weight_version: str = Field("0", description="Weight version a server starts with (0 = base weights).")
    tp_size: int = Field(
        1, ge=1, description="Tensor-parallel size the CPU server acts as: it registers this tp_size and "
        "joins a weight-update group with this many receiving ranks (rank_offset + tp_rank), as an "
        "SGLang server of that size does. Generation itself runs on one worker either way.")
    role: Literal["policy", "prm", "eval"] = Field(
        "policy", description="What the server is for, registered with it: policy (pinned by actors, "
        "updated by weight sync), prm (a process reward model's judge: actors send it judge "
        "prompts; weight sync never touches it) or eval (an eval worker loads the version it "
        "evaluates into it; never pinned, weight sync never touches it).")
    threads: int = Field(2, ge=1, description="torch threads of the CPU server's generation worker.")
    max_batch_size: int = Field(32, ge=1, description="Most requests the CPU server decodes in one batch.")
    max_prefill_tokens: int = Field(
        8192, ge=1, description="Most prompt tokens (padded) prefilled in one forward; more requests wait a step.")
    heartbeat_s: float = Field(3.0, gt=0, description="Seconds between a server's registry heartbeats.")
    drain_timeout_s: float = Field(
        60.0, ge=0, description="On SIGTERM: longest wait for pinned episodes and running requests (0 = none).")
    seed: int = Field(0, description="Seed of the CPU server's sampling generator.")
