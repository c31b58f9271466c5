"""Async client for SGLang's native HTTP API (real SGLang 0.5.x or swarl's CPU server), on
the HTTP kit every swarl client shares (common.http.HttpClient: bounded timeouts, one tenacity
retry policy with exponential backoff).

An HTTP answer is never retried: a 4xx or 5xx raises InferenceError at once with the server's
message. Transport failures are retried per call kind:
- generation, reads and generation control (pause, continue, abort, flush) also when the
  request was sent but no answer came (NO_ANSWER): running one of them twice is harmless;
- weight updates only when the request never reached the server (NOT_SENT). A lost answer to
  update_weights_from_distributed may mean the server is already waiting for the broadcast,
  and sending it again would leave a second receive waiting for tensors the trainer never
  sends; init_weights_update_group again would join twice. The weight-sync coordinator, which
  knows the group and re-reads the server's version, decides what to do instead.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import httpx

from common.http import NO_ANSWER, NOT_SENT, HttpClient
from inference.weight_versions import per_token


class InferenceError(Exception):
    """An inference server call failed; `message` carries the server's own message."""

    def __init__(self, status: int | None, message: str) -> None:
        super().__init__(f"{status}: {message}" if status is not None else message)
        self.status = status
        self.message = message


@dataclass
class GenerateResult:
    output_ids: list[int]
    output_logprobs: list[float]
    text: str
    finish_reason: dict[str, Any]
    weight_version: str
    prompt_tokens: int
    completion_tokens: int
    e2e_latency: float
    raw: dict[str, Any] = field(default_factory=dict)
    # the version of each output token, from meta_info.weight_versions (SGLang 0.5.23's spans);
    # None when the server sends no spans (older builds, the scripted server)
    token_versions: list[str] | None = None

    @classmethod
    def from_response(cls, raw: dict[str, Any]) -> GenerateResult:
        """Accept both SGLang variants: ids in `output_ids`, or only in output_token_logprobs."""
        meta = raw.get("meta_info") or {}
        triples = meta.get("output_token_logprobs") or []
        lp_ids = [int(t[1]) for t in triples]
        ids = raw.get("output_ids")
        ids = [int(x) for x in ids] if ids is not None else lp_ids
        if triples and lp_ids != ids:
            # some builds also put the prompt or spec-decoding drafts in output_ids: trust logprobs
            ids = lp_ids
        logprobs = [float(t[0]) if t[0] is not None else 0.0 for t in triples]
        finish = meta.get("finish_reason")
        if isinstance(finish, str):  # very old builds
            finish = {"type": finish}
        return cls(
            output_ids=ids, output_logprobs=logprobs, text=raw.get("text", "") or "",
            finish_reason=finish or {}, weight_version=str(meta.get("weight_version", "")),
            prompt_tokens=int(meta.get("prompt_tokens", 0) or 0),
            completion_tokens=int(meta.get("completion_tokens", len(ids)) or 0),
            e2e_latency=float(meta.get("e2e_latency", 0.0) or 0.0), raw=raw,
            token_versions=per_token(meta.get("weight_versions"), len(ids)),
        )


def _message(resp: httpx.Response) -> str:
    try:
        body = resp.json()
    except ValueError:
        return resp.text.strip() or resp.reason_phrase
    if isinstance(body, dict):
        err = body.get("error")
        if isinstance(err, dict) and err.get("message"):
            return str(err["message"])
        if isinstance(err, str):
            return err
        for k in ("message", "detail"):
            if body.get(k):
                return str(body[k])
    return str(body)


