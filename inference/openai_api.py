"""The OpenAI-compatible endpoints as SGLang serves them: GET /v1/models, POST /v1/completions and
POST /v1/chat/completions (field names, defaults and answer shapes as SGLang's
entrypoints/openai/protocol.py). They sit on any server that can answer SGLang's native
/generate for one prompt of token ids: `add_openai_routes(app, backend)` with a backend giving
the tokenizer (its chat template renders the messages), the model id and `generate`.

This is what an ecosystem client speaks (litellm, the openai package, mini-swe-agent, the PRM
judge): the token-exact RL path stays /generate. Logprobs are the sampled tokens' own; the
top-k alternatives (`top_logprobs`) come back empty, as /generate's output_top_logprobs do here.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Literal, cast

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from inference.sampling import SamplingParams

# (input_ids, sampling params, return_logprob) -> a native /generate answer for one prompt
Generate = Callable[[list[int], SamplingParams, bool], Awaitable[dict[str, Any]]]


class OpenAIBackend(BaseModel):
    """What the routes need from the server they sit on."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    model_id: str
    tokenizer: Any
    generate: Any  # Generate
    context_len: int | None = None


class _Req(BaseModel):
    # clients send fields SGLang ignores (user, metadata, ...): accept and ignore them
    model_config = ConfigDict(extra="ignore")

    model: str = "default"
    max_tokens: int | None = Field(None, ge=0)
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    n: int = Field(1, ge=1, le=16)
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    seed: int | None = None
    stream: bool = False
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    skip_special_tokens: bool = True

    def sampling(self, max_tokens: int | None, default_max: int) -> SamplingParams:
        sp: dict[str, Any] = {"max_new_tokens": max_tokens if max_tokens is not None else default_max,
                              "stop": self.stop, "stop_token_ids": self.stop_token_ids,
                              "skip_special_tokens": self.skip_special_tokens,
                              "frequency_penalty": self.frequency_penalty,
                              "presence_penalty": self.presence_penalty, "sampling_seed": self.seed}
        for name in ("temperature", "top_p", "top_k", "min_p"):
            if getattr(self, name) is not None:
                sp[name] = getattr(self, name)
        return SamplingParams.model_validate(sp)


class CompletionReq(_Req):
    prompt: str | list[str] | list[int] | list[list[int]]
    logprobs: int | None = Field(None, ge=0, le=20)
    echo: bool = False


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: str | list[dict[str, Any]] | None = None

    def text(self) -> str:
        """Content parts ([{"type": "text", "text": ...}]) joined; only text is understood."""
        if self.content is None or isinstance(self.content, str):
            return self.content or ""
        parts = []
        for p in self.content:
            if p.get("type") != "text":
                raise ValueError(f"content part type {p.get('type')!r}: only text is served")
            parts.append(str(p.get("text", "")))
        return "".join(parts)


class ChatReq(_Req):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=0)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)
    chat_template_kwargs: dict[str, Any] | None = None


class OpenAIError(Exception):
    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.message, self.status = message, status


def _error(e: OpenAIError) -> JSONResponse:
    # SGLang's ErrorResponse for the OpenAI routes
    kind = "BadRequestError" if e.status == 400 else "InternalServerError"
    return JSONResponse({"object": "error", "message": e.message, "type": kind, "param": None,
                         "code": e.status}, status_code=e.status)


def _parse(model: type[BaseModel], body: Any) -> Any:
    if not isinstance(body, dict):
        raise OpenAIError("request body must be a JSON object")
    try:
        return model.model_validate(body)
    except ValidationError as e:
        raise OpenAIError("; ".join(f"{'.'.join(map(str, x['loc'])) or 'body'}: {x['msg']}"
                                    for x in e.errors())) from None


def _finish(meta: dict[str, Any]) -> tuple[str, Any]:
    fr = meta.get("finish_reason") or {}
    kind = fr.get("type", "stop") if isinstance(fr, dict) else str(fr)
    if kind == "abort":
        raise OpenAIError(f"generation aborted: {fr.get('message', '')}", 503)
    return ("length" if kind == "length" else "stop"), (fr.get("matched") if isinstance(fr, dict) else None)


