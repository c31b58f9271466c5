"""Task images on one node: pull on demand from a registry, and keep the image store in budget.

- `ensure(image)`: present -> nothing to do; missing -> pull it. One pull per image however many
  creates wait for it (single-flight), at most `envd.max_concurrent_pulls` pulls at once, each
  bounded by `envd.pull_timeout_s` (a silent progress stream fails after `envd.pull_stall_s`;
  the stream is read with httpx, since docker-py reads a pull's stream without a timeout).
  Progress goes to the log every `envd.pull_log_interval_s` and to /metrics as it downloads.
  A failed pull raises PullFailed naming the image, the reference and the reason.
- Names without a registry host (or naming docker.io) are pulled from `envd.registry` when set
  and tagged back under the requested name; credentials come from the config or Docker's own
  config.json (docker-py reads it); they are never logged.
- The budget (`envd.image_budget`) is on the engine's image store as `docker system df` counts
  it (layers once). Over it, the task images envd manages (pulled or run here, in its
  ImageIndex record) are removed least recently used first, never one a container uses or one
  being pulled or created, never one matching `envd.image_keep` (base images).
"""

from __future__ import annotations

import asyncio
import contextlib
import fnmatch
import json
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import anyio.to_thread
import docker
import docker.auth
import docker.errors
import httpx

from common.logs import get_logger
from envd.config import EnvdConfig
from envd.image_index import ImageIndex
from envd.metrics import EnvdMetrics

log = get_logger("envd.images")
DOCKER_HUB = {"docker.io", "index.docker.io", "registry-1.docker.io"}


class PullFailed(Exception):
    """The image could not be pulled (registry down, unknown image, timeout): infrastructure."""


class NotPullable(LookupError):
    """Missing, and its name names no registry while envd.registry is unset (-> 404)."""


@dataclass
class PullInfo:
    image: str
    pulled: bool          # False: it was here already
    seconds: float = 0.0  # this caller's wait for the image (0 when present)
    bytes: int = 0        # downloaded by the pull it waited for
    joined: bool = False  # it waited for a pull another create had started


def split_name(image: str) -> tuple[str | None, str]:
    """(registry host or None, the rest) of a Docker image name."""
    first, sep, rest = image.partition("/")
    if sep and ("." in first or ":" in first or first == "localhost"):
        return first, rest
    return None, image


def pull_reference(image: str, registry: str | None) -> str | None:
    """What to pull for `image`: from `registry` when the name has no host or names Docker Hub;
    as named when it names a host; None (nothing to pull from) for a bare name without registry."""
    host, rest = split_name(image)
    if registry and (host is None or host in DOCKER_HUB):
        return f"{registry.rstrip('/')}/{rest}"
    return image if host is not None else None


def engine_http(docker_url: str) -> httpx.AsyncClient:
    """An HTTP client of the Docker engine API (unix socket or tcp), for streaming a pull with a
    read timeout of our own: docker-py's pull reads its stream without any."""
    if docker_url.startswith("unix://"):
        return httpx.AsyncClient(transport=httpx.AsyncHTTPTransport(uds=docker_url[len("unix://"):]),
                                 base_url="http://docker")
    if docker_url.startswith(("tcp://", "http://", "https://")):
        return httpx.AsyncClient(base_url=docker_url.replace("tcp://", "http://", 1))
    raise ValueError(f"envd pulls over unix:// or tcp:// Docker URLs, not {docker_url!r}")


def _repo_tag(ref: str) -> tuple[str, str | None]:
    if "@" in ref:
        return ref, None  # by digest
    name, sep, tag = ref.rpartition(":")
    if sep and "/" not in tag:
        return name, tag
    return ref, "latest"


