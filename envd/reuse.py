"""Reused containers (envd.reuse_per_image): a container whose lease ended is reset to its
image's state and handed to a later create of the same image that allows it — the pool's
leases, never the container a patch is graded in (docs/security.md: grading is fresh).

The reset trusts nothing the episode left:
1. **Processes**: the container is restarted (SIGKILL to its init, then started): the kernel ends
   every process of its pid namespace, and the start makes new /dev, /dev/shm, IPC and writes
   /etc/hosts and /etc/hostname again. Killing processes from inside would not do: the episode's root could ptrace the
   survivor it was meant to keep.
2. **Files outside the repository**: Docker's own view of the writable layer (`docker diff`)
   outside the repository must equal the one recorded when the image's first container was
   fresh; anything else (a file in /tmp, $HOME, site-packages, under /usr) and the container
   is destroyed. Docker's view misses a directory whose owner alone changed (chown keeping
   its mode, size and mtime): no file, and `reuse_max_uses` bounds how long one container lives.
3. **The repository** (the lease's cwd) is not reset with git, whose config and hooks the episode
   could have written (code that would run in the reset): it is deleted and restored from the
   archive taken of the fresh container, then its manifest (every entry's type, mode, owner,
   size and link target, every file's sha256, and /etc/hosts and resolv.conf, which Docker mounts
   outside its view or, without its network stack, the container's first process writes at each
   start) must equal the fresh container's, and /etc/hostname hold its own hostname.
Any failure destroys the container; the next create makes a fresh one. Ready containers hold no
lease: a crash leaves them to the next start-up's orphan sweep.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from common.logs import get_logger

log = get_logger("envd.reuse")

BASELINES_MAX = 256  # images whose fresh state is remembered (least recently used forgotten)
# the manifest of a repository (a directory's size is the filesystem's, not its content), then the
# files Docker writes into a container and mounts over the image's (without its network stack, the
# /etc/hosts the container's first process wrote, envd.network_disabled): the same for every container
# of a node but /etc/hostname, which must hold the container's own hostname
MANIFEST = ('cd / && { find "$1" -type d -printf "%y %m %U %G %p\\n"; '
            'find "$1" ! -type d -printf "%y %m %U %G %s %p -> %l\\n"; } | LC_ALL=C sort && '
            'find "$1" -type f -print0 | LC_ALL=C sort -z | xargs -0r sha256sum && '
            'sha256sum /etc/hosts /etc/resolv.conf && cat /etc/hostname')


class ResetError(Exception):
    """Why a container cannot be reused (it is destroyed)."""


@dataclass(frozen=True)
class Baseline:
    """An image's fresh container, as the reset must find it again."""

    image_id: str
    cwd: str
    outside: frozenset[tuple[int, str]]  # docker diff entries (kind, path) outside cwd
    archive: bytes                       # the repository (get_archive of cwd)
    manifest: str


class Ops(Protocol):
    """The blocking Docker operations a reset needs (envd.docker_backend.DockerBackend)."""

    def inspect(self, cid: str) -> dict[str, Any]: ...
    def changes(self, cid: str) -> list[tuple[int, str]]: ...
    def snapshot(self, cid: str, path: str, max_bytes: int) -> bytes | None: ...
    def restart(self, cid: str) -> None: ...
    def settle(self, cid: str) -> None: ...
    def restore(self, cid: str, path: str, archive: bytes) -> None: ...
    def run(self, cid: str, argv: list[str]) -> tuple[int, str]: ...


def under(path: str, cwd: str) -> bool:
    return path == cwd or path.startswith(cwd.rstrip("/") + "/")


def repo_dir(cwd: str) -> str:
    """The repository a reset restores: an absolute path below /, normalised; else ResetError."""
    parts = [p for p in cwd.split("/") if p]
    if not cwd.startswith("/") or not parts or any(p in (".", "..") for p in parts):
        raise ResetError(f"cwd {cwd!r} is not a directory below / (the repository a reset restores)")
    return "/" + "/".join(parts)


def manifest(ops: Ops, cid: str, cwd: str) -> str:
    """The repository's manifest, the mounted /etc files' digests, and the hostname file checked
    against the container's hostname (left out: it differs from container to container)."""
    code, out = ops.run(cid, ["sh", "-c", MANIFEST, "sh", cwd])
    if code != 0:
        raise ResetError(f"the manifest of {cwd} failed ({code}): {out[-300:]}")
    body, _, hostname = out.rstrip("\n").rpartition("\n")
    expected = str(ops.inspect(cid).get("Config", {}).get("Hostname", ""))
    if hostname != expected:
        raise ResetError(f"/etc/hostname holds {hostname[:80]!r}, not the container's hostname {expected!r}")
    return body


def capture(ops: Ops, cid: str, cwd: str, max_bytes: int) -> Baseline:
    """The fresh container's state (nothing ran in it yet): what each reset must restore."""
    info = ops.inspect(cid)
    ops.settle(cid)
    if info.get("Mounts"):
        raise ResetError("the container has mounts (image volumes), which docker diff does not see")
    outside = frozenset(c for c in ops.changes(cid) if not under(c[1], cwd))
    archive = ops.snapshot(cid, cwd, max_bytes)
    if archive is None:
        raise ResetError(f"the repository {cwd} is larger than envd.reuse_max_repo_bytes ({max_bytes})")
    return Baseline(str(info["Image"]), cwd, outside, archive, manifest(ops, cid, cwd))


