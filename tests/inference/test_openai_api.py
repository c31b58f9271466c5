"""The OpenAI-style /v1 routes of the CPU server (real subprocess), with raw HTTP and with the
real `openai` client; the scripted judge's votes over /v1/chat/completions."""

from __future__ import annotations

import httpx
import pytest
import torch
from transformers import AutoTokenizer

from inference.client import SGLangClient


def _h(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


async def test_v1_routes_answer_in_sglang_shapes(cpu_server, tiny_model_dir):
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    msgs = [{"role": "system", "content": "You judge."}, {"role": "user", "content": "Is ls useful?"}]
    async with httpx.AsyncClient(base_url=cpu_server.url, timeout=120) as c:
        # the key is required, as on every other endpoint
        assert (await c.get("/v1/models")).status_code == 401
        assert (await c.post("/v1/chat/completions", json={"messages": msgs})).status_code == 401
        models = (await c.get("/v1/models", headers=_h(cpu_server.api_key))).json()
        assert models["object"] == "list" and models["data"][0]["id"] == str(tiny_model_dir)

        r = await c.post("/v1/chat/completions", headers=_h(cpu_server.api_key), json={
            "model": "m", "messages": msgs, "max_tokens": 6, "temperature": 0, "logprobs": True,
            "top_logprobs": 2})
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["object"] == "chat.completion" and body["model"] == "m"
        ch = body["choices"][0]
        assert ch["message"]["role"] == "assistant" and ch["finish_reason"] in ("stop", "length")
        # the chat template rendered the messages: prompt tokens as the tokenizer counts them
        ids = tok(tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True),
                  add_special_tokens=False)["input_ids"]
        want = len(ids)
        assert body["usage"]["prompt_tokens"] == want
        n_out = body["usage"]["completion_tokens"]
        assert body["usage"]["total_tokens"] == want + n_out and 0 < n_out <= 6
        content = ch["logprobs"]["content"]
        assert len(content) == n_out and all(x["logprob"] <= 0 and x["top_logprobs"] == [] for x in content)

        # greedy chat == greedy /generate on the templated prompt (the same tokens and logprobs)
        async with SGLangClient(cpu_server.url, api_key=cpu_server.api_key, timeout_s=120) as sg:
            g = await sg.generate(list(ids), {"max_new_tokens": 6, "temperature": 0}, return_logprob=True)
        assert ch["message"]["content"] == g.text
        assert torch.allclose(torch.tensor([x["logprob"] for x in content]),
                              torch.tensor(g.output_logprobs[:len(content)]), atol=1e-5)

        # /v1/completions: a text prompt and a token-id prompt, n choices, logprobs by count
        r = await c.post("/v1/completions", headers=_h(cpu_server.api_key), json={
            "prompt": [5, 6, 7, 8], "max_tokens": 3, "n": 2, "logprobs": 1, "temperature": 1.0})
        body = r.json()
        assert r.status_code == 200 and body["object"] == "text_completion"
        assert [c_["index"] for c_ in body["choices"]] == [0, 1]
        assert body["usage"]["prompt_tokens"] == 4  # the prompt counts once, whatever n
        lp = body["choices"][0]["logprobs"]
        assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["text_offset"])

        # bad input: a clear 400 naming the field, in SGLang's OpenAI error shape
        r = await c.post("/v1/chat/completions", headers=_h(cpu_server.api_key),
                         json={"messages": [{"role": "wizard", "content": "x"}]})
        assert r.status_code == 400 and r.json()["object"] == "error" and "messages.0.role" in r.json()["message"]
        r = await c.post("/v1/chat/completions", headers=_h(cpu_server.api_key),
                         json={"messages": msgs, "temperature": -1})
        assert r.status_code == 400 and "temperature" in r.json()["message"]


async def test_the_openai_client_talks_to_the_cpu_server(cpu_server):
    openai = pytest.importorskip("openai")
    client = openai.AsyncOpenAI(base_url=f"{cpu_server.url}/v1", api_key=cpu_server.api_key, max_retries=0)
    try:
        models = await client.models.list()
        r = await client.chat.completions.create(
            model=models.data[0].id, messages=[{"role": "user", "content": "hello"}], max_tokens=4,
            temperature=0.5, n=2)
        assert len(r.choices) == 2 and r.usage is not None and r.usage.completion_tokens > 0
        chunks = [c async for c in await client.chat.completions.create(
            model="x", messages=[{"role": "user", "content": "hi"}], max_tokens=3, stream=True)]
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert chunks and isinstance(text, str)
        bad = openai.AsyncOpenAI(base_url=f"{cpu_server.url}/v1", api_key="wrong", max_retries=0)
        with pytest.raises(openai.AuthenticationError):
            await bad.models.list()
        await bad.close()
    finally:
        await client.close()


async def test_scripted_judge_answers_known_votes(cpu_server_factory, tiny_model_dir):
    rows = [{"instance_id": "t1", "problem_statement": "The frobnicator drops widgets.",
             "swarl_prm_votes": [["+1", "-1", "bad"], ["error"]]}]
    judge = cpu_server_factory.start_scripted(tiny_model_dir, rows, mode="judge")

    def prompt(step: int) -> list[dict[str, str]]:
        return [{"role": "user", "content": f"Issue: The frobnicator drops widgets.\n(step {step})"}]

    async with httpx.AsyncClient(base_url=judge.url, timeout=30, headers=_h(judge.api_key)) as c:
        texts = []
        for _ in range(3):
            r = await c.post("/v1/chat/completions", json={"messages": prompt(1), "max_tokens": 64})
            assert r.status_code == 200, r.text
            texts.append(r.json()["choices"][0]["message"]["content"])
        assert ["\\boxed{+1}" in texts[0], "\\boxed{-1}" in texts[1], "boxed" in texts[2]] == [True, True, False]
        r = await c.post("/v1/chat/completions", json={"messages": prompt(2)})
        assert r.status_code == 500  # a failing judge
        r = await c.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "other"}]})
        assert "\\boxed{+1}" in r.json()["choices"][0]["message"]["content"]  # the default vote
