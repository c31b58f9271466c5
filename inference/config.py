"""Config section owned by inference: CPU server and client settings."""

from __future__ import annotations

from pydantic import Field

from common.settings import Section


class InferenceConfig(Section):
    model: str | None = Field(None, description="HF model directory served by `swarl inference serve`.")
    host: str = Field("127.0.0.1", description="Bind address of the CPU server.")
    port: int = Field(30000, description="Port of the CPU server.")
    urls: list[str] = Field(default_factory=list, description="Inference servers actors may use (else the registry).")
    api_key: str | None = Field(
        None, description="Bearer token servers require and clients send (env SWARL_INFERENCE_API_KEY).")
    weight_version: str = Field("0", description="Weight version a server starts with (0 = base weights).")
    threads: int = Field(2, description="torch threads of the CPU server's generation worker.")
    max_batch_size: int = Field(32, description="Most requests the CPU server decodes in one batch.")
    max_prefill_tokens: int = Field(
        8192, description="Most prompt tokens (padded) prefilled in one forward; more requests wait a step.")
    heartbeat_s: float = Field(3.0, description="Seconds between a server's registry heartbeats.")
    drain_timeout_s: float = Field(
        60.0, description="On SIGTERM: longest wait for pinned episodes and running requests (0 = none).")
    seed: int = Field(0, description="Seed of the CPU server's sampling generator.")
    client_timeout_s: float = Field(600.0, description="Client: total timeout of one HTTP call, seconds.")
    client_retries: int = Field(3, description="Client: retries on connection errors (never on 4xx).")
