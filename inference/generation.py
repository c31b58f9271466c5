"""One generation as a policy answers it: the exact token ids, their logprobs, why it stopped,
and the weight version that produced it (per token where the server says)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Generation:
    ids: list[int]                 # exactly what the server generated (stop token included)
    logprobs: list[float]          # one per id
    finish: str                    # stop | length | abort
    weight_version: str
    text: str | None = None        # for parsing only; never re-tokenised
    token_versions: list[str] | None = None  # one per id (meta_info.weight_versions); None: not given
