"""Bad input against swarl's CPU inference server (its routes read raw JSON, so the bodies come
from hypothesis, not from an OpenAPI schema): any body for any of its POST routes gets an answer
below 500, and every 4xx carries SGLang's {"error": {"message"}} naming what is wrong."""

from __future__ import annotations

import httpx
import pytest
from fuzz_http import FUZZ_EXAMPLES, error_of, settings
from hypothesis import given
from hypothesis import strategies as st

pytestmark = pytest.mark.fuzz

# Route -> its fields (SGLang's names); /init_weights_update_group is left out (it dials the
# address it is given), /pause_generation too (a paused server holds later generations).
ROUTES = {
    "/generate": ["text", "input_ids", "sampling_params", "rid", "return_logprob", "logprob_start_len",
                  "top_logprobs_num", "return_text_in_logprobs", "stream"],
    "/v1/completions": ["model", "prompt", "max_tokens", "temperature", "logprobs", "n", "stream", "stop"],
    "/v1/chat/completions": ["model", "messages", "max_tokens", "temperature", "logprobs", "stream"],
    "/update_weights_from_disk": ["model_path", "load_format", "weight_version", "flush_cache"],
    "/update_weight_version": ["new_version", "abort_all_requests"],
    "/update_weights_from_distributed": ["names", "dtypes", "shapes", "group_name", "weight_version"],
    "/destroy_weights_update_group": ["group_name"],
    "/abort_request": ["rid", "abort_all"],
}
SMALL_INT = st.integers(-3, 40)
VALUE = st.recursive(st.none() | st.booleans() | SMALL_INT | st.integers() | st.floats() | st.text(max_size=12),
                     lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
                         st.sampled_from(["max_new_tokens", "temperature", "top_p", "top_k", "stop", "role",
                                          "content", "n"]) | st.text(max_size=5), inner, max_size=3),
                     max_leaves=10)


def bodies(route: str) -> st.SearchStrategy[bytes]:
    fields = st.dictionaries(st.sampled_from(ROUTES[route]) | st.text(max_size=6), VALUE, max_size=4)
    # generation stays short: tiny prompts, at most a few new tokens
    gen = st.fixed_dictionaries({"input_ids": st.lists(SMALL_INT, max_size=6),
                                 "sampling_params": st.fixed_dictionaries({"max_new_tokens": st.integers(-2, 4)})})
    json_body = (fields | gen) if route == "/generate" else fields
    return json_body.map(lambda d: __import__("json").dumps(d).encode()) | st.binary(max_size=30)


def _bind(check, route: str):
    def one(body: bytes) -> None:
        check(route, body)
    return one


@pytest.mark.timeout(900)
def test_cpu_server_answers_any_body(cpu_server_factory, tiny_model_dir) -> None:
    server = cpu_server_factory.start(tiny_model_dir, api_key="fuzz-key")
    headers = {"Authorization": "Bearer fuzz-key", "Content-Type": "application/json"}
    problems: list[str] = []
    with httpx.Client(base_url=server.url, headers=headers, timeout=60) as http:
        def check(route: str, body: bytes) -> None:
            r = http.post(route, content=body)
            where = f"POST {route} {body[:150]!r}"
            if r.status_code >= 500:
                problems.append(f"{where}: {r.status_code} {r.text[:300]}")
            elif 400 <= r.status_code < 500 and not error_of(r).strip():
                problems.append(f"{where}: {r.status_code} without an error message: {r.text[:200]}")

        for route in ROUTES:
            settings(FUZZ_EXAMPLES * 2)(given(body=bodies(route))(_bind(check, route)))()
        assert http.get("/health").status_code == 200  # still serving
    assert not problems, "\n".join(problems[:20])
