"""The HTTP shape envd and the pool share: bearer auth on every route, a body-size cap, and
errors as `{ok: false, error}` with a 4xx/5xx status, the error naming the bad field or object.
Every answer carries `ok` (the clients test it). The middlewares are common.http's."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from common.http import BearerAuth, BodyLimit, StatusCounter
from common.logs import get_logger

log = get_logger("envd")
TOKEN_ENV = "SWARL_ENVD_TOKEN"


class ApiError(Exception):
    """An error answer: HTTP status + message (+ extra fields merged into the body)."""

    def __init__(self, status: int, error: str, **extra: Any) -> None:
        super().__init__(error)
        self.status = status
        self.error = error
        self.extra = extra


def _field_errors(exc: RequestValidationError) -> str:
    parts = []
    for e in exc.errors():
        loc = [str(p) for p in e.get("loc", ()) if p != "body"]
        name = ".".join(loc) or "body"
        parts.append(f"field {name!r}: {e.get('msg')}")
    return "; ".join(parts)


def _unauthorized(why: str) -> JSONResponse:
    return JSONResponse({"ok": False, "error": f"unauthorized: {why}"}, status_code=401,
                        headers={"WWW-Authenticate": "Bearer"})


def _too_large(size: int, limit: int) -> JSONResponse:
    return JSONResponse({"ok": False, "error": f"request body too large ({size} > {limit} bytes)"},
                        status_code=413)


def install(app: FastAPI, token: str | None, max_body_bytes: int,
            on_error: Callable[[str, int], None] | None = None) -> None:
    """Auth on every route, body cap, and `{ok: false, error}` answers for every error."""
    if on_error is not None:
        app.add_middleware(StatusCounter, on_error=on_error)
    if token is not None:
        app.add_middleware(BearerAuth, token=token, deny=_unauthorized)

    @app.exception_handler(ApiError)
    async def api_error(_request: Request, exc: ApiError) -> JSONResponse:
        return JSONResponse({"ok": False, "error": exc.error, **exc.extra}, status_code=exc.status)

    @app.exception_handler(RequestValidationError)
    async def bad_request(_request: Request, exc: RequestValidationError) -> JSONResponse:
        return JSONResponse({"ok": False, "error": _field_errors(exc)}, status_code=422)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_request: Request, exc: StarletteHTTPException) -> JSONResponse:
        return JSONResponse({"ok": False, "error": str(exc.detail)}, status_code=exc.status_code)

    @app.exception_handler(Exception)
    async def internal(request: Request, exc: Exception) -> JSONResponse:
        log.error("internal_error", path=request.url.path, error=repr(exc), exc_info=True)
        return JSONResponse({"ok": False, "error": f"internal error: {exc!r}"}, status_code=500)

    app.add_middleware(BodyLimit, limit=max_body_bytes, too_large=_too_large)
