"""SGLang's /generate sampling parameters (validated like SGLang's SamplingParams.verify) and the
batched sampler of the CPU server."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from inference.logprobs import SAMPLING_EPS, logprob_temperature

if TYPE_CHECKING:
    import torch

# Accepted for compatibility with SGLang clients, but only their neutral value is supported here.
_NEUTRAL = {
    "frequency_penalty": 0.0, "presence_penalty": 0.0, "repetition_penalty": 1.0, "n": 1,
    "regex": None, "json_schema": None, "ebnf": None, "structural_tag": None, "logit_bias": None,
    "stop_regex": None,
}


class SamplingParams(BaseModel):
    """The subset of SGLang's sampling params swarl serves (defaults as SGLang's)."""

    model_config = ConfigDict(extra="forbid")

    max_new_tokens: int | None = Field(128)
    min_new_tokens: int = Field(0)
    temperature: float = Field(1.0)
    top_p: float = Field(1.0)
    top_k: int = Field(-1)
    min_p: float = Field(0.0)
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    no_stop_trim: bool = False
    sampling_seed: int | None = None
    custom_params: dict[str, Any] | None = None
    stream_interval: int | None = None
    # neutral-only fields (see _NEUTRAL)
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0
    n: int = 1
    regex: str | None = None
    json_schema: str | None = None
    ebnf: str | None = None
    structural_tag: str | None = None
    logit_bias: dict[str, float] | None = None
    stop_regex: str | list[str] | None = None

    @field_validator("temperature")
    @classmethod
    def _temp(cls, v: float) -> float:
        if v < 0.0:
            raise ValueError(f"temperature must be non-negative, got {v}.")
        return v

    @field_validator("top_p")
    @classmethod
    def _top_p(cls, v: float) -> float:
        if not 0.0 < v <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {v}.")
        return v

    @field_validator("min_p")
    @classmethod
    def _min_p(cls, v: float) -> float:
        if not 0.0 <= v <= 1.0:
            raise ValueError(f"min_p must be in [0, 1], got {v}.")
        return v

    @field_validator("top_k")
    @classmethod
    def _top_k(cls, v: int) -> int:
        if v < 1 and v != -1:
            raise ValueError(f"top_k must be -1 (disable), or at least 1, got {v}.")
        return v

    @field_validator("max_new_tokens")
    @classmethod
    def _max_new(cls, v: int | None) -> int | None:
        if v is not None and v < 0:
            raise ValueError(f"max_new_tokens must be at least 0, got {v}.")
        return v

    @field_validator("min_new_tokens")
    @classmethod
    def _min_new(cls, v: int) -> int:
        if v < 0:
            raise ValueError(f"min_new_tokens must be at least 0, got {v}.")
        return v

    @model_validator(mode="after")
    def _neutral(self) -> SamplingParams:
        for name, neutral in _NEUTRAL.items():
            if getattr(self, name) != neutral:
                raise ValueError(f"{name}={getattr(self, name)!r} is not supported by swarl's CPU server")
        if self.max_new_tokens is not None and self.min_new_tokens > self.max_new_tokens:
            raise ValueError(f"min_new_tokens ({self.min_new_tokens}) must be <= max_new_tokens "
                             f"({self.max_new_tokens}).")
        return self

    @property
    def greedy(self) -> bool:
        return self.temperature < SAMPLING_EPS or self.top_k == 1

    @property
    def stop_strings(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else [s for s in self.stop if s]


def sample(
    logits: torch.Tensor, params: list[SamplingParams], generator: torch.Generator,
    positions: list[int] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pick one token per row of `logits` [B, V]; return (token ids [B], logprobs [B]).

    Logprobs follow inference.logprobs (SGLang): log_softmax(logits / T) before top-k/top-p/
    min-p filtering; greedy rows use T = 1. A row whose params carry `sampling_seed` draws its
    noise from (seed, position) alone — `positions[i]` is the sequence position of the token
    being sampled — so the same seed over the same prefix makes the same draws whatever else
    is in the batch or which weights are loaded (SGLang's seeded sampling, used for common
    random numbers across evaluations); other rows use `generator`.
    """
    import torch

    logits = logits.float()
    temps = torch.tensor([logprob_temperature(p.temperature) for p in params]).unsqueeze(1)
    logprobs = torch.log_softmax(logits / temps, dim=-1)
    ids = torch.argmax(logits, dim=-1)
    sampled_rows = [i for i, p in enumerate(params) if not p.greedy]
    if sampled_rows:
        rows = torch.tensor(sampled_rows)
        # sampling uses the temperature-scaled distribution (never the 'original' one)
        t = torch.tensor([params[i].temperature for i in sampled_rows]).unsqueeze(1)
        probs = torch.softmax(logits[rows] / t, dim=-1)
        probs = _filter(probs, [params[i] for i in sampled_rows])
        # exponential race: argmax(p / E), E ~ Exp(1), draws from p (cheaper than multinomial)
        noise = torch.empty_like(probs).exponential_(1.0, generator=generator)
        for j, i in enumerate(sampled_rows):
            seed = params[i].sampling_seed
            if seed is not None:
                if positions is None:
                    raise ValueError("sampling_seed needs the positions of the sampled tokens")
                g = torch.Generator().manual_seed(seed_at(seed, positions[i]))
                noise[j].exponential_(1.0, generator=g)
        ids[rows] = (probs / noise).argmax(dim=-1)
    chosen = logprobs.gather(1, ids.unsqueeze(1)).squeeze(1)
    return ids, chosen


_MASK64 = (1 << 64) - 1


def seed_at(seed: int, position: int) -> int:
    """The generator seed of one (sampling_seed, position) draw: splitmix64 of the pair, so
    neighbouring positions and seeds get unrelated streams."""
    x = (seed * 0x9E3779B97F4A7C15 + position + 1) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return (x ^ (x >> 31)) >> 1  # manual_seed takes a non-negative int64


def _filter(probs: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
    """Apply top-k, top-p and min-p per row (as SGLang: sort once, mask, renormalise)."""
    import torch

    v = probs.shape[1]
    top_k = torch.tensor([p.top_k if p.top_k > 0 else v for p in params]).clamp(max=v)
    top_p = torch.tensor([p.top_p for p in params])
    min_p = torch.tensor([p.min_p for p in params])
    if bool((top_k >= v).all() and (top_p >= 1.0).all() and (min_p <= 0.0).all()):
        return probs
    sorted_p, idx = probs.sort(dim=-1, descending=True)
    ranks = torch.arange(v).unsqueeze(0)
    drop = ranks >= top_k.unsqueeze(1)
    cum = sorted_p.cumsum(dim=-1)
    drop |= (cum - sorted_p) > top_p.unsqueeze(1)
    drop |= sorted_p < (sorted_p[:, :1] * min_p.unsqueeze(1))
    drop[:, 0] = False  # the most likely token always survives
    sorted_p = sorted_p.masked_fill(drop, 0.0)
    out = torch.zeros_like(probs).scatter_(1, idx, sorted_p)
    return out / out.sum(dim=-1, keepdim=True)
