"""The sample wire format (this module owns it): a schema-versioned msgpack map of the scalar
fields, followed by the token arrays as raw little-endian bytes — decoding is zero-copy (a list
of ints would be ~15x slower, and bytes inside msgpack cost a copy each way).

Fields: tokens int32 LE · loss_mask uint8 · rollout_logprobs float32 LE (one per token, 0 where
the mask is 0) · token_versions int32 LE (schema 2, optional: the policy version that generated
each token, -1 for tokens the policy did not generate — prompt, observations, template) ·
prompt_len · reward · group_id · sample_index · instance_id · policy_version (the oldest
version of any trained token: the one the staleness bound applies to) · weight_versions (one
per generate call) · status · step_index / steps_total · metrics · sample_id · episode_id ·
masked / mask_reason.

Schema 1 (no token_versions) is still read: such a sample's tokens are all taken to be of its
policy_version.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass, field
from typing import Any

import msgpack
import numpy as np

SCHEMA_VERSION = 2
READABLE = (1, 2)
STATUSES = ("completed", "truncated", "aborted", "failed")

_I32 = np.dtype("<i4")
_U8 = np.dtype("u1")
_F32 = np.dtype("<f4")


class WireError(ValueError):
    """A sample that cannot be encoded or decoded; the message names the field."""


@dataclass
class Sample:
    tokens: np.ndarray
    loss_mask: np.ndarray
    rollout_logprobs: np.ndarray
    prompt_len: int
    reward: float
    group_id: str
    sample_index: int
    instance_id: str
    policy_version: int
    sample_id: str
    episode_id: str = ""
    weight_versions: list[str] = field(default_factory=list)
    status: str = "completed"
    step_index: int = 0
    steps_total: int = 1
    masked: bool = False
    mask_reason: str = ""
    metrics: dict[str, float] = field(default_factory=dict)
    token_versions: np.ndarray | None = None  # per token; None: all of policy_version (schema 1)

    def __post_init__(self) -> None:
        self.tokens = np.ascontiguousarray(self.tokens, dtype=_I32)
        self.loss_mask = np.ascontiguousarray(self.loss_mask, dtype=_U8)
        self.rollout_logprobs = np.ascontiguousarray(self.rollout_logprobs, dtype=_F32)
        if self.token_versions is not None:
            self.token_versions = np.ascontiguousarray(self.token_versions, dtype=_I32)
        if not self.episode_id:
            self.episode_id = f"{self.group_id}:{self.sample_index}"
        validate(self)

    @property
    def oldest_version(self) -> int:
        """The version of the oldest trained token (loss_mask 1), never newer than
        policy_version: the one the staleness bound applies to."""
        tv = self.token_versions
        if tv is None:
            return self.policy_version
        mine = tv[(self.loss_mask == 1) & (tv >= 0)]
        return min(self.policy_version, int(mine.min())) if mine.size else self.policy_version

    @property
    def generated_tokens(self) -> int:
        """Tokens of this sample the policy generated (schema 1: its trained tokens)."""
        if self.token_versions is None:
            return int(self.loss_mask.sum())
        return int((self.token_versions >= 0).sum())



def validate(s: Sample) -> None:
    n = s.tokens.shape[0]
    if s.tokens.ndim != 1:
        raise WireError("tokens: must be 1-D")
    if s.loss_mask.shape != (n,):
        raise WireError(f"loss_mask: length {s.loss_mask.shape[0]} != tokens length {n}")
    if s.rollout_logprobs.shape != (n,):
        raise WireError(f"rollout_logprobs: length {s.rollout_logprobs.shape[0]} != tokens length {n}")
    if not 0 <= s.prompt_len <= n:
        raise WireError(f"prompt_len: {s.prompt_len} outside [0, {n}]")
    if s.status not in STATUSES:
        raise WireError(f"status: {s.status!r} not one of {STATUSES}")
    if not s.sample_id:
        raise WireError("sample_id: empty")
    if not 0 <= s.step_index < max(s.steps_total, 1):
        raise WireError(f"step_index: {s.step_index} outside [0, steps_total={s.steps_total})")
    if s.token_versions is not None and s.token_versions.shape != (n,):
        raise WireError(f"token_versions: length {s.token_versions.shape[0]} != tokens length {n}")


MAGIC = b"SWS\x01"
_HEAD = struct.Struct("<4sI")  # magic, msgpack header length


def encode(s: Sample) -> bytes:
    """MAGIC | u32 header length | msgpack header map | tokens | loss_mask | rollout_logprobs
    [| token_versions, when the header's "tv" is true].

    The arrays follow the map as raw little-endian bytes so that decoding is zero-copy
    (numpy views of the stream entry) and encoding copies each array once."""
    header = msgpack.packb(
        {
            "v": SCHEMA_VERSION,
            "n": int(s.tokens.shape[0]),
            "prompt_len": int(s.prompt_len),
            "reward": float(s.reward),
            "group_id": s.group_id,
            "sample_index": int(s.sample_index),
            "instance_id": s.instance_id,
            "policy_version": int(s.policy_version),
            "weight_versions": [str(v) for v in s.weight_versions],
            "status": s.status,
            "step_index": int(s.step_index),
            "steps_total": int(s.steps_total),
            "masked": bool(s.masked),
            "mask_reason": s.mask_reason,
            "metrics": {str(k): float(v) for k, v in s.metrics.items()},
            "sample_id": s.sample_id,
            "episode_id": s.episode_id,
            "tv": s.token_versions is not None,
        },
        use_bin_type=True,
    )
    tail = (s.token_versions.data,) if s.token_versions is not None else ()
    return b"".join((_HEAD.pack(MAGIC, len(header)), header, s.tokens.data,
                     s.loss_mask.data, s.rollout_logprobs.data, *tail))


_TYPES: dict[str, type | tuple[type, ...]] = {
    "n": int, "prompt_len": int, "reward": (float, int), "group_id": str, "sample_index": int,
    "instance_id": str, "policy_version": int, "weight_versions": list, "status": str,
    "step_index": int, "steps_total": int, "masked": bool, "mask_reason": str, "metrics": dict,
    "sample_id": str, "episode_id": str,
}
_BYTES_PER_TOKEN = _I32.itemsize + _U8.itemsize + _F32.itemsize


def _check_values(m: dict[str, Any], tokens: np.ndarray, loss_mask: np.ndarray, logprobs: np.ndarray) -> None:
    """What a writer other than swarl's encoder could get wrong and the learner would train on
    (or crash on): checked where entries are read, so a bad one is dead-lettered."""
    if tokens.size and int(tokens.min()) < 0:
        raise WireError(f"tokens: negative token id {int(tokens.min())}")
    if loss_mask.size and int(loss_mask.max()) > 1:
        raise WireError(f"loss_mask: value {int(loss_mask.max())} (expected 0 or 1)")
    if not np.isfinite(logprobs).all():
        raise WireError("rollout_logprobs: not finite (nan or inf)")
    if not math.isfinite(m["reward"]):
        raise WireError(f"reward: {m['reward']} is not finite")
    for k, v in m["metrics"].items():
        if not isinstance(k, str) or isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
            raise WireError(f"metrics.{k}: expected a finite number, got {v!r}"[:200])
    if not all(isinstance(v, str) for v in m["weight_versions"]):
        raise WireError("weight_versions: expected a list of strings")


def decode(data: bytes) -> Sample:
    if len(data) < _HEAD.size:
        raise WireError(f"frame: {len(data)} bytes is shorter than the {_HEAD.size}-byte header")
    magic, hlen = _HEAD.unpack_from(data)
    if magic != MAGIC:
        raise WireError(f"frame: bad magic {magic!r} (expected {MAGIC!r}: not a swarl sample)")
    if _HEAD.size + hlen > len(data):
        raise WireError(f"frame: header length {hlen} runs past the end ({len(data)} bytes)")
    try:
        m: Any = msgpack.unpackb(memoryview(data)[_HEAD.size : _HEAD.size + hlen], raw=False)
    except Exception as e:
        raise WireError(f"header: not a msgpack map: {e}") from None
    if not isinstance(m, dict):
        raise WireError("header: not a msgpack map")
    v = m.get("v")
    if v not in READABLE or isinstance(v, bool):
        raise WireError(f"v: schema version {v!r} not supported (expected one of {READABLE})")
    has_tv = m.get("tv", False) if v >= 2 else False
    if not isinstance(has_tv, bool):
        raise WireError(f"tv: expected bool, got {type(has_tv).__name__}")
    for name, typ in _TYPES.items():
        if name not in m:
            raise WireError(f"{name}: missing")
        if not isinstance(m[name], typ) or (typ is int and isinstance(m[name], bool)):
            raise WireError(f"{name}: expected {getattr(typ, '__name__', typ)}, got {type(m[name]).__name__}")
    n, off = m["n"], _HEAD.size + hlen
    per = _BYTES_PER_TOKEN + (_I32.itemsize if has_tv else 0)
    if n < 0 or len(data) - off != n * per:
        raise WireError(f"tokens: {len(data) - off} array bytes do not hold n={n} tokens "
                        f"(need {n * per}: int32 tokens, uint8 loss_mask, float32 rollout_logprobs"
                        f"{', int32 token_versions' if has_tv else ''})")
    # frombuffer: zero-copy, read-only views of the entry (training copies into tensors).
    tokens = np.frombuffer(data, _I32, n, off)
    loss_mask = np.frombuffer(data, _U8, n, off + 4 * n)
    logprobs = np.frombuffer(data, _F32, n, off + 5 * n)
    token_versions = np.frombuffer(data, _I32, n, off + 9 * n) if has_tv else None
    _check_values(m, tokens, loss_mask, logprobs)
    if token_versions is not None and token_versions.size and int(token_versions.min()) < -1:
        raise WireError(f"token_versions: {int(token_versions.min())} (expected -1 or a version >= 0)")
    return Sample(
        tokens=tokens, loss_mask=loss_mask, rollout_logprobs=logprobs,
        prompt_len=m["prompt_len"], reward=float(m["reward"]), group_id=m["group_id"],
        sample_index=m["sample_index"], instance_id=m["instance_id"],
        policy_version=m["policy_version"], weight_versions=list(m["weight_versions"]),
        status=m["status"], step_index=m["step_index"], steps_total=m["steps_total"],
        masked=m["masked"], mask_reason=m["mask_reason"], metrics={k: float(v) for k, v in m["metrics"].items()},
        sample_id=m["sample_id"], episode_id=m["episode_id"], token_versions=token_versions,
    )
