"""Private services for the embedded default: a redis-server for one command's lifetime, and
a dockerd (left running, like a system service, so built images stay cached)."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from common.files import machine_lock
from common.logs import get_logger

log = get_logger("services")

DOCKER_ROOT = Path(os.environ.get("SWARL_DOCKER_ROOT", "/var/lib/swarl-docker"))
DOCKER_SOCK = Path(os.environ.get("SWARL_DOCKER_SOCK", "/run/swarl-docker.sock"))


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def wait_port(host: str, port: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=0.5):
            return
        time.sleep(0.05)
    raise TimeoutError(f"nothing listens on {host}:{port} after {timeout:.0f}s")


@dataclass
class RedisProcess:
    url: str
    port: int
    dir: Path
    proc: subprocess.Popen[bytes]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=5)


def start_redis(
    dir: str | os.PathLike[str] | None = None, port: int | None = None, appendonly: bool = False,
    extra_args: list[str] | None = None,
) -> RedisProcess:
    """Start redis-server on loopback in `dir` (AOF everysec when appendonly); `extra_args` go
    last (e.g. `--replicaof 127.0.0.1 <port>`)."""
    exe = shutil.which("redis-server")
    if exe is None:
        raise RuntimeError("redis-server not found: run `make setup` (apt-get install redis-server)")
    d = Path(dir) if dir else Path(tempfile.mkdtemp(prefix="swarl-redis-"))
    d.mkdir(parents=True, exist_ok=True)
    port = port or free_port()
    args = [exe, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(d), "--save", "",
            "--daemonize", "no", "--loglevel", "warning", "--logfile", str(d / "redis.log")]
    args += ["--appendonly", "yes", "--appendfsync", "everysec"] if appendonly else ["--appendonly", "no"]
    args += extra_args or []
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        wait_port("127.0.0.1", port)
    except TimeoutError:
        proc.kill()
        raise
    return RedisProcess(f"redis://127.0.0.1:{port}/0", port, d, proc)


@contextlib.contextmanager
def redis_for_command(url: str | None, run_dir: str | os.PathLike[str] | None = None) -> Iterator[str]:
    """Yield the Redis URL to use: the configured one, or a private server for this command."""
    if url:
        yield url
        return
    d = Path(run_dir) / "redis" if run_dir else None
    srv = start_redis(d, appendonly=True)
    log.info("started a private redis-server for this command's lifetime", url=srv.url, dir=srv.dir)
    try:
        yield srv.url
    finally:
        srv.stop()


def docker_answers(base_url: str | None = None) -> bool:
    import docker

    try:
        client = docker.DockerClient(base_url=base_url, timeout=5) if base_url else docker.from_env(timeout=5)
        try:
            client.ping()
            return True
        finally:
            client.close()
    except Exception:
        return False


def ensure_docker(timeout: float = 60.0) -> str:
    """Return a Docker base URL that answers: DOCKER_HOST, the system socket, or a private
    dockerd started here (left running; its data root keeps images cached)."""
    env = os.environ.get("DOCKER_HOST")
    if env and docker_answers(env):
        return env
    for sock in ("/var/run/docker.sock", str(DOCKER_SOCK)):
        url = f"unix://{sock}"
        if Path(sock).exists() and docker_answers(url):
            return url
    exe = shutil.which("dockerd")
    if exe is None:
        raise RuntimeError("no Docker engine answers and dockerd is not installed: run `make setup`")
    url = f"unix://{DOCKER_SOCK}"
    with machine_lock("dockerd", timeout_s=timeout + 30):
        if docker_answers(url):  # another process (a parallel test worker, a demo) started it
            return url
        return _start_dockerd(exe, url, timeout)


def _start_dockerd(exe: str, url: str, timeout: float) -> str:
    DOCKER_ROOT.mkdir(parents=True, exist_ok=True)
    with open(DOCKER_ROOT / "dockerd.log", "ab") as logf:  # the daemon keeps its own copy
        subprocess.Popen(
            [exe, "--storage-driver=overlay2", "--iptables=false", "--ip6tables=false",
             "--bridge=none", f"--data-root={DOCKER_ROOT / 'data'}", f"--exec-root={DOCKER_ROOT / 'exec'}",
             f"--pidfile={DOCKER_ROOT / 'dockerd.pid'}", "-H", url],
            stdout=logf, stderr=logf, stdin=subprocess.DEVNULL, start_new_session=True,
        )
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if docker_answers(url):
            log.info("started a private dockerd", url=url, data_root=DOCKER_ROOT)
            return url
        time.sleep(0.5)
    raise RuntimeError(f"private dockerd did not answer on {url} within {timeout:.0f}s; "
                       f"see {DOCKER_ROOT / 'dockerd.log'}")
