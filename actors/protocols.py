"""The seams the agent loop depends on: a policy that generates tokens, an environment that runs
commands and grades patches, and a sink for samples. Concrete backends (SGLang client, envd
pool, Redis replay stream) live in actors/backends.py; tests may pass any object that fits."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from inference.generation import Generation

if TYPE_CHECKING:
    from broker.wire import Sample

__all__ = ["Env", "EvalOutcome", "ExecOutput", "Generation", "InfraError", "Policy", "SampleSink"]


class InfraError(Exception):
    """Infrastructure failed (envd, pool, inference server, image, eval timeout, weight version
    mismatch). Never a -1 reward: the job is retried, or its samples are masked."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail


class Policy(Protocol):
    async def generate(self, input_ids: list[int], sampling: dict[str, Any],
                       rid: str | None = None) -> Generation: ...


@dataclass
class ExecOutput:
    returncode: int
    output: str
    timed_out: bool = False
    duration_s: float = 0.0


@dataclass
class EvalOutcome:
    resolved: bool
    error: str = ""
    timed_out: bool = False
    output: str = ""
    details: dict[str, Any] = field(default_factory=dict)


class Env(Protocol):
    async def exec(self, command: str, timeout_s: float) -> ExecOutput: ...
    async def diff(self) -> str: ...
    async def evaluate(self, patch: str, timeout_s: float) -> EvalOutcome: ...


class SampleSink(Protocol):
    async def add(self, samples: list[Sample]) -> list[str]: ...
