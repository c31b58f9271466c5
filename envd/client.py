"""The one async client of the envd API, for the pool (leases) or one envd node (containers).

`EnvdClient.pool(url, token)` is what actors use: allocate a lease, then exec / diff /
evaluate / heartbeat / close it by lease id. `EnvdClient.node(url, token)` speaks to one envd
by container id (create / exec / diff / evaluate / heartbeat / destroy / healthz); the pool
uses it for every call to a node.

EnvError means the infrastructure failed (connection, 5xx, read timeout, a lost lease): the
episode must be retried or dropped, never scored -1. EnvRequestError (a ValueError) means the
request itself was bad (4xx naming the field). Requests that got no answer are retried by
common.http's policy (connection errors, plus a connection the server dropped before
answering: an exec may then run twice, as with any HTTP client that retries).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import httpx

from common.http import NOT_SENT, HttpClient
from envd.schemas import DIFF_TIMEOUT_S

__all__ = ["EnvError", "EnvRequestError", "EnvdClient", "EvalResult", "ExecResult", "Lease",
           "LeaseLost"]

# Transport failures sent again: never sent, or the connection dropped before any answer
# (exec excepted: only never-sent requests are sent again, so a command never runs twice).
RETRY_ON: tuple[type[Exception], ...] = (*NOT_SENT, httpx.RemoteProtocolError)
EVAL_SLACK_S = 300.0  # evaluate: a fresh container's create and the patch apply, on top of the run
# A create may pull its image first: envd.create_timeout_s + envd.pull_timeout_s (defaults)
# + margin. envd and the pool bound both; this only keeps a caller from waiting forever.
CREATE_SLACK_S = 120.0 + 1800.0 + 30.0


class EnvError(Exception):
    """Infrastructure failure (connection, 5xx, lease lost) — never a -1 reward. `status` is
    the server's 5xx status when it answered one, `reason` its machine-readable kind when it
    gave one (e.g. `pull_failed`: the node could not pull the image)."""

    def __init__(self, message: str, status: int | None = None, reason: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason


class LeaseLost(EnvError):
    """The lease or its container is gone (expired, reaped, node restarted without it)."""


class EnvRequestError(ValueError):
    """A 4xx other than a lost lease: the request was wrong; the message names the field."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class DiffFailed(EnvError):
    """`git diff` failed in the container (the answer carries its exit code and output)."""

    def __init__(self, returncode: int, error: str) -> None:
        super().__init__(f"diff failed (exit {returncode}): {error}")
        self.returncode, self.error = returncode, error


@dataclass
class Lease:
    lease_id: str
    container_id: str
    node_url: str
    pull_s: float = 0.0    # waiting for the node to pull the image (0: it was there)
    create_s: float = 0.0  # creating and starting the container


@dataclass
class ExecResult:
    returncode: int
    output: str
    timed_out: bool = False
    duration_s: float = 0.0
    truncated: bool = False


@dataclass
class EvalResult:
    resolved: bool
    tests_status: dict[str, str] = field(default_factory=dict)
    fail_to_pass: dict[str, str] = field(default_factory=dict)
    pass_to_pass: dict[str, str] = field(default_factory=dict)
    output: str = ""
    error: str = ""
    timed_out: bool = False
    returncode: int | None = None
    mode: str = ""
    reward_hack: list[dict[str, str]] = field(default_factory=list)  # swe.tamper.Tamper dicts
    referee: dict[str, Any] = field(default_factory=dict)  # envd.referee's view: statuses, isolated, runs
    cached: bool = False  # the verdict of an earlier grading of the same inputs (envd.grade_cache)


def _eval_result(body: dict[str, Any]) -> EvalResult:
    return EvalResult(resolved=bool(body.get("resolved")), tests_status=body.get("tests_status") or {},
                      fail_to_pass=body.get("fail_to_pass") or {},
                      pass_to_pass=body.get("pass_to_pass") or {}, output=body.get("output") or "",
                      error=body.get("error") or "", timed_out=bool(body.get("timed_out")),
                      returncode=body.get("returncode"), mode=body.get("mode") or "",
                      reward_hack=body.get("reward_hack") or [], referee=body.get("referee") or {},
                      cached=bool(body.get("cached")))


def _exec_result(body: dict[str, Any]) -> ExecResult:
    return ExecResult(returncode=int(body.get("returncode", -1)), output=body.get("output", ""),
                      timed_out=bool(body.get("timed_out")), duration_s=float(body.get("duration_s", 0.0)),
                      truncated=bool(body.get("truncated")))


@dataclass(frozen=True)
class _Routes:
    """Where one side of the API takes the calls both sides have, and what names the target."""

    target: str  # the request field: lease_id or container_id
    exec: str
    diff: str
    evaluate: str
    heartbeat: str


