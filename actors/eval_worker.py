"""Evaluation during training (`swarl eval-worker`): every eval.every_versions-th published policy
version is evaluated on the eval set, on exactly that version, while training goes on.

Exactly version v:
- the episodes run on an eval server: a server registered with role `eval`, which no actor pins
  (the pin script takes policy servers only) and the weight-sync coordinator never updates (it
  lists policy servers only). One eval worker holds the server (a TTL'd claim in Redis, renewed
  while it works), so nobody else loads weights into it;
- the worker loads v's published checkpoint into it (`update_weights_from_disk`, weight_version
  "v") after checking every file against the manifest's sha256, and starts no episode until the
  server's /model_info reports weight_version "v";
- every turn of every episode carries the weight_version the server answered it with
  (actors.evaluate records them per episode): an episode with a turn at another version, or one
  that ended in an error, is removed from the version's results and run again on a fresh load
  (eval.max_tries); a score is never made of turns of two policies;
- a version whose checkpoint is gone (retention deleted it, or its files fail their sha256) is
  recorded as skipped, with the reason, and never evaluated on other weights.

Never starving training: the worker has its own servers, reads no training queue, takes no
admission slot, and runs at most eval.max_concurrent episodes at once (its share of the envd pool).
Resumable: versions, claims and results live in Redis (broker.evals); a restarted worker takes
the versions without a result, and finished episodes of a version it was running are kept
(actors.evaluate skips them). A result names the weights it measured (weights_id, from the
manifest's sha256s): a version published again with other weights (a learner resumed from an
earlier checkpoint reuses the numbers after it) is evaluated again."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import secrets
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis

from actors.config import ActorConfig, EvalConfig
from actors.evaluate import EvalTarget, evaluate
from broker.evals import EvalBoard
from broker.keys import EVAL_CLAIM_TTL_S, Keys
from broker.registry import PolicyRegistry, ServerInfo, ServerRegistry
from common.files import atomic_write_text
from common.logs import get_logger
from inference.client import SGLangClient

log = get_logger("eval_worker")

# A checkpoint's directory from (manifest, version), every file checked against its sha256;
# raises (any exception, its message the reason) when the checkpoint is missing or corrupt.
Verify = Callable[[dict[str, Any] | None, int], Path]
# Where a recorded result goes besides Redis (metrics.jsonl and TensorBoard, from the roof).
ResultSink = Callable[[dict[str, Any]], None]


class TryFailed(Exception):
    """A try that produced no result (the version stays pending until eval.max_tries)."""


def weights_id(manifest: dict[str, Any]) -> str:
    """What a published version's weights are, from its manifest's sha256s: a learner resumed
    from an earlier checkpoint publishes the same version numbers with other weights."""
    files = sorted((manifest.get("files") or {}).items())
    return hashlib.sha256(json.dumps(files).encode()).hexdigest()[:16]


def version_dir(out_dir: str | Path, version: int) -> Path:
    return Path(out_dir) / f"v{version:06d}"


def clean(row: dict[str, Any], version: int) -> bool:
    """A results row that measures `version` and nothing else: no error, and every turn answered
    by the server at that version."""
    versions = {str(v) for v in row.get("weight_versions") or []}
    return not row.get("error") and versions == {str(version)}


def _results(path: Path) -> list[dict[str, Any]]:
    rows = []
    if path.exists():
        for line in path.read_text().splitlines():
            with contextlib.suppress(json.JSONDecodeError):
                rows.append(json.loads(line))
    return rows


def drop_rows(path: Path, keep: Callable[[dict[str, Any]], bool]) -> int:
    """Rewrite results.jsonl with the rows `keep` accepts (atomically); returns how many went."""
    rows = _results(path)
    kept = [r for r in rows if keep(r)]
    if len(kept) == len(rows):
        return 0
    atomic_write_text(path, "".join(json.dumps(r) + "\n" for r in kept))
    return len(rows) - len(kept)


class EvalWorker:
    def __init__(self, cfg: EvalConfig, actor: ActorConfig, redis: aioredis.Redis, keys: Keys,
                 rows: list[dict[str, Any]], *, out_dir: str | Path, pool_url: str, pool_token: str | None,
                 api_key: str | None, verify: Verify, tokenizer: str | None = None,
                 sink: ResultSink | None = None, owner: str | None = None) -> None:
        if cfg.every_versions < 1:
            raise ValueError("eval.every_versions: must be >= 1 for an eval worker (0 turns evaluation off)")
        if not rows:
            raise ValueError("eval.rows: the eval set is empty")
        self.cfg, self.actor, self.keys, self.rows = cfg, actor, keys, rows
        self.out_dir = Path(out_dir)
        self.pool_url, self.pool_token, self.api_key, self.tokenizer = pool_url, pool_token, api_key, tokenizer
        self.verify, self.sink = verify, sink
        self.owner = owner or f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"
        self.board = EvalBoard(redis, keys)
        self.policy = PolicyRegistry(redis, keys)
        self.servers = ServerRegistry(redis, keys)
        self.server: ServerInfo | None = None
        self._stop = asyncio.Event()
        self.keys_of_set = {f"{r['instance_id']}#{k}" for r in rows for k in range(cfg.n_samples)}

    def stop(self) -> None:
        self._stop.set()

    async def run(self) -> None:
        """Evaluate due versions until stop(); results already recorded go to the sink first (it
        keeps what it has), so a worker that died between Redis and the sink loses no row."""
        log.info("eval_worker_started", owner=self.owner, every_versions=self.cfg.every_versions,
                 tasks=len(self.rows), n_samples=self.cfg.n_samples, max_concurrent=self.cfg.max_concurrent)
        if self.sink is not None:
            for result in (await self.board.results()).values():
                self.sink(result)
        try:
            while not self._stop.is_set():
                if await self.step() is None:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._stop.wait(), self.cfg.poll_interval_s)
        finally:
            if self.server is not None:
                with contextlib.suppress(Exception):
                    await asyncio.shield(self.board.release_server(self.server.id, self.owner))
            log.info("eval_worker_stopped", owner=self.owner)

    async def step(self) -> dict[str, Any] | None:
        """Schedule what the published version makes due, then take the oldest due version and
        evaluate it (or record why not). The recorded result, or None when there was nothing to
        record (nothing due, no eval server free, or a try to run again)."""
        current = await self.policy.current()
        await self._reopen_republished()
        if current > 0:
            added = await self.board.schedule(current, self.cfg.every_versions)
            if added:
                log.info("eval_scheduled", versions=added, current=current)
        version = await self.board.take(self.owner)
        if version is None:
            return None
        done = asyncio.Event()
        keeper = asyncio.create_task(self._keep(version, done))
        try:
            result = await self.evaluate_version(version)
        except Exception as e:  # Redis or pool blips, a server gone mid-call: tried again later
            log.exception("eval_try_failed", version=version, error=repr(e))
            self.server = None
            result = None
        except BaseException:
            with contextlib.suppress(Exception):
                await asyncio.shield(self.board.release(version, self.owner))
            raise
        finally:
            done.set()
            with contextlib.suppress(BaseException):
                await asyncio.shield(keeper)
        if result is None:
            await self.board.release(version, self.owner)
            return None
        if not await self.board.record(version, self.owner, result):
            log.warning("eval_result_not_recorded", version=version, owner=self.owner,
                        why="recorded already, or another worker holds the version now")
            return None
        result = {"version": version, **result}
        log.info("eval_recorded", version=version, status=result["status"], reason=result.get("reason", ""),
                 resolve_rate=(result.get("summary") or {}).get("resolve_rate"))
        if self.sink is not None:
            self.sink(result)
        return result

    async def _reopen_republished(self) -> None:
        """A version evaluated on weights it no longer has (published again since, with other
        weights) is due again; its old episodes go."""
        for v, res in (await self.board.results()).items():
            if res.get("status") != "done" or not res.get("weights"):
                continue
            manifest = await self.policy.manifest(v)
            if manifest is None or weights_id(manifest) == res["weights"]:
                continue
            if await self.board.reopen(v, res):
                log.warning("eval_reopened_republished", version=v, was=res["weights"], now=weights_id(manifest))
                drop_rows(version_dir(self.out_dir, v) / "results.jsonl", lambda r: False)

    async def evaluate_version(self, v: int) -> dict[str, Any] | None:
        """One try at version v: its result, or None to try again later."""
        manifest = await self.policy.manifest(v)
        try:
            path = await asyncio.to_thread(self.verify, manifest, v)
        except Exception as e:
            log.warning("eval_skipped_weights_gone", version=v, reason=str(e))
            return {"status": "skipped", "reason": f"weights gone: {e}", "finished": time.time()}
        assert manifest is not None  # verify refuses a missing manifest
        step = int(manifest["step"]) if manifest.get("step") is not None else None
        server = await self._server()
        if server is None:
            log.info("eval_no_server", version=v, wanted=self.cfg.servers or "any of role eval")
            return None
        tries = await self.board.begin_try(v)
        last = tries >= self.cfg.max_tries
        client = SGLangClient(server.url, api_key=self.api_key, timeout_s=self.cfg.load_timeout_s, retries=1)
        try:
            try:
                before = await self._load(client, v, path)
            except Exception as e:
                reason = f"load on {server.id} failed: {type(e).__name__}: {e}"[:500]
                log.warning("eval_load_failed", version=v, server=server.id, tries=tries, error=reason)
                self.server = None  # look for a server again (this one may be gone)
                return {"status": "failed", "reason": reason, "step": step, "tries": tries,
                        "finished": time.time()} if last else None
            out = version_dir(self.out_dir, v)
            started = time.time()
            target = EvalTarget(server.url, self.api_key, self.pool_url, self.pool_token, self.tokenizer)
            summary = await evaluate(self.rows, target, out, self.actor, self.cfg.max_concurrent,
                                     self.cfg.n_samples, seed=self.cfg.seed)
            finished = time.time()
            after = await self._version_of(client)
        finally:
            await client.aclose()
        rows = [r for r in _results(out / "results.jsonl") if r.get("key") in self.keys_of_set]
        other = [r for r in rows if not r.get("error") and not clean(r, v)]
        errors = [r for r in rows if r.get("error")]
        turn_versions = sorted({str(x) for r in rows for x in r.get("weight_versions") or []})
        if other or (errors and not last):
            # Not a measurement of v alone: those episodes go, and run again on a fresh load.
            drop_rows(out / "results.jsonl", lambda r: r.get("key") not in self.keys_of_set or clean(r, v))
            log.warning("eval_episodes_rerun", version=v, tries=tries, other_version=len(other),
                        errors=len(errors), turn_versions=turn_versions)
            if not last:
                return None
            return {"status": "failed", "step": step, "tries": tries, "server": server.id,
                    "reason": f"{len(other)} episode(s) had turns at versions {turn_versions}, not {v}",
                    "finished": finished}
        return {"status": "done", "step": step, "tries": tries, "server": server.id, "weights": weights_id(manifest),
                "weight_version_before": before, "weight_version_after": after,
                "turn_versions": turn_versions, "summary": summary, "started": started,
                "finished": finished, "out_dir": str(out)}

    async def _load(self, client: SGLangClient, v: int, path: Path) -> str:
        """Load v's checkpoint into the eval server; the version /model_info reports after it
        (must be str(v))."""
        async with asyncio.timeout(self.cfg.load_timeout_s):
            ans = await client.update_weights_from_disk(model_path=str(path), weight_version=str(v))
            if isinstance(ans, dict) and ans.get("success") is False:
                raise TryFailed(f"update_weights_from_disk: {ans.get('message')}")
            got = await self._version_of(client)
        if got != str(v):
            raise TryFailed(f"the server reports weight_version {got!r} after loading {v}")
        return got

    @staticmethod
    async def _version_of(client: SGLangClient) -> str:
        info = await client.model_info()
        return str(info.get("weight_version")) if isinstance(info, dict) else ""

    async def _server(self) -> ServerInfo | None:
        """The eval server this worker holds, or a free one it can claim."""
        live = {s.id: s for s in await self.servers.list(alive_only=True, role="eval")
                if s.state == "ready" and (not self.cfg.servers or s.id in self.cfg.servers)}
        if self.server is not None:
            if self.server.id in live and await self.board.claim_server(self.server.id, self.owner):
                self.server = live[self.server.id]
                return self.server
            with contextlib.suppress(Exception):
                await self.board.release_server(self.server.id, self.owner)
            self.server = None
        for s in live.values():
            if await self.board.claim_server(s.id, self.owner):
                log.info("eval_server_claimed", server=s.id, url=s.url, owner=self.owner)
                self.server = s
                return s
        return None

    async def _keep(self, version: int, done: asyncio.Event) -> None:
        """Renew the version's claim, and the server's, until the try ends."""
        every = EVAL_CLAIM_TTL_S / 4
        while not done.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(done.wait(), every)
            if done.is_set():
                return
            with contextlib.suppress(Exception):
                if not await self.board.renew(version, self.owner):
                    log.warning("eval_claim_lost", version=version, owner=self.owner)
                if self.server is not None:
                    await self.board.claim_server(self.server.id, self.owner)
