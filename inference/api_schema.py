"""Request bodies of SGLang's native HTTP API (field names and defaults as SGLang's io_struct),
as the CPU server accepts them."""

from __future__ import annotations

from typing import Any, Literal

from fastapi import FastAPI
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from common.http import BearerAuth

# As SGLang's add_api_key_middleware: OPTIONS, and every path under /health (/health_generate
# too), /ready and /metrics, are served without the key, so probes and scrapers written for
# SGLang work unchanged; everything else needs `Authorization: Bearer <key>`.
OPEN_PATHS = ("/health", "/ready", "/metrics")


class ApiError(Exception):
    """An error answered in SGLang's shape: {"error": {"message": ...}} with `status`."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class _Body(BaseModel):
    # SGLang's request dataclasses grow fields between releases: accept the superset, ignore extras
    model_config = ConfigDict(extra="ignore")


class GenerateReq(_Body):
    text: str | list[str] | None = None
    input_ids: list[int] | list[list[int]] | None = None
    input_embeds: Any = None
    sampling_params: dict[str, Any] | list[dict[str, Any]] | None = None
    rid: str | list[str] | None = None
    return_logprob: bool | list[bool] | None = None
    logprob_start_len: int | list[int] | None = None
    top_logprobs_num: int | list[int] | None = None
    return_text_in_logprobs: bool = False
    stream: bool = False


class UpdateWeightsFromDiskReq(_Body):
    model_path: str
    load_format: str | None = None
    abort_all_requests: bool = False
    weight_version: str | None = None
    is_async: bool = False
    torch_empty_cache: bool = False
    keep_pause: bool = False
    flush_cache: bool = True


class InitWeightsUpdateGroupReq(_Body):
    master_address: str
    master_port: int
    rank_offset: int
    world_size: int
    group_name: str = "weight_update_group"
    backend: str = "nccl"


class UpdateWeightsFromDistributedReq(_Body):
    names: list[str]
    dtypes: list[str]
    shapes: list[list[int]]
    group_name: str = "weight_update_group"
    flush_cache: bool = True
    abort_all_requests: bool = False
    weight_version: str | None = None
    load_format: str | None = None
    selector: Literal["target", "draft", "all"] = "all"
    torch_empty_cache: bool = False


class BeginWeightUpdateReq(_Body):
    selector: Literal["target", "draft", "all"] = "all"


class EndWeightUpdateReq(_Body):
    pass


class ContinueGenerationReq(_Body):
    torch_empty_cache: bool = True


class DestroyWeightsUpdateGroupReq(_Body):
    group_name: str = "weight_update_group"


class UpdateWeightVersionReq(_Body):
    new_version: str
    abort_all_requests: bool = True


class PauseGenerationReq(_Body):
    mode: str = Field("abort", pattern="^(abort|retract|in_place)$")


class AbortReq(_Body):
    rid: str = ""
    abort_all: bool = False


class GetWeightsByNameReq(_Body):
    name: str
    truncate_size: int = Field(100, ge=1)


def _unauthorized(_why: str) -> JSONResponse:
    return JSONResponse({"error": "Unauthorized"}, status_code=401)


def add_api_key(app: FastAPI, api_key: str) -> None:
    """Require `Authorization: Bearer <api_key>` as SGLang does (not on OPEN_PATHS); a refusal is
    SGLang's `401 {"error": "Unauthorized"}`."""
    app.add_middleware(BearerAuth, token=api_key, open_prefixes=OPEN_PATHS, deny=_unauthorized)


def parse(model: type[BaseModel], body: Any) -> Any:
    """Validate a JSON body; a bad one raises ApiError(400) naming each bad field."""
    if body is None:
        body = {}
    if not isinstance(body, dict):
        raise ApiError(400, f"request body must be a JSON object, got {type(body).__name__}")
    try:
        return model.model_validate(body)
    except ValidationError as e:
        raise ApiError(400, validation_message(e)) from None


def validation_message(e: ValidationError, prefix: str = "") -> str:
    parts = []
    for err in e.errors():
        loc = ".".join(str(p) for p in err["loc"])
        where = f"{prefix}{loc}" if loc else prefix.rstrip(".") or "body"
        msg = err["msg"].removeprefix("Value error, ")
        parts.append(f"{where}: {msg}")
    return "; ".join(parts)