class ImageCache:
    def __init__(self, cfg: EnvdConfig, docker_url: str, index: ImageIndex, metrics: EnvdMetrics) -> None:
        self.cfg = cfg
        self.index = index
        self.metrics = metrics
        self.api = docker.APIClient(base_url=docker_url, timeout=max(1, int(cfg.create_timeout_s)))
        self.http = engine_http(docker_url)  # the pull stream itself
        self._slots = asyncio.Semaphore(cfg.max_concurrent_pulls)
        self._flights: dict[str, asyncio.Task[PullInfo]] = {}
        self._holds: Counter[str] = Counter()  # images a create is using right now
        self._gc_lock = asyncio.Lock()
        self._gc_task: asyncio.Task[None] | None = None
        self._gc_runs: set[asyncio.Task[None]] = set()  # referenced until done (asyncio keeps weak refs)
        self._progress: dict[str, dict[str, Any]] = {}

    # -- lifecycle -----------------------------------------------------------------
    async def start(self) -> None:
        present = await self._thread(self._tags)
        await self.index.sync(present)
        if self.cfg.image_budget:
            self._gc_task = asyncio.create_task(self._gc_loop(), name="envd-image-gc")
        log.info("images_ready", images=len(present), registry=self.cfg.registry or "(names as given)",
                 budget_bytes=int(self.cfg.image_budget))

    async def stop(self) -> None:
        if self._gc_task:
            self._gc_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._gc_task
        for task in list(self._flights.values()):
            task.cancel()
        await self.http.aclose()
        self.api.close()

    @staticmethod
    async def _thread(fn: Callable[..., Any], *args: Any) -> Any:
        return await anyio.to_thread.run_sync(fn, *args)

    # -- use -------------------------------------------------------------------------
    @contextlib.contextmanager
    def hold(self, image: str) -> Iterator[None]:
        """While a create uses `image` (pull + create), the budget leaves it alone."""
        self._holds[image] += 1
        try:
            yield
        finally:
            self._holds[image] -= 1
            if self._holds[image] <= 0:
                del self._holds[image]

    async def used(self, image: str) -> None:
        """A container was made from `image`: its LRU time is now (names only, not ids)."""
        if not image.startswith("sha256:"):
            await self.index.used(image)

    async def ensure(self, image: str) -> PullInfo:
        """Make sure `image` is on this node; PullFailed when it cannot be pulled."""
        if await self._thread(self._present, image):
            return PullInfo(image, pulled=False)
        if pull_reference(image, self.cfg.registry) is None:
            raise NotPullable(f"unknown image {image} (not on this node, and no envd.registry to pull "
                              "it from: set one, or build or load the image here)")
        t0 = time.monotonic()
        task = self._flights.get(image)
        joined = task is not None
        if task is None:
            task = self._flights[image] = asyncio.create_task(self._pull(image), name=f"pull {image}")
            task.add_done_callback(lambda t: self._landed(image, t))
        else:
            self.metrics.pull_waiters.inc()
        try:
            # shielded: a caller that gives up (timeout, disconnect) leaves the pull to the others
            info = await asyncio.wait_for(asyncio.shield(task), self.cfg.pull_timeout_s + 5)
        except TimeoutError:
            raise PullFailed(f"pull of {image} did not finish within {self.cfg.pull_timeout_s:g}s") from None
        return PullInfo(image, pulled=info.pulled, seconds=time.monotonic() - t0, bytes=info.bytes,
                        joined=joined)

    def _landed(self, image: str, task: asyncio.Task[PullInfo]) -> None:
        self._flights.pop(image, None)
        if not task.cancelled():
            task.exception()  # retrieved: every waiter may have given up already (it is logged)

    async def _pull(self, image: str) -> PullInfo:
        ref = pull_reference(image, self.cfg.registry)
        assert ref is not None  # ensure() checked
        t0 = time.monotonic()
        deadline = t0 + self.cfg.pull_timeout_s
        result = "failed"
        try:
            async with self._slots:
                if await self._thread(self._present, image):  # arrived while waiting for a slot
                    result = "present"
                    return PullInfo(image, pulled=False)
                self.metrics.pulls_running.inc()
                try:
                    log.info("pull_started", image=image, reference=ref)
                    try:
                        nbytes = await asyncio.wait_for(self._pull_stream(image, ref),
                                                        max(0.0, deadline - time.monotonic()))
                    except TimeoutError:
                        raise PullFailed(f"pull of {image} from {ref} did not finish within "
                                         f"{self.cfg.pull_timeout_s:g}s") from None
                    await self._thread(self._tag_as, image, ref)
                    # logged while the slot is held: a pull waiting for it starts (and logs) after
                    seconds = time.monotonic() - t0
                    log.info("pull_done", image=image, reference=ref, seconds=round(seconds, 2),
                             mb=round(nbytes / 1e6, 1))
                finally:
                    self.metrics.pulls_running.dec()
            await self.index.arrived(image)
            result = "ok"
            self.metrics.pull_seconds.observe(seconds)
            if self.cfg.image_budget:
                gc = asyncio.create_task(self._gc_once(), name="envd-image-gc-after-pull")
                self._gc_runs.add(gc)
                gc.add_done_callback(self._gc_runs.discard)
            return PullInfo(image, pulled=True, seconds=seconds, bytes=nbytes)
        except PullFailed as e:
            result = "timeout" if "within" in str(e) else "failed"
            log.warning("pull_failed", image=image, reference=ref, error=str(e))
            raise
        finally:
            if result != "present":
                self.metrics.pulls.labels(result).inc()
            self._progress.pop(image, None)
            if result not in ("ok", "present"):
                with contextlib.suppress(Exception):
                    await self.index.pull_failed(image)

    def _present(self, image: str) -> bool:
        try:
            self.api.inspect_image(image)
            return True
        except docker.errors.ImageNotFound:
            return False
        except docker.errors.NotFound:
            return False

    def _tags(self) -> set[str]:
        return {t for img in self.api.images() for t in (img.get("RepoTags") or []) if t != "<none>:<none>"}

    def _auth_header(self, repo: str) -> str | None:
        """X-Registry-Auth for `repo`: the configured user, else Docker's config.json (what
        docker-py would send), else none (an anonymous pull)."""
        if self.cfg.registry_username:
            return docker.auth.encode_header({"username": self.cfg.registry_username,
                                              "password": self.cfg.registry_password or ""}).decode()
        registry, _ = docker.auth.resolve_repository_name(repo)
        header = docker.auth.get_config_header(self.api, registry)
        return header.decode() if isinstance(header, bytes) else header

    async def _pull_stream(self, image: str, ref: str) -> int:
        """Pull `ref` through the engine's API, counting progress; the bytes downloaded. A stream
        silent for envd.pull_stall_s fails (httpx's read timeout)."""
        repo, tag = _repo_tag(ref)
        params = {"fromImage": repo, **({"tag": tag} if tag else {})}
        header = await self._thread(self._auth_header, repo)
        headers = {"X-Registry-Auth": header} if header else {}
        current: dict[str, int] = {}
        total: dict[str, int] = {}
        counted = 0
        last_log = time.monotonic()
        progress = self._progress[image] = {"reference": ref, "started": time.time(), "bytes": 0,
                                            "total": 0, "layers": 0}
        timeout = httpx.Timeout(30.0, read=self.cfg.pull_stall_s)
        try:
            async with self.http.stream("POST", "/images/create", params=params, headers=headers,
                                        timeout=timeout) as r:
                if r.status_code >= 400:
                    body = (await r.aread()).decode(errors="replace")
                    with contextlib.suppress(ValueError):
                        body = json.loads(body).get("message", body)
                    raise PullFailed(f"pull of {image} from {ref} failed: {body.strip()[:500]}")
                async for line in r.aiter_lines():
                    if not line.strip():
                        continue
                    ev = json.loads(line)
                    if ev.get("error"):
                        raise PullFailed(f"pull of {image} from {ref} failed: {ev['error']}")
                    layer, status = ev.get("id"), ev.get("status", "")
                    detail = ev.get("progressDetail") or {}
                    if layer and status == "Downloading" and "current" in detail:
                        current[layer] = int(detail["current"])
                        total[layer] = int(detail.get("total") or 0)
                    elif layer and status in ("Download complete", "Pull complete") and layer in total:
                        current[layer] = max(current.get(layer, 0), total[layer])
                    got = sum(current.values())
                    if got > counted:
                        self.metrics.pull_bytes.inc(got - counted)
                        counted = got
                    progress.update(bytes=got, total=sum(total.values()), layers=len(total))
                    now = time.monotonic()
                    if now - last_log >= self.cfg.pull_log_interval_s:
                        last_log = now
                        log.info("pull_progress", image=image, mb=round(got / 1e6, 1),
                                 of_mb=round(sum(total.values()) / 1e6, 1), layers=len(total))
        except httpx.ReadTimeout:
            raise PullFailed(f"pull of {image} from {ref} failed: no progress for "
                             f"{self.cfg.pull_stall_s:g}s") from None
        except httpx.HTTPError as e:
            raise PullFailed(f"pull of {image} from {ref} failed: {type(e).__name__}: {e}") from None
        except ValueError as e:  # a line that is not JSON
            raise PullFailed(f"pull of {image} from {ref} failed: bad progress stream: {e}") from None
        return counted

    def _tag_as(self, image: str, ref: str) -> None:
        """After the pull: the image is there, under the requested name only."""
        if not self._present(ref):
            raise PullFailed(f"pull of {image} from {ref} ended without the image")
        if ref != image:
            r, t = _repo_tag(image)
            self.api.tag(ref, r, t)
            with contextlib.suppress(docker.errors.APIError):
                self.api.remove_image(ref)  # only the tag: the image keeps its requested name

    def pulls(self) -> dict[str, dict[str, Any]]:
        """Pulls running now: image -> reference, started, bytes, total, layers."""
        return {k: dict(v) for k, v in self._progress.items()}

    # -- disk budget -----------------------------------------------------------------
    async def _gc_loop(self) -> None:
        while True:
            await asyncio.sleep(self.cfg.image_gc_interval_s)
            await self._gc_once()

    async def _gc_once(self) -> None:
        try:
            await self.enforce_budget()
        except Exception as e:  # keep checking whatever one round hit
            log.error("image_gc_failed", error=repr(e))

    def _disk_bytes(self) -> int:
        return int(self.api.df().get("LayersSize") or 0)

    def _in_use_ids(self) -> set[str]:
        return {c.get("ImageID", "") for c in self.api.containers(all=True)}

    def _image_id(self, image: str) -> str | None:
        try:
            return str(self.api.inspect_image(image)["Id"])
        except docker.errors.NotFound:
            return None

    def _remove(self, image: str) -> str | None:
        """Remove one image; None when done (or gone already), else why not."""
        try:
            self.api.remove_image(image)
            return None
        except docker.errors.NotFound:
            return None
        except docker.errors.APIError as e:  # 409: a container uses it after all
            return str(e.explanation or e)

    def _protected(self, image: str) -> bool:
        return any(fnmatch.fnmatchcase(image, pat) for pat in self.cfg.image_keep)

    async def enforce_budget(self) -> list[str]:
        """Remove LRU unused task images until the image store is within budget; the removed."""
        budget = int(self.cfg.image_budget)
        evicted: list[str] = []
        if not budget:
            return evicted
        async with self._gc_lock:
            used = await self._thread(self._disk_bytes)
            self.metrics.image_disk_bytes.set(used)
            if used <= budget:
                return evicted
            lru = sorted((await self.index.last_used()).items(), key=lambda kv: kv[1])
            for image, last in lru:
                if used <= budget:
                    break
                if self._protected(image) or image in self._holds or image in self._flights:
                    continue
                image_id = await self._thread(self._image_id, image)
                if image_id is None:  # gone behind envd's back
                    await self.index.left(image)
                    continue
                if image_id in await self._thread(self._in_use_ids) or image in self._holds:
                    continue
                why = await self._thread(self._remove, image)
                if why is not None:
                    log.info("image_not_evicted", image=image, reason=why)
                    continue
                await self.index.left(image)
                before, used = used, await self._thread(self._disk_bytes)
                self.metrics.evictions.inc()
                self.metrics.image_disk_bytes.set(used)
                evicted.append(image)
                log.info("image_evicted", image=image, idle_s=round(time.time() - last, 1),
                         freed_mb=round((before - used) / 1e6, 1), disk_mb=round(used / 1e6, 1),
                         budget_mb=round(budget / 1e6, 1))
            if used > budget:
                log.warning("image_budget_exceeded", disk_mb=round(used / 1e6, 1),
                            budget_mb=round(budget / 1e6, 1),
                            note="every other image is in use, protected or not envd's")
        return evicted
