"""Fixtures for task images at cluster scale (owned by envd's image code).

`registry`     a real Docker registry (Debian's docker-registry) on 127.0.0.1:<free port>, plain
               HTTP (dockerd treats 127.0.0.0/8 registries as insecure by default) (session).
`docker_nodes` two more dockerd daemons, each with its own data root, socket and exec root,
               standing for two Docker nodes (session).
`tiny_images`  make(n) -> n small images (the host's `sleep` + libc and a payload of their own),
               pushed to `registry` and absent from every engine; named without a registry host
               (envd pulls them from envd.registry). Each ~4-6 MB, one layer each.
`image_nodes`  start(sets=...) -> one envd per node over the test Redis, pulling from `registry`.
"""

from __future__ import annotations

import contextlib
import io
import os
import secrets
import shutil
import subprocess
import tarfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from common.procs import terminate
from common.services import docker_answers, free_port, wait_port

__all__ = ["DockerNode", "Registry", "auth_registry", "docker_nodes", "image_nodes", "registry", "tiny_images"]

REGISTRY_CONFIG = """\
version: 0.1
log:
  level: warn
storage:
  filesystem:
    rootdirectory: {root}
  delete:
    enabled: true
http:
  addr: 127.0.0.1:{port}
{auth}"""
AUTH_CONFIG = """\
auth:
  htpasswd:
    realm: swarl-test
    path: {path}
"""


@dataclass
class Registry:
    host: str  # 127.0.0.1:PORT
    proc: subprocess.Popen[bytes]
    log: Path
    username: str | None = None
    password: str | None = None

    def stop(self) -> None:
        terminate(self.proc, timeout=10)


@dataclass
class DockerNode:
    name: str
    url: str  # unix://.../docker.sock
    root: Path
    proc: subprocess.Popen[bytes]

    def client(self):  # docker.DockerClient
        import docker

        return docker.DockerClient(base_url=self.url, timeout=120)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)


def start_registry(d: Path, user: tuple[str, str] | None = None) -> Registry:
    """docker-registry on 127.0.0.1:<free port>, data in `d`; with `user`, htpasswd auth."""
    exe = shutil.which("docker-registry")
    if exe is None:
        pytest.fail("docker-registry not found: run `make setup` (apt-get install docker-registry)")
    port = free_port()
    auth = ""
    if user is not None:
        import bcrypt

        (d / "htpasswd").write_text(f"{user[0]}:{bcrypt.hashpw(user[1].encode(), bcrypt.gensalt(rounds=4)).decode()}\n")
        auth = AUTH_CONFIG.format(path=d / "htpasswd")
    (d / "config.yml").write_text(REGISTRY_CONFIG.format(root=d / "data", port=port, auth=auth))
    log = d / "registry.log"
    with open(log, "wb") as logf:
        proc = subprocess.Popen([exe, "serve", str(d / "config.yml")], stdout=logf, stderr=subprocess.STDOUT,
                                start_new_session=True)
    reg = Registry(f"127.0.0.1:{port}", proc, log, *(user or (None, None)))
    try:
        wait_port("127.0.0.1", port, timeout=30)
        assert httpx.get(f"http://{reg.host}/v2/", timeout=5).status_code == (200 if user is None else 401)
    except Exception:
        reg.stop()
        raise
    return reg


@pytest.fixture(scope="session")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    reg = start_registry(tmp_path_factory.mktemp("registry"))
    yield reg
    reg.stop()


@pytest.fixture(scope="session")
def auth_registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    """A second registry that wants a user and password (htpasswd, bcrypt)."""
    reg = start_registry(tmp_path_factory.mktemp("auth-registry"), ("swarl", secrets.token_hex(12)))
    yield reg
    reg.stop()


