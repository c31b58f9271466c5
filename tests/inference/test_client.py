"""SGLangClient without a server behind it, and SGLang's response variants."""

from __future__ import annotations

import time

import pytest

from common.services import free_port
from inference.client import GenerateResult, InferenceError, SGLangClient


async def test_connection_errors_are_retried_with_backoff_then_raised():
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens
    async with SGLangClient(url, retries=2, backoff_s=0.2, timeout_s=5) as c:
        t0 = time.monotonic()
        with pytest.raises(InferenceError) as ei:
            await c.generate([1, 2], {"max_new_tokens": 1})
        took = time.monotonic() - t0
        assert ei.value.status is None and "ConnectError" in ei.value.message
        assert 0.5 <= took < 5  # two backoffs (0.2 s, 0.4 s), bounded
        assert await c.health() is False


def test_result_takes_ids_from_output_token_logprobs_when_output_ids_absent():
    raw = {"text": "ab", "meta_info": {
        "id": "x", "finish_reason": {"type": "stop", "matched": 2}, "prompt_tokens": 3,
        "completion_tokens": 2, "weight_version": "7", "e2e_latency": 0.5,
        "output_token_logprobs": [[-0.5, 11, None], [-1.25, 2, None]]}}
    r = GenerateResult.from_response(raw)
    assert r.output_ids == [11, 2] and r.output_logprobs == [-0.5, -1.25]
    assert r.weight_version == "7" and r.finish_reason == {"type": "stop", "matched": 2}
    assert (r.prompt_tokens, r.completion_tokens, r.e2e_latency, r.text) == (3, 2, 0.5, "ab")
    r2 = GenerateResult.from_response({**raw, "output_ids": [11, 2]})
    assert r2.output_ids == [11, 2]
    r3 = GenerateResult.from_response({"text": "", "output_ids": [5], "meta_info": {"finish_reason": None}})
    assert r3.output_ids == [5] and r3.output_logprobs == [] and r3.finish_reason == {}