def reset(ops: Ops, cid: str, base: Baseline) -> None:
    """Bring a used container back to `base` (see the module docstring), or raise ResetError."""
    if str(ops.inspect(cid).get("Image")) != base.image_id:
        raise ResetError("the container runs another image than the baseline's")
    ops.restart(cid)
    ops.settle(cid)
    outside = frozenset(c for c in ops.changes(cid) if not under(c[1], base.cwd))
    if outside != base.outside:
        extra = sorted(p for _, p in outside ^ base.outside)
        raise ResetError(f"{len(extra)} change(s) outside {base.cwd}: {', '.join(extra[:5])}")
    # the filesystem outside the repository is the image's now: its rm and sh can be trusted
    code, out = ops.run(cid, ["rm", "-rf", "--", base.cwd])
    if code != 0:
        raise ResetError(f"could not remove {base.cwd} ({code}): {out[-300:]}")
    ops.restore(cid, base.cwd, base.archive)
    now = manifest(ops, cid, base.cwd)
    if now != base.manifest:
        diff = sorted(set(now.splitlines()) ^ set(base.manifest.splitlines()))
        raise ResetError(f"{base.cwd} differs from the fresh container's after the restore: {diff[:4]}")


@dataclass
class Ready:
    id: str
    name: str
    labels: dict[str, str]  # the Docker labels it was created with (a started container's are fixed)
    uses: int               # leases it served
    since: float = 0.0


class ReusePool:
    """Reset containers per (image, cwd), bounded per image and in all, each used at most
    `max_uses` times; those no create took within `idle_s` are destroyed."""

    def __init__(self, per_image: int, max_total: int, max_uses: int, idle_s: float,
                 reset_one: Callable[[str, Baseline], Awaitable[None]],
                 destroy: Callable[[str, str], Awaitable[Any]],
                 on_reset: Callable[[bool, float], None] | None = None) -> None:
        self.per_image, self.max_total, self.max_uses, self.idle_s = per_image, max_total, max_uses, idle_s
        self._reset_one, self._destroy, self._on_reset = reset_one, destroy, on_reset
        self.ready: dict[tuple[str, str], list[Ready]] = {}
        self.baselines: OrderedDict[tuple[str, str], Baseline] = OrderedDict()
        self._resets: set[asyncio.Future[Any]] = set()
        self._closing = False

    @property
    def enabled(self) -> bool:
        return self.per_image > 0 and self.max_total > 0 and self.max_uses > 1

    def count(self) -> int:
        return sum(len(v) for v in self.ready.values())

    def baseline(self, image: str, cwd: str) -> Baseline | None:
        base = self.baselines.get((image, cwd))
        if base is not None:
            self.baselines.move_to_end((image, cwd))
        return base

    def remember(self, image: str, cwd: str, base: Baseline) -> None:
        self.baselines[(image, cwd)] = base
        self.baselines.move_to_end((image, cwd))
        while len(self.baselines) > BASELINES_MAX:
            self.baselines.popitem(last=False)

    def take(self, image: str, cwd: str, image_id: str | None) -> Ready | None:
        """A reset container of `image` for `cwd` (the oldest), or None. `image_id`: what the
        name resolves to now; a name moved to another image drops what was kept for it."""
        base = self.baselines.get((image, cwd))
        if base is not None and base.image_id != image_id:
            self.baselines.pop((image, cwd), None)
            for r in self.ready.pop((image, cwd), []):
                self._spawn(self._destroy(r.id, "reuse_stale"))
            return None
        got = self.ready.get((image, cwd))
        return got.pop(0) if got else None

    def give_back(self, used: Ready, image: str, cwd: str) -> bool:
        """A container whose lease ended: reset it in the background and keep it (True), or
        False when it is not to be kept (the caller destroys it)."""
        key = (image, cwd)
        base = self.baselines.get(key)
        if (self._closing or base is None or used.uses >= self.max_uses
                or len(self.ready.get(key, [])) >= self.per_image
                or self.count() + len(self._resets) >= self.max_total):
            return False
        self._spawn(self._recycle(used, key, base))
        return True

    def _spawn(self, coro: Awaitable[Any]) -> None:
        task: asyncio.Future[Any] = asyncio.ensure_future(coro)
        self._resets.add(task)
        task.add_done_callback(self._resets.discard)

    async def _recycle(self, used: Ready, key: tuple[str, str], base: Baseline) -> None:
        t0, cid = time.monotonic(), used.id
        try:
            await self._reset_one(cid, base)
        except Exception as e:  # ResetError, or Docker failing under it: never reused
            log.info("reset_refused", container_id=cid[:12], image=key[0], reason=str(e)[:500])
            with contextlib.suppress(Exception):
                await self._destroy(cid, "reset_failed")
            self._reset_ended(False, t0)
            return
        if self._closing:
            await self._destroy(cid, "shutdown")
        else:
            used.since = time.monotonic()
            self.ready.setdefault(key, []).append(used)
        self._reset_ended(True, t0)

    def _reset_ended(self, ok: bool, t0: float) -> None:
        if self._on_reset:  # counted once the container is kept or gone
            self._on_reset(ok, time.monotonic() - t0)

    async def sweep(self) -> None:
        """Destroy the containers kept longer than `idle_s` without a create taking them."""
        now = time.monotonic()
        for key in list(self.ready):
            keep = [r for r in self.ready[key] if now - r.since <= self.idle_s]
            for r in self.ready[key]:
                if r not in keep:
                    with contextlib.suppress(Exception):
                        await self._destroy(r.id, "reuse_idle")
            self.ready[key] = keep

    async def close(self) -> None:
        """Let resets under way finish (and destroy what they made), destroy the rest."""
        self._closing = True
        await asyncio.gather(*self._resets, return_exceptions=True)
        ready, self.ready = [r for v in self.ready.values() for r in v], {}
        await asyncio.gather(*(self._destroy(r.id, "shutdown") for r in ready), return_exceptions=True)