def _start_dockerd(name: str, root: Path) -> DockerNode:
    exe = shutil.which("dockerd")
    if exe is None:
        pytest.fail("dockerd not found: run `make setup` (apt-get install docker.io)")
    root.mkdir(parents=True, exist_ok=True)
    url = f"unix://{root / 'docker.sock'}"
    with open(root / "dockerd.log", "wb") as logf:
        proc = subprocess.Popen(
            [exe, "--storage-driver=overlay2", "--iptables=false", "--ip6tables=false", "--bridge=none",
             f"--data-root={root / 'data'}", f"--exec-root={root / 'exec'}",
             f"--pidfile={root / 'dockerd.pid'}", "-H", url],
            stdout=logf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    return DockerNode(name, url, root, proc)


@pytest.fixture(scope="session")
def docker_nodes(docker_url: str) -> Iterator[list[DockerNode]]:
    """Two private dockerd daemons (node-a, node-b), stopped and their data removed at the end."""
    base = Path(f"/tmp/swarl-nodes-{os.getpid()}")  # short: unix socket paths are limited
    nodes = [_start_dockerd(n, base / n) for n in ("node-a", "node-b")]
    try:
        deadline = time.monotonic() + 90
        for node in nodes:
            while not docker_answers(node.url):
                if node.proc.poll() is not None or time.monotonic() > deadline:
                    log = (node.root / "dockerd.log").read_text(errors="replace")[-3000:]
                    pytest.fail(f"dockerd {node.name} did not answer:\n{log}")
                time.sleep(0.3)
        yield nodes
    finally:
        for node in nodes:
            with contextlib.suppress(Exception), contextlib.closing(node.client()) as c:
                for ctr in c.containers.list(all=True, ignore_removed=True):
                    ctr.remove(force=True)
        for node in nodes:
            node.stop()
        shutil.rmtree(base, ignore_errors=True)


def _tiny_tar(payload: bytes) -> bytes:
    """A root filesystem with the host's `sleep` and what it links against, plus /payload."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for d in ("usr", "usr/bin", "lib", "lib/x86_64-linux-gnu", "lib64", "tmp"):
            info = tarfile.TarInfo(d)
            info.type, info.mode = tarfile.DIRTYPE, 0o755
            tar.addfile(info)
        for path in ("/usr/bin/sleep", "/lib/x86_64-linux-gnu/libc.so.6", "/lib64/ld-linux-x86-64.so.2"):
            data = Path(path).resolve().read_bytes()
            info = tarfile.TarInfo(path.lstrip("/"))
            info.size, info.mode = len(data), 0o755
            tar.addfile(info, io.BytesIO(data))
        info = tarfile.TarInfo("payload")
        info.size, info.mode = len(payload), 0o644
        tar.addfile(info, io.BytesIO(payload))
    return buf.getvalue()


@pytest.fixture(scope="session")
def tiny_images(docker_url: str, registry: Registry) -> Iterator[Callable[..., list[str]]]:
    """make(n, prefix='t', payload_mb=2, to=registry) -> n new image names, each only in that registry."""
    import docker

    client = docker.DockerClient(base_url=docker_url, timeout=300)

    def make(n: int, prefix: str = "t", payload_mb: float = 2, to: Registry | None = None) -> list[str]:
        target = to or registry
        auth = {"username": target.username, "password": target.password} if target.username else None
        names = []
        for _ in range(n):
            name = f"swarl-test/{prefix}-{secrets.token_hex(4)}:1"
            repo, tag = name.split(":")
            remote = f"{target.host}/{repo}"
            client.api.import_image_from_data(_tiny_tar(os.urandom(int(payload_mb * 1e6))),
                                              repository=remote, tag=tag,
                                              changes=['CMD ["sleep", "infinity"]'])
            for ev in client.api.push(remote, tag=tag, stream=True, decode=True, auth_config=auth):
                assert "error" not in ev, ev
            client.api.remove_image(f"{remote}:{tag}")
            names.append(name)
        return names

    yield make
    client.close()


@pytest.fixture
def image_nodes(docker_nodes: list[DockerNode], registry: Registry, envd_token: str, redis_url: str,
                tmp_path: Path) -> Iterator[Callable[..., list]]:
    """start(sets=[...], registry_host=None, only=None) -> [envd on node-a, envd on node-b]
    (ServiceProc; `only` names the nodes to serve), with
    Redis (leases and the image index) and envd.registry = the test registry."""
    from fixtures_envd import start_envd

    started = []

    def start(sets: list[str] | None = None, registry_host: str | None = None,
              only: list[str] | None = None, env: dict[str, str] | None = None) -> list:
        from concurrent.futures import ThreadPoolExecutor

        def one(node: DockerNode):
            full = {"DOCKER_HOST": node.url, "SWARL_REDIS_URL": redis_url, "SWARL_RUN_ID": "test", **(env or {})}
            return start_envd(envd_token, tmp_path / "envd-logs", node.name,
                              sets=[f"envd.registry={registry_host or registry.host}", *(sets or [])],
                              env=full)

        chosen = [n for n in docker_nodes if only is None or n.name in only]
        with ThreadPoolExecutor(len(chosen)) as ex:  # both start at once (each waits for /healthz)
            out = list(ex.map(one, chosen))
        started.extend(out)
        return out

    yield start
    for svc in started:
        svc.stop()
