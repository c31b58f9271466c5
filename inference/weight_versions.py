"""Which weight version produced which output tokens of a request, as SGLang 0.5.23 reports it
(`meta_info.weight_versions`): spans `{"version", "start", "end"}` over the output tokens.

The server records an event on every live request (running or queued, with at least one output
token) each time its version changes: the old version and how many tokens the request had then.
When the request finishes (or is aborted), the events and the version current then become spans;
the answer's `weight_version` is the last span's. Tokens [start, end) of a span were sampled under
its version: an update between two buckets changes the label only with the bucket that carries the
version, so a span is exact only when no token was sampled on a half-loaded model (the weight-sync
coordinator pauses generation around such loads for that reason).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class VersionEvent:
    old_version: str
    num_output_tokens: int


@dataclass
class Span:
    version: str
    start: int
    end: int


def spans(events: list[VersionEvent], current: str, num_output_tokens: int) -> list[Span]:
    """The spans of a request with `num_output_tokens` tokens: one per run of tokens of one
    version, the last one at `current`; at least one span (empty when no token was made)."""
    out: list[Span] = []
    for version, end in [*((e.old_version, e.num_output_tokens) for e in events),
                         (current, num_output_tokens)]:
        end = min(end, num_output_tokens)
        if out and end <= out[-1].end:
            continue  # no token under this version
        if out and out[-1].version == version:
            out[-1].end = end
            continue
        out.append(Span(version, out[-1].end if out else 0, end))
    return out


def to_meta(meta: dict[str, Any], found: list[Span], num_output_tokens: int) -> None:
    """`weight_versions` and `weight_version` of an answer's meta_info, as SGLang's tokenizer
    manager writes them (a span that starts past the tokens returned is left out)."""
    visible = [s for s in found if s.start < num_output_tokens or s.start == 0]
    meta["weight_versions"] = [{"version": s.version, "start": s.start,
                                "end": min(s.end, num_output_tokens)} for s in visible]
    meta["weight_version"] = visible[-1].version


def per_token(meta_spans: Any, n: int) -> list[str] | None:
    """One version per output token from an answer's `weight_versions` (None when the server
    sent none, or spans that do not cover the n tokens exactly once, in order)."""
    if not isinstance(meta_spans, list) or not meta_spans:
        return None
    out: list[str] = []
    for s in meta_spans:
        if not isinstance(s, dict) or {"version", "start", "end"} - set(s):
            return None
        start, end = int(s["start"]), int(s["end"])
        if start != len(out) or end < start:
            return None
        out += [str(s["version"])] * (end - start)
    return out if len(out) == n else None