class SGLangClient:
    """One server. `timeout_s` bounds each call; `retries` transport retries per call (see the
    module docstring for which failures count), with backoff from `backoff_s`."""

    def __init__(self, url: str, api_key: str | None = None, timeout_s: float = 600, retries: int = 3,
                 backoff_s: float = 0.5) -> None:
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s
        self._http = HttpClient(self.url, api_key, timeout_s, retries, backoff_s,
                                retry_on=NO_ANSWER, max_connections=256)

    async def __aenter__(self) -> SGLangClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def _request(self, method: str, path: str, json: Any = None, timeout_s: float | None = None,
                       ok_statuses: tuple[int, ...] = (),
                       retry_on: tuple[type[Exception], ...] | None = None) -> httpx.Response:
        try:
            resp = await self._http.request(method, path, json=json, timeout_s=timeout_s,
                                            retry_on=retry_on)
        except httpx.TimeoutException as e:
            raise InferenceError(None, f"{method} {self.url}{path}: timed out ({type(e).__name__})") from e
        except httpx.HTTPError as e:
            raise InferenceError(None, f"{method} {self.url}{path}: {type(e).__name__}: {e}") from e
        if resp.status_code >= 400 and resp.status_code not in ok_statuses:
            raise InferenceError(resp.status_code, _message(resp))
        return resp

    async def _post(self, path: str, body: dict[str, Any]) -> Any:
        return _json_or_text(await self._request("POST", path, json=body))

    async def _update(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """Weight-update endpoints answer {"success", "message"} with 200 or 400: return it."""
        # must not repeat once sent: only a request that never reached the server is sent again
        resp = await self._request("POST", path, json=body, ok_statuses=(400,), retry_on=NOT_SENT)
        data = _json_or_text(resp)
        if resp.status_code == 400 and not (isinstance(data, dict) and "success" in data):
            raise InferenceError(400, _message(resp))
        return data if isinstance(data, dict) else {"success": resp.status_code == 200, "message": str(data)}

    # -- generation -------------------------------------------------------------------
    async def generate(self, input_ids: list[int], sampling_params: dict, rid: str | None = None,
                       return_logprob: bool = True) -> GenerateResult:
        body: dict[str, Any] = {"input_ids": list(input_ids), "sampling_params": dict(sampling_params),
                                "return_logprob": return_logprob}
        if rid is not None:
            body["rid"] = rid
        data = await self._post("/generate", body)
        if not isinstance(data, dict):
            raise InferenceError(None, f"/generate: expected a JSON object, got {str(data)[:200]}")
        return GenerateResult.from_response(data)

    # -- weights ----------------------------------------------------------------------
    async def update_weights_from_disk(self, model_path: str, weight_version: str | None = None,
                                       abort_all_requests: bool = False) -> dict:
        body: dict[str, Any] = {"model_path": str(model_path), "abort_all_requests": abort_all_requests}
        if weight_version is not None:
            body["weight_version"] = str(weight_version)
        return await self._update("/update_weights_from_disk", body)

    async def init_weights_update_group(self, master_address: str, master_port: int, rank_offset: int,
                                        world_size: int, group_name: str = "weight_update_group",
                                        backend: str = "nccl") -> dict:
        return await self._update("/init_weights_update_group", {
            "master_address": master_address, "master_port": int(master_port), "rank_offset": int(rank_offset),
            "world_size": int(world_size), "group_name": group_name, "backend": backend})

    async def update_weights_from_distributed(self, names: list[str], dtypes: list[str], shapes: list[list[int]],
                                              group_name: str = "weight_update_group", flush_cache: bool = True,
                                              weight_version: str | None = None) -> dict:
        body: dict[str, Any] = {"names": list(names), "dtypes": [str(d).removeprefix("torch.") for d in dtypes],
                                "shapes": [list(s) for s in shapes], "group_name": group_name,
                                "flush_cache": flush_cache}
        if weight_version is not None:
            body["weight_version"] = str(weight_version)
        return await self._update("/update_weights_from_distributed", body)

    async def destroy_weights_update_group(self, group_name: str = "weight_update_group") -> dict:
        return await self._update("/destroy_weights_update_group", {"group_name": group_name})

    async def begin_weight_update(self, selector: str = "all") -> dict:
        """Open a weight-update session (SGLang >= 0.5.21 refuses update_weights_from_distributed
        and _from_tensor outside one). The server answers once it holds its update lock, i.e.
        after its in-flight requests end; a second begin before end is refused."""
        return await self._update("/begin_weight_update", {"selector": selector})

    async def end_weight_update(self) -> dict:
        """Close the session begin_weight_update opened (refused when none is open)."""
        return await self._update("/end_weight_update", {})

    async def get_weight_version(self) -> str:
        """The version the server reports, from /model_info (SGLang >= 0.5.21 serves no
        /get_weight_version)."""
        info = await self.model_info()
        if not isinstance(info, dict) or "weight_version" not in info:
            raise InferenceError(None, f"/model_info: no weight_version in {str(info)[:200]}")
        return str(info["weight_version"])

    async def update_weight_version(self, new_version: str, abort_all_requests: bool = True) -> dict:
        return await self._update("/update_weight_version", {"new_version": str(new_version),
                                                              "abort_all_requests": abort_all_requests})

    async def get_weights_by_name(self, name: str, truncate_size: int = 100) -> list:
        return await self._post("/get_weights_by_name", {"name": name, "truncate_size": truncate_size})

    # -- control ----------------------------------------------------------------------
    async def pause_generation(self, mode: str = "abort") -> dict:
        return await self._post("/pause_generation", {"mode": mode})

    async def continue_generation(self) -> dict:
        return await self._post("/continue_generation", {})

    async def abort_request(self, rid: str = "", abort_all: bool = False) -> Any:
        return await self._post("/abort_request", {"rid": rid, "abort_all": abort_all})

    async def flush_cache(self) -> bool:
        """True when flushed; False while requests are running (SGLang answers 400 then)."""
        resp = await self._request("POST", "/flush_cache", ok_statuses=(400,))
        return resp.status_code == 200

    async def model_info(self) -> dict:
        """GET /model_info: model_path, tokenizer_path, weight_version, ..."""
        return _json_or_text(await self._request("GET", "/model_info"))

    async def server_info(self) -> dict:
        """GET /server_info: the startup configuration and live scheduler state."""
        return _json_or_text(await self._request("GET", "/server_info"))

    # the names callers know; SGLang serves these routes only as deprecated aliases
    get_model_info = model_info
    get_server_info = server_info

    async def health(self) -> bool:
        return await self._probe("/health", timeout_s=10)

    async def health_generate(self) -> bool:
        return await self._probe("/health_generate", timeout_s=30)

    async def _probe(self, path: str, timeout_s: float) -> bool:
        """200 or not; one try (a probe's caller polls)."""
        try:
            resp = await self._http.request("GET", path, timeout_s=timeout_s, retries=0)
        except httpx.HTTPError:
            return False
        return resp.status_code == 200


def _json_or_text(resp: httpx.Response) -> Any:
    if not resp.content:
        return {}
    try:
        return resp.json()
    except ValueError:
        return resp.text
