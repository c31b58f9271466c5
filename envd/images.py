"""Local building of the bundled task images (which image a row runs in: its dataset adapter, swe.adapters).

No registry is reachable, so the bundled tasks' images are built here from Debian packages:
a base rootfs made once by debootstrap (`swarl/base:bookworm`), then one image per task with
the task's repository committed at /testbed (fixed git identity and date, so the commit sha
equals the row's base_commit). Each image carries a content-hash label; a rebuild is skipped
when the label already matches.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import re
import shutil
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from common.files import machine_lock
from common.logs import get_logger
from swe.harness import image_for
from swe.tasks import load_tasks, task_files
from swe.tasks.gitrepo import GIT_ENV

if TYPE_CHECKING:  # docker is heavy to import; commands import it when they run
    import docker

log = get_logger("images")

BASE_IMAGE = "swarl/base:bookworm"
BASE_SUITE = "bookworm"
BASE_PACKAGES = ["git", "python3", "python3-pytest", "patch", "procps", "coreutils", "ca-certificates"]
DEFAULT_MIRROR = "http://deb.debian.org/debian"
# Bump when the way an image is built changes, so cached images get rebuilt.
RECIPE_VERSION = "1"
LABEL_TASK = "swarl.task"
LABEL_HASH = "swarl.content_hash"
IMAGE_ENV = [
    "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "LANG=C.UTF-8",
    "PYTHONDONTWRITEBYTECODE=1",
    "PAGER=cat",
]

# --- base image -------------------------------------------------------------------------------

def debian_mirror(sources_dir: str | os.PathLike[str] = "/etc/apt") -> str:
    """The Debian mirror apt uses (deb822 .sources or one-line sources.list); SWARL_DEBIAN_MIRROR wins."""
    env = os.environ.get("SWARL_DEBIAN_MIRROR")
    if env:
        return env
    root = Path(sources_dir)
    files = [*sorted((root / "sources.list.d").glob("*.sources")), root / "sources.list"]
    files += sorted((root / "sources.list.d").glob("*.list"))
    for f in files:
        if not f.is_file():
            continue
        text = f.read_text(errors="replace")
        if f.suffix == ".sources":
            for stanza in re.split(r"\n\s*\n", text):
                fields = dict(re.findall(r"^(\w[\w-]*):\s*(.*)$", stanza, flags=re.M))
                suites = fields.get("Suites", "").split()
                if "deb" in fields.get("Types", "").split() and BASE_SUITE in suites:
                    return fields.get("URIs", "").split()[0]
        else:
            for line in text.splitlines():
                m = re.match(r"^deb\s+(?:\[[^\]]*\]\s+)?(\S+)\s+(\S+)", line.strip())
                if m and m.group(2) == BASE_SUITE:
                    return m.group(1)
    return DEFAULT_MIRROR


def _image_labels(client: docker.DockerClient, name: str) -> dict[str, str] | None:
    import docker.errors

    try:
        img = client.images.get(name)
    except docker.errors.ImageNotFound:
        return None
    return dict(img.labels or {})


def ensure_base_image(client: docker.DockerClient, force: bool = False) -> str:
    """`swarl/base:bookworm`: debootstrap (minbase) once, `docker import`, then cached (rebuilt
    when its content-hash label no longer matches the package list and recipe)."""
    return ensure_debian_image(client, BASE_IMAGE, BASE_PACKAGES, force=force)


def ensure_debian_image(client: docker.DockerClient, image: str, packages: list[str], force: bool = False) -> str:
    """`image` as debootstrap (minbase) of BASE_SUITE with `packages`, imported once and then
    cached by a content-hash label (suite, packages, recipe)."""
    want = debian_content_hash(packages)
    lock = "base-image" if image == BASE_IMAGE else f"debian-image-{re.sub(r'[^A-Za-z0-9]+', '_', image)}"
    with machine_lock(lock):
        labels = _image_labels(client, image)
        if not force and labels is not None and labels.get(LABEL_HASH) == want:
            return image  # cached: same suite, packages and recipe
        debootstrap = shutil.which("debootstrap")
        if debootstrap is None:
            raise RuntimeError("debootstrap not found: run `make setup` (apt-get install debootstrap)")
        mirror = debian_mirror()
        t0 = time.monotonic()
        log.info("building a Debian image with debootstrap", image=image, mirror=mirror, packages=",".join(packages))
        with tempfile.TemporaryDirectory(prefix="swarl-rootfs-") as tmp:
            rootfs = Path(tmp) / "rootfs"
            cmd = [debootstrap, "--variant=minbase", f"--include={','.join(packages)}",
                   BASE_SUITE, str(rootfs), mirror]
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
            if proc.returncode != 0:
                tail = (proc.stdout + proc.stderr)[-2000:]
                raise RuntimeError(f"debootstrap failed (exit {proc.returncode}):\n{tail}")
            # Slim the image: apt caches and docs are not needed to run tests.
            for sub in ("var/cache/apt/archives", "var/lib/apt/lists", "usr/share/doc",
                        "usr/share/man", "usr/share/locale"):
                shutil.rmtree(rootfs / sub, ignore_errors=True)
            tar_path = Path(tmp) / "rootfs.tar"
            subprocess.run(["tar", "-C", str(rootfs), "--numeric-owner", "-cf", str(tar_path), "."],
                           check=True, timeout=600)
            changes = [f"ENV {e}" for e in IMAGE_ENV] + ['CMD ["sleep", "infinity"]', f"LABEL {LABEL_HASH}={want}"]
            repo, tag = image.rsplit(":", 1)
            client.api.import_image_from_file(str(tar_path), repository=repo, tag=tag, changes=changes)
        if _image_labels(client, image) is None:
            raise RuntimeError(f"docker import did not produce {image}")
        log.info("Debian image built", image=image, seconds=round(time.monotonic() - t0, 1))
        return image


def base_content_hash() -> str:
    return debian_content_hash(BASE_PACKAGES)


def debian_content_hash(packages: list[str]) -> str:
    return hashlib.sha256(f"{BASE_SUITE}|{','.join(packages)}|{RECIPE_VERSION}".encode()).hexdigest()[:16]


# --- task images ------------------------------------------------------------------------------

def _tar_of(files: dict[str, str], root: str = "testbed") -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        dirs: set[str] = set()
        for rel in sorted(files):
            parts = rel.split("/")[:-1]
            for i in range(len(parts)):
                dirs.add("/".join(parts[: i + 1]))
        for d in ["", *sorted(dirs)]:
            info = tarfile.TarInfo(f"{root}/{d}".rstrip("/"))
            info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o755, 0
            tar.addfile(info)
        for rel in sorted(files):
            data = files[rel].encode()
            info = tarfile.TarInfo(f"{root}/{rel}")
            info.size, info.mode, info.mtime = len(data), 0o644, 0
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def task_content_hash(files: dict[str, str], base_image_id: str) -> str:
    h = hashlib.sha256(f"{RECIPE_VERSION}|{base_image_id}".encode())
    for rel in sorted(files):
        h.update(rel.encode() + b"\0" + files[rel].encode() + b"\0")
    return h.hexdigest()[:16]


def _exec(container: Any, cmd: str, env: dict[str, str] | None = None) -> str:
    res = container.exec_run(["bash", "-lc", cmd], workdir="/testbed", environment=env or {})
    out = res.output.decode(errors="replace") if res.output else ""
    if res.exit_code != 0:
        raise RuntimeError(f"`{cmd}` failed in the build container (exit {res.exit_code}): {out[-1500:]}")
    return out


def build_task_image(client: docker.DockerClient, task: dict[str, Any], force: bool = False) -> tuple[str, bool]:
    """Build one task's image; returns (image, built) — built is False when the cache hit."""
    image = image_for(task)
    files = task_files(task["instance_id"])
    base_id = client.images.get(BASE_IMAGE).id
    content_hash = task_content_hash(files, base_id)
    labels = _image_labels(client, image)
    if not force and labels is not None and labels.get(LABEL_HASH) == content_hash:
        return image, False
    old_id = client.images.get(image).id if labels is not None else None
    container = client.containers.create(BASE_IMAGE, command=["sleep", "infinity"],
                                         network_disabled=True, working_dir="/")
    try:
        container.start()
        container.put_archive("/", _tar_of(files))
        _exec(container, "git init -q && git add -A && git commit -q -m 'Initial commit' "
                         "&& git rev-parse HEAD", env=GIT_ENV)
        sha = _exec(container, "git rev-parse HEAD").strip()
        if sha != task["base_commit"]:
            raise RuntimeError(f"{task['instance_id']}: /testbed commit {sha} != base_commit "
                               f"{task['base_commit']} (regenerate swe/tasks/tasks.jsonl)")
        repo, tag = image.rsplit(":", 1)
        container.commit(repository=repo, tag=tag, conf={
            "Labels": {LABEL_TASK: task["instance_id"], LABEL_HASH: content_hash},
            "WorkingDir": "/testbed", "Env": IMAGE_ENV, "Cmd": ["sleep", "infinity"],
        })
    finally:
        with contextlib.suppress(Exception):
            container.remove(force=True)
    if old_id and old_id != client.images.get(image).id:
        # The replaced image is now untagged; drop it unless a container still uses it.
        with contextlib.suppress(Exception):
            client.images.remove(old_id)
    return image, True


