"""`swarl pool serve`: leases containers on envd nodes — the scheduler (placement, health checks,
reaping expired leases) and the HTTP app. Its state, and the Lua scripts that reserve and release
capacity atomically, are envd/pool_state.py; the process that claims an expired lease (ZREM)
destroys its container.

Every call to a node goes through the node side of envd's client (EnvdClient.node). Its errors
become the pool's answers: a node's 404 (container gone) closes the lease and answers 404; any
other 4xx is passed on with its status; a 5xx keeps its status; no answer at all is a 502 (and,
when creating, marks the node unhealthy).

A crash between reserving a lease and recording its container leaves at most a container
envd itself destroys when its own lease (2 x pool TTL, renewed by the pool) runs out.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import asdict
from typing import Any

from fastapi import FastAPI
from fastapi.responses import Response

from broker.config import RedisConfig
from broker.keys import POOL_CONTAINER_TTL_FACTOR, Keys
from common.logs import get_logger
from envd import httputil
from envd.client import DiffFailed, EnvdClient, EnvError, EnvRequestError, LeaseLost
from envd.config import EnvdConfig, PoolConfig
from envd.httputil import ApiError
from envd.metrics import CONTENT_TYPE_LATEST, PoolMetrics, generate_latest
from envd.pool_state import PoolState
from envd.schemas import (
    DIFF_TIMEOUT_S,
    AllocateReq,
    LeaseReq,
    NodeReq,
    PoolDiffReq,
    PoolEvaluateReq,
    PoolExecReq,
)

log = get_logger("pool")


class Pool:
    def __init__(self, pcfg: PoolConfig, ecfg: EnvdConfig, redis: RedisConfig, keys: Keys,
                 node_token: str | None) -> None:
        self.pcfg, self.ecfg = pcfg, ecfg
        self.redis, self.keys = redis, keys
        self.node_token = node_token
        self.metrics = PoolMetrics()
        self.state: PoolState | None = None
        self._nodes: dict[str, EnvdClient] = {}
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        self.state = await PoolState.open(self.pcfg, self.redis, self.keys)
        for url in self.pcfg.exec_urls:
            await self.state.add_node(url.rstrip("/"), only_if_absent=True)
        await self.check_health()
        self._tasks = [asyncio.create_task(self._loop(self.check_health, self.pcfg.health_interval_s)),
                       asyncio.create_task(self._loop(self.reap, self.pcfg.reap_interval_s))]
        log.info("pool_started", nodes=list((await self.state.nodes()).keys()))

    async def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t
        for client in self._nodes.values():
            await client.aclose()
        self._nodes.clear()
        if self.state:
            await self.state.close()

    def node(self, url: str) -> EnvdClient:
        """The client of one node (made on first use: other pool processes may add nodes)."""
        client = self._nodes.get(url)
        if client is None:
            client = self._nodes[url] = EnvdClient.node(
                url, self.node_token, timeout_s=self.pcfg.node_timeout_s,
                max_connections=2 * self.pcfg.max_per_node + 8)
        return client

    async def _loop(self, fn: Callable[[], Awaitable[None]], interval: float) -> None:
        while True:
            await asyncio.sleep(interval)
            try:
                await fn()
            except Exception as e:
                log.error("pool_loop_failed", task=getattr(fn, "__name__", str(fn)), error=repr(e))

    # -- background ----------------------------------------------------------------
    async def check_health(self) -> None:
        state = self.state
        assert state

        async def one(url: str, info: dict[str, Any]) -> None:
            if info.get("state") == "draining" and await state.forget_drained(url):
                # Its client stays (idle connections expire; a destroy may still be on its way).
                log.info("node_removed", url=url)
                return
            try:
                body = await self.node(url).healthz()
            except (EnvError, EnvRequestError) as e:
                await state.set_health(url, False, str(e))
                return
            healthy = bool(body.get("ok"))
            await state.set_health(url, healthy, "" if healthy else str(body.get("error", "")),
                                   int(body.get("running_containers", 0)), str(body.get("node_id") or ""))

        await asyncio.gather(*(one(u, i) for u, i in (await state.nodes()).items()))
        self.metrics.leases.set(await state.count())

    async def reap(self) -> None:
        assert self.state
        for lease_id in await self.state.expired():
            fields = await self.state.release(lease_id)
            if fields is None:
                continue  # another pool process claimed it
            self.metrics.expired.inc()
            log.info("lease_expired", lease_id=lease_id, node=fields.get("node_url"))
            await self._destroy(fields)

    async def _destroy(self, fields: dict[str, str]) -> None:
        cid, node = fields.get("container_id"), fields.get("node_url")
        if not cid or not node:
            return
        try:
            await self.node(node).destroy(cid)
        except LeaseLost:
            pass  # gone already
        except (EnvError, EnvRequestError) as e:
            # envd's own lease (2 x pool TTL) still destroys it later.
            self.metrics.node_errors.labels(node).inc()
            log.warning("destroy_failed", node=node, container_id=cid[:12], error=str(e))

    # -- requests ------------------------------------------------------------------
    async def allocate(self, req: AllocateReq) -> dict[str, Any]:
        assert self.state
        wait_s = self.pcfg.allocate_wait_s if req.wait_s is None else min(req.wait_s, self.pcfg.allocate_wait_s)
        t0 = time.monotonic()
        deadline = t0 + wait_s
        delay = 0.05
        last = ""
        while True:
            lease_id = f"lease-{secrets.token_hex(8)}"
            status, detail = await self.state.reserve(lease_id, req.image, req.instance_id, req.owner)
            if status == "ok":
                node = detail
                # A create may wait for a pull longer than the lease lives: keep it alive.
                keep = asyncio.create_task(self._keep_alive(lease_id))
                try:
                    made = await self.node(node).create_info(
                        req.image, ttl_s=POOL_CONTAINER_TTL_FACTOR * self.pcfg.lease_ttl_s, lease=lease_id,
                        labels={"swarl.pool_owner": req.owner or "", "swarl.instance": req.instance_id[:200]},
                        http_timeout_s=self.ecfg.create_timeout_s + self.ecfg.pull_timeout_s + 10,
                        reuse=True)  # an agent's container: may be one reset after an earlier lease
                    cid = str(made["container_id"])
                except EnvRequestError as e:  # the request's fault (e.g. unknown image)
                    await self.state.release(lease_id)
                    await self.state.unmark_pulling(node, req.image)
                    self.metrics.allocations.labels("rejected").inc()
                    raise ApiError(e.status, str(e), node_url=node) from None
                except EnvError as e:
                    await self.state.release(lease_id)
                    await self.state.unmark_pulling(node, req.image)
                    if e.reason == "pull_failed":  # infrastructure: the caller retries the episode
                        self.metrics.allocations.labels("pull_failed").inc()
                        raise ApiError(502, f"node {node}: {e}", node_url=node, reason="pull_failed") from None
                    self.metrics.node_errors.labels(node).inc()
                    if e.status is None:  # no answer: take the node out until it answers again
                        await self.state.set_health(node, False, str(e))
                    last = f"node {node} failed: {e}"
                else:
                    if not await self.state.activate(lease_id, cid):
                        # reaped while the node was creating (slower than the TTL)
                        await self._destroy({"container_id": cid, "node_url": node})
                        raise ApiError(504, f"lease {lease_id} expired while its container "
                                            f"was created on {node}")
                    expiry = await self.state.renew(lease_id)
                    self.metrics.allocations.labels("ok").inc()
                    self.metrics.allocate_wait.observe(time.monotonic() - t0)
                    log.info("allocated", lease_id=lease_id, node=node, image=req.image,
                             pulled=made.get("pulled", False))
                    return {"ok": True, "lease_id": lease_id, "container_id": cid,
                            "node_url": node, "expires": expiry, "pulled": made.get("pulled", False),
                            "pull_s": made.get("pull_s", 0.0), "create_s": made.get("create_s", 0.0)}
                finally:
                    keep.cancel()
            else:
                last = detail
            if time.monotonic() >= deadline:
                self.metrics.allocations.labels("timeout").inc()
                raise ApiError(503, f"no capacity within {wait_s:g}s: {last}")
            await asyncio.sleep(min(delay, max(0.0, deadline - time.monotonic())))
            delay = min(delay * 2, 1.0)

    async def _keep_alive(self, lease_id: str) -> None:
        assert self.state
        while True:
            await asyncio.sleep(self.pcfg.lease_ttl_s / 3)
            with contextlib.suppress(Exception):
                await self.state.renew(lease_id)

    async def lease_or_404(self, lease_id: str) -> dict[str, str]:
        assert self.state
        fields = await self.state.lease(lease_id)
        if fields is None or fields.get("state") != "active":
            raise ApiError(404, f"unknown or expired lease {lease_id}", lease_id=lease_id)
        await self.state.renew(lease_id)
        return fields

    @contextlib.asynccontextmanager
    async def on_node(self, lease_id: str, op: str) -> AsyncIterator[tuple[EnvdClient, str]]:
        """(the lease's node, its container id) for one call; the node's errors become the
        pool's answers (a node 404 closes the lease)."""
        assert self.state
        fields = await self.lease_or_404(lease_id)
        node = fields["node_url"]
        try:
            yield self.node(node), fields["container_id"]
        except LeaseLost as e:
            await self.state.release(lease_id)
            raise ApiError(404, f"lease {lease_id} lost: {e}", lease_id=lease_id) from None
        except EnvRequestError as e:
            raise ApiError(e.status, str(e), lease_id=lease_id) from None
        except EnvError as e:
            self.metrics.node_errors.labels(node).inc()
            raise ApiError(e.status or 502, f"node {node} failed on {op}: {e}", lease_id=lease_id) from None

    async def close_lease(self, lease_id: str) -> dict[str, Any]:
        assert self.state
        fields = await self.state.release(lease_id)
        if fields is None:
            return {"ok": True, "closed": False}
        await self._destroy(fields)
        log.info("closed", lease_id=lease_id)
        return {"ok": True, "closed": True}

    async def status(self) -> dict[str, Any]:
        assert self.state
        nodes = await self.state.nodes()
        load = await self.state.load()
        lease_ids = await self.state.lease_ids()
        for url, info in nodes.items():
            info["leases"] = load.get(url, 0)
        return {"ok": True, "leases": len(lease_ids), "active_leases": len(lease_ids),
                "max_concurrent": self.pcfg.max_concurrent, "max_per_node": self.pcfg.max_per_node,
                "nodes": nodes, "lease_ids": sorted(lease_ids)}


def create_app(cfg: PoolConfig, envd_cfg: EnvdConfig, redis: RedisConfig, keys: Keys,
               token: str | None, node_token: str | None) -> FastAPI:
    """The pool app: state in Redis (`redis.url` set) under `keys`; `node_token` for the nodes."""
    pool = Pool(cfg, envd_cfg, redis, keys, node_token)

    @contextlib.asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        await pool.start()
        try:
            yield
        finally:
            await pool.stop()

    app = FastAPI(title="swarl pool", lifespan=lifespan)
    app.state.pool = pool
    httputil.install(app, token, cfg.max_body_bytes)
    grace = envd_cfg.kill_grace_s + 30

    @app.get("/healthz")
    async def healthz() -> dict[str, Any]:
        assert pool.state
        nodes = await pool.state.nodes()
        healthy = sum(1 for n in nodes.values() if n.get("healthy") and n.get("state") == "active")
        return {"ok": True, "nodes": len(nodes), "healthy_nodes": healthy}

    @app.get("/status")
    async def status() -> dict[str, Any]:
        return await pool.status()

    @app.post("/allocate")
    async def allocate(req: AllocateReq) -> dict[str, Any]:
        return await pool.allocate(req)

    @app.post("/heartbeat")
    async def heartbeat(req: LeaseReq) -> dict[str, Any]:
        async with pool.on_node(req.lease_id, "heartbeat") as (node, cid):
            await node.heartbeat(cid)
        assert pool.state
        return {"ok": True, "expires": await pool.state.renew(req.lease_id)}

    @app.post("/exec")
    async def exec_(req: PoolExecReq) -> dict[str, Any]:
        async with pool.on_node(req.lease_id, "exec") as (node, cid):
            out = await node.exec(cid, req.command, req.cwd, req.timeout, req.env,
                                  http_timeout_s=req.timeout + grace)
        return {"ok": True, **asdict(out)}

    @app.post("/diff")
    async def diff(req: PoolDiffReq) -> dict[str, Any]:
        async with pool.on_node(req.lease_id, "diff") as (node, cid):
            try:
                patch = await node.diff(cid, req.cwd, http_timeout_s=DIFF_TIMEOUT_S + grace)
            except DiffFailed as e:  # git's failure is the answer, as envd gives it
                return {"ok": True, "patch": "", "returncode": e.returncode, "error": e.error}
        return {"ok": True, "patch": patch, "returncode": 0, "error": ""}

    @app.post("/evaluate")
    async def evaluate(req: PoolEvaluateReq) -> dict[str, Any]:
        timeout = min(req.timeout, envd_cfg.eval_timeout_s) + envd_cfg.create_timeout_s + 2 * grace
        async with pool.on_node(req.lease_id, "evaluate") as (node, cid):
            out = await node.evaluate(cid, req.patch, req.instance, req.eval_script, req.timeout, req.cwd,
                                      http_timeout_s=timeout)
        return {"ok": True, **asdict(out)}

    @app.post("/close")
    async def close(req: LeaseReq) -> dict[str, Any]:
        return await pool.close_lease(req.lease_id)

    @app.post("/nodes/add")
    async def add_node(req: NodeReq) -> dict[str, Any]:
        assert pool.state
        await pool.state.add_node(req.url.rstrip("/"))
        await pool.check_health()
        return {"ok": True, "nodes": await pool.state.nodes()}

    @app.post("/nodes/remove")
    async def remove_node(req: NodeReq) -> dict[str, Any]:
        assert pool.state
        if not await pool.state.drain_node(req.url.rstrip("/")):
            raise ApiError(404, f"unknown node {req.url}")
        return {"ok": True, "nodes": await pool.state.nodes()}

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(generate_latest(pool.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    return app