_POOL = _Routes("lease_id", "/exec", "/diff", "/evaluate", "/heartbeat")
_NODE = _Routes("container_id", "/container/exec", "/container/diff", "/container/evaluate",
                "/container/heartbeat")


class EnvdClient:
    """The envd API over HTTP: a pool (`EnvdClient.pool`) or one node (`EnvdClient.node`).

    exec / diff / evaluate / heartbeat / status / aclose work on both, by lease id on a pool and
    by container id on a node; allocate / close / add_node / remove_node are the pool's,
    create / destroy / healthz a node's. Every call has a bounded HTTP timeout: the call's own
    (`timeout` of exec and evaluate, envd's diff bound) plus `timeout_s`, or `http_timeout_s`.
    """

    def __init__(self, http: HttpClient, routes: _Routes, allocate_wait_s: float = 60.0) -> None:
        self.http = http
        self.routes = routes
        self.allocate_wait_s = allocate_wait_s

    @classmethod
    def pool(cls, url: str, token: str | None, timeout_s: float = 60.0, retries: int = 3,
             allocate_wait_s: float = 60.0, max_connections: int = 64) -> EnvdClient:
        """The lease pool (`swarl pool serve`), as actors use it."""
        return cls(HttpClient(url, token, timeout_s, retries, retry_on=RETRY_ON,
                              max_connections=max_connections), _POOL, allocate_wait_s)

    @classmethod
    def node(cls, url: str, token: str | None, timeout_s: float = 60.0, retries: int = 3,
             max_connections: int = 64) -> EnvdClient:
        """One envd (`swarl envd serve`)."""
        return cls(HttpClient(url, token, timeout_s, retries, retry_on=RETRY_ON,
                              max_connections=max_connections), _NODE)

    @property
    def url(self) -> str:
        return self.http.url

    @property
    def is_pool(self) -> bool:
        return self.routes is _POOL

    async def call(self, method: str, path: str, body: dict[str, Any] | None = None,
                   timeout_s: float | None = None, lost_on_404: bool = False,
                   retries: int | None = None,
                   retry_on: tuple[type[Exception], ...] | None = None) -> dict[str, Any]:
        """One request; the answer's JSON object, or EnvError / LeaseLost / EnvRequestError."""
        try:
            r = await self.http.request(method, path, json=body, timeout_s=timeout_s, retries=retries,
                                        retry_on=retry_on)
        except httpx.HTTPError as e:
            raise EnvError(f"{method} {self.url}{path}: {e!r}") from e
        try:
            out = r.json()
        except ValueError:
            out = {"error": r.text[:500]}
        if not isinstance(out, dict):
            out = {"error": str(out)}
        if r.status_code == 404 and lost_on_404:
            raise LeaseLost(out.get("error", f"{path}: 404"))
        if 400 <= r.status_code < 500:
            raise EnvRequestError(r.status_code, out.get("error", f"{path}: {r.status_code}"))
        if r.status_code >= 500:
            raise EnvError(f"{path}: {r.status_code} {out.get('error', '')}", status=r.status_code,
                           reason=out.get("reason"))
        return out

    def _side(self, pool: bool, name: str) -> None:
        if self.is_pool != pool:
            raise TypeError(f"{name}() is the {'pool' if pool else 'node'}'s; this client speaks to "
                            f"{'a pool' if self.is_pool else 'a node'} at {self.url}")

    # -- both sides ----------------------------------------------------------------------
    async def exec(self, target: str, command: str, cwd: str = "/testbed", timeout: float = 180,  # noqa: ASYNC109 - envd's field name
                   env: dict[str, str] | None = None, http_timeout_s: float | None = None) -> ExecResult:
        body = await self.call("POST", self.routes.exec,
                               {self.routes.target: target, "command": command, "cwd": cwd,
                                "timeout": timeout, "env": env or {}},
                               timeout_s=http_timeout_s or timeout + self.http.timeout_s, lost_on_404=True,
                               # an agent's command runs at most once: a request that may have
                               # reached envd (its node died mid-exec) is an EnvError, never re-sent
                               retry_on=NOT_SENT)
        return _exec_result(body)

    async def diff(self, target: str, cwd: str = "/testbed", http_timeout_s: float | None = None) -> str:
        """The patch (`git add -A && git diff --cached`); DiffFailed when git failed."""
        body = await self.call("POST", self.routes.diff, {self.routes.target: target, "cwd": cwd},
                               timeout_s=http_timeout_s or DIFF_TIMEOUT_S + self.http.timeout_s,
                               lost_on_404=True)
        if body.get("returncode", 0) != 0:
            raise DiffFailed(int(body["returncode"]), body.get("error", ""))
        return str(body.get("patch", ""))

    async def evaluate(self, target: str, patch: str, instance: dict[str, Any] | None = None,
                       eval_script: str | None = None, timeout: float = 3600,  # noqa: ASYNC109
                       cwd: str = "/testbed", http_timeout_s: float | None = None) -> EvalResult:
        body = await self.call(
            "POST", self.routes.evaluate,
            {self.routes.target: target, "patch": patch, "instance": instance,
             "eval_script": eval_script, "cwd": cwd, "timeout": timeout},
            timeout_s=http_timeout_s or timeout + EVAL_SLACK_S + self.http.timeout_s, lost_on_404=True)
        return _eval_result(body)

    async def heartbeat(self, target: str) -> float:
        """Renew the lease / container; its new expiry (unix s)."""
        body = await self.call("POST", self.routes.heartbeat, {self.routes.target: target}, lost_on_404=True)
        return float(body.get("expires", 0.0))

    async def status(self) -> dict[str, Any]:
        return await self.call("GET", "/status")

    async def aclose(self) -> None:
        await self.http.aclose()

    # -- the pool ------------------------------------------------------------------------
    async def allocate(self, image: str, instance_id: str, wait_s: float | None = None,
                       owner: str = "") -> Lease:
        self._side(True, "allocate")
        wait = self.allocate_wait_s if wait_s is None else wait_s
        body = await self.call("POST", "/allocate", {"image": image, "instance_id": instance_id,
                                                     "wait_s": wait, "owner": owner},
                               timeout_s=wait + self.http.timeout_s + CREATE_SLACK_S)
        return Lease(body["lease_id"], body["container_id"], body["node_url"],
                     float(body.get("pull_s") or 0.0), float(body.get("create_s") or 0.0))

    async def close(self, lease_id: str) -> None:
        self._side(True, "close")
        await self.call("POST", "/close", {"lease_id": lease_id})

    async def add_node(self, url: str) -> dict[str, Any]:
        """Add an envd node to the pool; the pool's nodes."""
        self._side(True, "add_node")
        return await self.call("POST", "/nodes/add", {"url": url})

    async def remove_node(self, url: str) -> dict[str, Any]:
        """Drain an envd node; the pool's nodes."""
        self._side(True, "remove_node")
        return await self.call("POST", "/nodes/remove", {"url": url})

    # -- one node ------------------------------------------------------------------------
    async def create(self, image: str, ttl_s: float | None = None, lease: str | None = None,
                     labels: dict[str, str] | None = None, http_timeout_s: float | None = None) -> str:
        """Create and start a container; its id. An unknown image is an EnvRequestError (404)."""
        out = await self.create_info(image, ttl_s, lease, labels, http_timeout_s)
        return str(out["container_id"])

    async def create_info(self, image: str, ttl_s: float | None = None, lease: str | None = None,
                          labels: dict[str, str] | None = None,
                          http_timeout_s: float | None = None, reuse: bool = False) -> dict[str, Any]:
        """create's whole answer: container_id, name, lease, expires, labels, pulled, pull_s,
        create_s. A missing image is pulled first; a failed pull is an EnvError (502) with
        reason `pull_failed`."""
        self._side(False, "create")
        body: dict[str, Any] = {"image": image}
        if ttl_s:
            body["ttl_s"] = ttl_s
        if lease:
            body["lease"] = lease
        if labels:
            body["labels"] = labels
        if reuse:
            body["reuse"] = True
        return await self.call("POST", "/container/create", body,
                               timeout_s=http_timeout_s or self.http.timeout_s + CREATE_SLACK_S)

    async def pull(self, image: str, http_timeout_s: float | None = None) -> dict[str, Any]:
        """Have `image` on this node (prefetch): image, pulled, pull_s, bytes, node_id. A failed
        pull is an EnvError (502) with reason `pull_failed`."""
        self._side(False, "pull")
        return await self.call("POST", "/images/pull", {"image": image},
                               timeout_s=http_timeout_s or self.http.timeout_s + CREATE_SLACK_S)

    async def images(self) -> dict[str, Any]:
        """The node's image tags and the pulls running there."""
        self._side(False, "images")
        return await self.call("GET", "/images")

    async def destroy(self, container_id: str) -> None:
        self._side(False, "destroy")
        await self.call("POST", "/container/destroy", {"container_id": container_id}, lost_on_404=True)

    async def healthz(self, timeout_s: float = 5.0) -> dict[str, Any]:
        """The node's /healthz answer; not retried (health checks repeat anyway)."""
        self._side(False, "healthz")
        return await self.call("GET", "/healthz", timeout_s=timeout_s, retries=0)