def build_task_images(
    client: docker.DockerClient,
    tasks: list[dict[str, Any]] | None = None,
    progress: bool = True,
    force: bool = False,
    on_image: Callable[[str, bool], None] | None = None,
    stop: Callable[[], bool] | None = None,
) -> list[str]:
    """Build (or find cached) the images of `tasks` (default: the whole bundled suite).
    `stop()` true before an image: return the images so far (a demo interrupted meanwhile)."""
    ensure_base_image(client)
    tasks = load_tasks("all") if tasks is None else tasks
    images: list[str] = []
    t0 = time.monotonic()
    with machine_lock("task-images"):
        prog_ctx = _progress(len(tasks)) if progress else contextlib.nullcontext(None)
        with prog_ctx as advance:
            for task in tasks:
                if stop is not None and stop():
                    break
                image, built = build_task_image(client, task, force=force)
                images.append(image)
                if advance is not None:
                    advance(f"{'built' if built else 'cached'} {image}")
                if on_image is not None:
                    on_image(image, built)
    log.info("task images ready", count=len(images), seconds=round(time.monotonic() - t0, 1))
    return images


@contextlib.contextmanager
def _progress(total: int) -> Iterator[Callable[[str], None]]:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), transient=False) as prog:
        tid = prog.add_task("task images", total=total)

        def advance(msg: str) -> None:
            prog.update(tid, advance=1, description=msg)

        yield advance
