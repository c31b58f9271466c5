"""The HTTP kit every swarl service and client shares.

Servers: `BearerAuth` (one bearer-token check for envd, the pool and the CPU inference server;
paths under `open_prefixes` are served to anyone, as SGLang serves /health and /metrics),
`BodyLimit` (413 past a size, with or without Content-Length) and `StatusCounter` (a hook per
error answer, for metrics). Clients: `HttpClient`, JSON over httpx with a bearer token, bounded
timeouts and one retry policy (tenacity, exponential backoff) for requests that never got an
answer — an HTTP answer, 4xx or 5xx, is never retried here.
"""

from __future__ import annotations

import functools
import hmac
import os
import ssl
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_attempt, wait_exponential

# Failures before the request reached a server: always safe to send again.
NOT_SENT: tuple[type[Exception], ...] = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)
# Also failures after sending but before any answer: safe only where running the request
# twice is harmless (generation, status reads).
NO_ANSWER: tuple[type[Exception], ...] = (*NOT_SENT, httpx.RemoteProtocolError, httpx.ReadError,
                                          httpx.WriteError)


class TokenError(ValueError):
    """No usable token: the message says where one can be given."""


def resolve_token(configured: str | None, token_file: str | None, no_auth: bool,
                  env_var: str, config_key: str) -> str | None:
    """The token a service requires: --token-file, else the configured value (`config_key`),
    else `env_var`; None only with an explicit no_auth."""
    if no_auth:
        return None
    if token_file:
        from_file = Path(token_file).read_text().strip()
        if not from_file:
            raise TokenError(f"--token-file {token_file} is empty")
        return from_file
    token = configured or os.environ.get(env_var)
    if not token:
        raise TokenError(f"no token: set {config_key}, {env_var} or --token-file "
                         "(or pass --no-auth on a trusted network)")
    return token


def _deny_json(why: str) -> Response:
    return JSONResponse({"error": "Unauthorized"}, status_code=401,
                        headers={"WWW-Authenticate": "Bearer"})


class BearerAuth:
    """ASGI middleware: `Authorization: Bearer <token>` or 401 (compared in constant time).

    OPTIONS and paths starting with one of `open_prefixes` pass without a token. `deny(why)`
    builds the 401 answer in the service's own error shape. Plain ASGI (no per-request task
    or stream wrapping), so client disconnects still reach the handlers.
    """

    def __init__(self, app: ASGIApp, token: str, open_prefixes: tuple[str, ...] = (),
                 deny: Callable[[str], Response] = _deny_json) -> None:
        self.app = app
        self.token = token.encode()
        self.open_prefixes = open_prefixes
        self.deny = deny

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("method") == "OPTIONS" or \
                str(scope.get("path", "")).startswith(self.open_prefixes or ("\0",)):
            await self.app(scope, receive, send)
            return
        got = b""
        for name, value in scope.get("headers", []):
            if name == b"authorization":
                got = value
                break
        scheme, _, value = got.partition(b" ")
        if scheme.lower() == b"bearer" and hmac.compare_digest(value.strip(), self.token):
            await self.app(scope, receive, send)
            return
        await self.deny("missing bearer token" if not got else "wrong bearer token")(scope, receive, send)


class BodyLimit:
    """ASGI middleware: a body over `limit` bytes gets 413, whether or not Content-Length says so.

    A body without Content-Length (chunked) is read here up to the limit and then replayed:
    the framework would turn an error raised mid-read into a vague 400.
    """

    def __init__(self, app: ASGIApp, limit: int,
                 too_large: Callable[[int, int], Response] | None = None) -> None:
        self.app = app
        self.limit = limit
        self.too_large = too_large or (lambda size, limit: JSONResponse(
            {"error": f"request body too large ({size} > {limit} bytes)"}, status_code=413))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for name, value in scope.get("headers", []):
            if name == b"content-length":
                if value.isdigit() and int(value) > self.limit:
                    await self.too_large(int(value), self.limit)(scope, receive, send)
                    return
                await self.app(scope, receive, send)  # uvicorn enforces the declared length
                return
        chunks: list[bytes] = []
        size = 0
        while True:
            msg = await receive()
            if msg["type"] != "http.request":  # client went away
                return
            chunk = msg.get("body", b"")
            size += len(chunk)
            if size > self.limit:
                await self.too_large(size, self.limit)(scope, receive, send)
                return
            chunks.append(chunk)
            if not msg.get("more_body", False):
                break
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": b"".join(chunks), "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


class StatusCounter:
    """ASGI middleware: call `on_error(path, status)` for every answer with status >= 400."""

    def __init__(self, app: ASGIApp, on_error: Callable[[str, int], None]) -> None:
        self.app = app
        self.on_error = on_error

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def watch(msg: Message) -> None:
            if msg["type"] == "http.response.start" and msg["status"] >= 400:
                self.on_error(scope.get("path", ""), msg["status"])
            await send(msg)

        await self.app(scope, receive, watch)


@functools.cache
def tls_context() -> ssl.SSLContext:
    """The process's one TLS context for clients. httpx builds a new one (loading the CA store:
    tens of milliseconds of CPU) for every client otherwise, and actors make a client per
    episode: that was most of an actor's CPU on short episodes. For http:// it is never used."""
    return httpx.create_ssl_context()


class HttpClient:
    """One service over HTTP: bearer token, bounded timeouts, connection-level retries.

    `retry_on` picks which transport failures are sent again (NOT_SENT by default; NO_ANSWER
    where a repeated request is harmless), up to `retries` more times with exponential backoff
    from `backoff_s` to `max_backoff_s`. The last failure is raised as it is (an httpx error).
    """

    def __init__(self, base_url: str, token: str | None = None, timeout_s: float = 60.0,
                 retries: int = 3, backoff_s: float = 0.2, max_backoff_s: float = 2.0,
                 retry_on: tuple[type[Exception], ...] = NOT_SENT, max_connections: int = 64) -> None:
        self.url = base_url.rstrip("/")
        self.timeout_s = timeout_s
        self.retries = retries
        self.backoff_s, self.max_backoff_s = backoff_s, max_backoff_s
        self.retry_on = retry_on
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.client = httpx.AsyncClient(
            base_url=self.url, headers=headers, timeout=self._timeout(timeout_s), verify=tls_context(),
            limits=httpx.Limits(max_connections=max_connections,
                                max_keepalive_connections=max(8, max_connections // 4)))

    @staticmethod
    def _timeout(timeout_s: float) -> httpx.Timeout:
        return httpx.Timeout(timeout_s, connect=min(10.0, timeout_s))

    async def request(self, method: str, path: str, *, json: Any = None,
                      params: dict[str, Any] | None = None, timeout_s: float | None = None,
                      retries: int | None = None,
                      retry_on: tuple[type[Exception], ...] | None = None) -> httpx.Response:
        """One request; `retries` / `retry_on` override the client's for this call."""
        timeout = self._timeout(timeout_s) if timeout_s else None
        attempts = AsyncRetrying(
            retry=retry_if_exception_type(self.retry_on if retry_on is None else retry_on),
            stop=stop_after_attempt(1 + (self.retries if retries is None else retries)),
            wait=wait_exponential(multiplier=self.backoff_s, max=self.max_backoff_s),
            reraise=True)
        async for attempt in attempts:
            with attempt:
                return await self.client.request(method, path, json=json, params=params,
                                                 timeout=timeout if timeout else httpx.USE_CLIENT_DEFAULT)
        raise AssertionError("unreachable: tenacity re-raises the last failure")

    async def aclose(self) -> None:
        await self.client.aclose()

    async def __aenter__(self) -> HttpClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