def _usage(prompt: int, completion: int) -> dict[str, int]:
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def add_openai_routes(app: FastAPI, get_backend: Callable[[], OpenAIBackend]) -> None:
    """Mount /v1/models, /v1/completions, /v1/chat/completions (behind the app's API key).
    `get_backend` is called per request: the server's model may load after the app is built."""

    def check_len(backend: OpenAIBackend, ids: list[int], where: str) -> None:
        if not ids:
            raise OpenAIError(f"{where}: the input is empty")
        if backend.context_len is not None and len(ids) >= backend.context_len:
            raise OpenAIError(f"The input ({len(ids)} tokens) is longer than the model's context "
                              f"length ({backend.context_len} tokens).")

    async def run(backend: OpenAIBackend, ids: list[int], sp: SamplingParams, n: int,
                  logprob: bool) -> list[dict[str, Any]]:
        try:
            return list(await asyncio.gather(*[backend.generate(ids, sp, logprob) for _ in range(n)]))
        except OpenAIError:
            raise
        except Exception as e:  # the native layer's own 400s (ApiError) carry a message
            raise OpenAIError(getattr(e, "message", None) or f"{type(e).__name__}: {e}") from None

    async def body_of(request: Request) -> Any:
        try:
            return json.loads(await request.body() or b"{}")
        except ValueError as e:
            raise OpenAIError(f"request body is not valid JSON: {e}") from None

    @app.get("/v1/models")
    async def models() -> Any:
        backend = get_backend()
        return {"object": "list", "data": [{
            "id": backend.model_id, "object": "model", "created": int(time.time()),
            "owned_by": "sglang", "root": backend.model_id, "max_model_len": backend.context_len}]}

    @app.post("/v1/completions")
    async def completions(request: Request) -> Any:
        backend = get_backend()
        tok = backend.tokenizer
        try:
            req: CompletionReq = _parse(CompletionReq, await body_of(request))
            p = req.prompt
            prompts: list[list[int]]
            if isinstance(p, str):
                prompts = [list(tok(p, add_special_tokens=False)["input_ids"])]
            elif p and all(isinstance(x, int) for x in p):
                prompts = [cast("list[int]", list(p))]
            elif p and all(isinstance(x, list) for x in p):
                prompts = [list(cast("list[int]", x)) for x in p]
            else:
                prompts = [list(tok(str(x), add_special_tokens=False)["input_ids"]) for x in p]
            try:
                sp = req.sampling(req.max_tokens, 16)
            except ValidationError as e:
                raise OpenAIError(str(e)) from None
            choices: list[dict[str, Any]] = []
            n_prompt = n_out = 0
            for i, ids in enumerate(prompts):
                check_len(backend, ids, f"prompt[{i}]" if len(prompts) > 1 else "prompt")
                answers = await run(backend, ids, sp, req.n, req.logprobs is not None)
                n_prompt += len(ids)
                for a in answers:
                    reason, matched = _finish(a["meta_info"])
                    out_ids = list(a["output_ids"])
                    n_out += len(out_ids)
                    text = (tok.decode(ids) if req.echo else "") + a["text"]
                    lp = None
                    if req.logprobs is not None:
                        toks = [str(tok.decode([t])) for t in out_ids]
                        offsets, pos = [], 0
                        for t in toks:
                            offsets.append(pos)
                            pos += len(t)
                        lp = {"tokens": toks,
                              "token_logprobs": [x[0] for x in a["meta_info"].get("output_token_logprobs", [])],
                              "top_logprobs": [{} for _ in toks], "text_offset": offsets}
                    choices.append({"index": len(choices), "text": text, "logprobs": lp,
                                    "finish_reason": reason, "matched_stop": matched})
        except OpenAIError as e:
            return _error(e)
        return {"id": uuid.uuid4().hex, "object": "text_completion", "created": int(time.time()),
                "model": req.model, "choices": choices, "usage": _usage(n_prompt, n_out)}

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Any:
        backend = get_backend()
        tok = backend.tokenizer
        try:
            req: ChatReq = _parse(ChatReq, await body_of(request))
            try:
                msgs = [{"role": m.role if m.role != "developer" else "system", "content": m.text()}
                        for m in req.messages]
            except ValueError as e:
                raise OpenAIError(f"messages: {e}") from None
            add_gen = req.messages[-1].role != "assistant"  # a trailing assistant turn is continued
            try:
                text = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=add_gen,
                                               **(req.chat_template_kwargs or {}))
            except Exception as e:
                raise OpenAIError(f"messages: the chat template cannot render them: {e}") from None
            ids = list(tok(text, add_special_tokens=False)["input_ids"])
            check_len(backend, ids, "messages")
            mx = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
            default_max = (backend.context_len - len(ids)) if backend.context_len else 4096
            try:
                sp = req.sampling(mx, default_max)
            except ValidationError as e:
                raise OpenAIError(str(e)) from None
            answers = await run(backend, ids, sp, req.n, req.logprobs)
            choices = []
            n_out = 0
            for i, a in enumerate(answers):
                reason, matched = _finish(a["meta_info"])
                out_ids = list(a["output_ids"])
                n_out += len(out_ids)
                lp = None
                if req.logprobs:
                    lp = {"content": [
                        {"token": str(tok.decode([t])), "logprob": x[0], "bytes": list(str(tok.decode([t])).encode()),
                         "top_logprobs": []}
                        for t, x in zip(out_ids, a["meta_info"].get("output_token_logprobs", []), strict=False)]}
                choices.append({"index": i, "message": {"role": "assistant", "content": a["text"],
                                                        "reasoning_content": None, "tool_calls": None},
                                "logprobs": lp, "finish_reason": reason, "matched_stop": matched})
        except OpenAIError as e:
            return _error(e)
        rid, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
        usage = _usage(len(ids), n_out)
        if not req.stream:
            return {"id": rid, "object": "chat.completion", "created": created, "model": req.model,
                    "choices": choices, "usage": usage}

        async def events() -> AsyncIterator[bytes]:
            # the whole answer in one delta per choice, then the finish chunk (usage on the last)
            for c in choices:
                for delta, fin in (({"role": "assistant", "content": c["message"]["content"]}, None),
                                   ({}, c["finish_reason"])):
                    chunk = {"id": rid, "object": "chat.completion.chunk", "created": created,
                             "model": req.model, "choices": [{"index": c["index"], "delta": delta,
                                                              "logprobs": None, "finish_reason": fin}]}
                    yield b"data: " + json.dumps(chunk).encode() + b"\n\n"
            last = {"id": rid, "object": "chat.completion.chunk", "created": created, "model": req.model,
                    "choices": [], "usage": usage}
            yield b"data: " + json.dumps(last).encode() + b"\n\n"
            yield b"data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")
