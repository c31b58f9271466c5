"""/generate against the real CPU server subprocess, through SGLangClient."""

from __future__ import annotations

import asyncio

import httpx
import pytest
import torch

from inference.client import InferenceError, SGLangClient
from inference.logprobs import token_logprobs

PROMPT = [1, 846, 1045, 97, 300, 12, 2000, 7]


@pytest.fixture(scope="module")
def hf_model(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(1)
    return AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()


def reference_logprobs(model, prompt: list[int], output: list[int], temperature: float) -> torch.Tensor:
    with torch.no_grad():
        logits = model(torch.tensor([prompt + output])).logits[0, len(prompt) - 1:-1]
    return token_logprobs(logits, torch.tensor(output), temperature)


@pytest.mark.parametrize("temperature", [0.0, 1.0, 0.7])
async def test_logprobs_equal_a_transformers_forward(client, hf_model, temperature):
    res = await client.generate(PROMPT, {"max_new_tokens": 24, "temperature": temperature, "ignore_eos": True})
    assert len(res.output_ids) == len(res.output_logprobs) == res.completion_tokens == 24
    assert res.prompt_tokens == len(PROMPT) and res.weight_version == "0"
    ref = reference_logprobs(hf_model, PROMPT, res.output_ids, temperature)
    assert torch.allclose(torch.tensor(res.output_logprobs), ref, atol=1e-4), (res.output_logprobs, ref)
    if temperature == 0.0:  # greedy picks the argmax of every step
        with torch.no_grad():
            logits = hf_model(torch.tensor([PROMPT + res.output_ids])).logits[0, len(PROMPT) - 1:-1]
        assert logits.argmax(-1).tolist() == res.output_ids


async def test_sampled_logprobs_are_of_the_temperature_scaled_distribution(client, hf_model):
    res = await client.generate(PROMPT, {"max_new_tokens": 16, "temperature": 0.5, "ignore_eos": True})
    scaled = reference_logprobs(hf_model, PROMPT, res.output_ids, 0.5)
    raw = reference_logprobs(hf_model, PROMPT, res.output_ids, 1.0)
    got = torch.tensor(res.output_logprobs)
    assert torch.allclose(got, scaled, atol=1e-4)
    assert not torch.allclose(got, raw, atol=1e-2)


async def test_greedy_is_deterministic_and_batched_equals_alone(client):
    params = {"max_new_tokens": 20, "temperature": 0, "ignore_eos": True}
    alone = await client.generate(PROMPT, params)
    again = await client.generate(PROMPT, params)
    others = [client.generate(PROMPT[:3] + [i + 10] * (i + 1), {**params, "temperature": 1.0}) for i in range(5)]
    together, *_ = await asyncio.gather(client.generate(PROMPT, params), *others)
    assert alone.output_ids == again.output_ids == together.output_ids
    assert torch.allclose(torch.tensor(alone.output_logprobs), torch.tensor(together.output_logprobs), atol=1e-4)


async def test_max_new_tokens_stop_token_ids_and_stop_strings(client):
    base = {"temperature": 0, "ignore_eos": True}
    res = await client.generate(PROMPT, {**base, "max_new_tokens": 7})
    assert res.finish_reason == {"type": "length", "length": 7} and len(res.output_ids) == 7
    greedy = (await client.generate(PROMPT, {**base, "max_new_tokens": 30})).output_ids

    stop_tok = greedy[4]
    first = greedy.index(stop_tok)
    res = await client.generate(PROMPT, {**base, "max_new_tokens": 30, "stop_token_ids": [stop_tok]})
    assert res.finish_reason == {"type": "stop", "matched": stop_tok}
    assert res.output_ids == greedy[:first + 1]

    full = await client.generate(PROMPT, {**base, "max_new_tokens": 30})
    text = full.text
    stop = text[len(text) // 2: len(text) // 2 + 3]
    assert stop.strip(), text
    res = await client.generate(PROMPT, {**base, "max_new_tokens": 30, "stop": [stop, "never-seen-xyz"]})
    assert res.finish_reason == {"type": "stop", "matched": stop}
    assert stop not in res.text and text.startswith(res.text)
    assert len(res.output_ids) < 30 and res.output_ids == greedy[:len(res.output_ids)]
    res2 = await client.generate(PROMPT, {**base, "max_new_tokens": 30, "stop": stop, "no_stop_trim": True})
    assert res2.text.endswith(stop) or stop in res2.text


async def test_eight_concurrent_requests_are_batched(client):
    before = (await client.get_server_info())["internal_states"][0]
    results = await asyncio.gather(*[
        client.generate([*PROMPT[:4], 100 + i], {"max_new_tokens": 32, "temperature": 1.0, "ignore_eos": True})
        for i in range(8)])
    after = (await client.get_server_info())["internal_states"][0]
    assert all(len(r.output_ids) == 32 and r.finish_reason["type"] == "length" for r in results)
    assert after["max_decode_batch"] >= 6, after  # they were decoded together, not one by one
    steps = after["decode_steps"] - before["decode_steps"]
    assert steps < 8 * 31 / 2, f"{steps} decode steps for 8x32 tokens: requests serialised"


async def test_text_input_and_batch_input(cpu_server):
    headers = {"Authorization": f"Bearer {cpu_server.api_key}"}
    async with httpx.AsyncClient(base_url=cpu_server.url, headers=headers, timeout=60) as http:
        r = await http.post("/generate", json={"text": "def foo():", "sampling_params": {"max_new_tokens": 3,
                                                                                          "temperature": 0}})
        assert r.status_code == 200
        body = r.json()
        assert set(body) >= {"text", "output_ids", "meta_info"}
        assert body["meta_info"]["finish_reason"]["type"] == "length"
        assert "output_token_logprobs" not in body["meta_info"]
        r = await http.post("/generate", json={"input_ids": [[1, 2, 3], [4, 5]], "return_logprob": True,
                                               "sampling_params": {"max_new_tokens": 2, "temperature": 0}})
        assert r.status_code == 200 and isinstance(r.json(), list) and len(r.json()) == 2
        triple = r.json()[1]["meta_info"]["output_token_logprobs"][0]
        assert isinstance(triple[0], float) and isinstance(triple[1], int) and triple[2] is None


@pytest.mark.parametrize(("body", "field"), [
    ({"input_ids": [1, 2], "sampling_params": {"temperature": -1}}, "temperature"),
    ({"input_ids": [1, 2], "sampling_params": {"top_p": 0}}, "top_p"),
    ({"input_ids": [1, 2], "sampling_params": {"top_k": 0}}, "top_k"),
    ({"input_ids": [1, 2], "sampling_params": {"max_new_tokens": -3}}, "max_new_tokens"),
    ({"input_ids": [1, 2], "sampling_params": {"not_a_param": 1}}, "not_a_param"),
    ({"input_ids": [1, 2], "sampling_params": {"temperature": "hot"}}, "temperature"),
    ({"input_ids": [1, 99999]}, "input_ids"),
    ({"input_ids": []}, "input_ids"),
    ({"sampling_params": {}}, "input_ids"),
    ({"input_ids": "abc"}, "input_ids"),
])
async def test_malformed_requests_get_400_in_sglang_shape(cpu_server, body, field):
    headers = {"Authorization": f"Bearer {cpu_server.api_key}"}
    async with httpx.AsyncClient(base_url=cpu_server.url, headers=headers, timeout=30) as http:
        r = await http.post("/generate", json=body)
    assert r.status_code == 400, r.text
    msg = r.json()["error"]["message"]
    assert field in msg, msg


async def test_bad_json_and_bad_update_bodies_get_400(cpu_server):
    headers = {"Authorization": f"Bearer {cpu_server.api_key}", "Content-Type": "application/json"}
    async with httpx.AsyncClient(base_url=cpu_server.url, headers=headers, timeout=30) as http:
        r = await http.post("/generate", content=b"{not json")
        assert r.status_code == 400 and "JSON" in r.json()["error"]["message"]
        r = await http.post("/update_weights_from_disk", json={})
        assert r.status_code == 400 and "model_path" in r.json()["error"]["message"]
        r = await http.post("/update_weights_from_distributed", json={"names": ["a"], "dtypes": [], "shapes": [[1]]})
        assert r.status_code == 400 and r.json()["success"] is False


async def test_client_raises_server_message_without_retrying(cpu_server):
    async with SGLangClient(cpu_server.url, api_key=cpu_server.api_key, retries=3) as c:
        with pytest.raises(InferenceError) as ei:
            await c.generate([1, 2], {"top_p": 5})
    assert ei.value.status == 400 and "top_p" in ei.value.message


async def test_info_endpoints(client, cpu_server, tiny_model_dir):
    info = await client.get_model_info()
    assert info["is_generation"] is True and info["weight_version"] == await client.get_weight_version()
    assert await client.health() and await client.health_generate()
    assert await client.flush_cache() is True
    w = await client.get_weights_by_name("model.norm.weight", truncate_size=5)
    assert w == [1.0] * 5
    with pytest.raises(InferenceError) as ei:
        await client.get_weights_by_name("no.such.weight")
    assert ei.value.status == 400 and "no.such.weight" in ei.value.message


async def test_a_caller_that_hangs_up_frees_its_slot(cpu_server, client):
    headers = {"Authorization": f"Bearer {cpu_server.api_key}"}
    async with httpx.AsyncClient(base_url=cpu_server.url, headers=headers, timeout=1.5) as http:
        with pytest.raises(httpx.ReadTimeout):
            await http.post("/generate", json={"input_ids": PROMPT, "sampling_params": {
                "max_new_tokens": 100_000, "ignore_eos": True}})
    for _ in range(100):
        state = (await client.get_server_info())["internal_states"][0]
        if state["num_running"] == 0:
            break
        await asyncio.sleep(0.1)
    assert state["num_running"] == 0
