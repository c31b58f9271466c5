"""Fixtures for envd and the pool (owned by envd).

`test_image`   a small image (Debian minbase + git, python3, patch, procps) with a git repo
               at /testbed, built locally from Debian packages and cached by tag.
`envd_server`  `swarl envd serve` as a subprocess on a free port, with a token (session).
`envd_factory` start more envd processes (own node ids, optional Redis, config overrides).
`pool_server`  `swarl pool serve` over envd_server + the test Redis (function-scoped).
`pool_factory` start pool processes (restart / run twice) against given nodes and Redis.
"""

from __future__ import annotations

import contextlib
import io
import os
import secrets
import subprocess
import sys
import tarfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from common.procs import Child

# What conftest's `from fixtures_envd import *` brings in: the fixtures only.
__all__ = ["envd_factory", "envd_server", "envd_token", "pool_factory", "pool_server", "test_image"]

REPO = Path(__file__).resolve().parent.parent
SWARL = str(Path(sys.executable).parent / "swarl")  # a worktree has no .venv of its own
TEST_IMAGE = "swarl/envd-test:2"

# A tiny repository at /testbed: a module with a bug and a test that shows it.
_TESTBED_FILES = {
    "calc.py": "def add(a, b):\n    return a - b\n",
    "test_calc.py": "from calc import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n",
}
GOOD_PATCH = """diff --git a/calc.py b/calc.py
--- a/calc.py
+++ b/calc.py
@@ -1,2 +1,2 @@
 def add(a, b):
-    return a - b
+    return a + b
"""
EVAL_SCRIPT = "cd /testbed && python3 -c 'from calc import add; assert add(2, 3) == 5'"


def _image_exists(client, tag: str) -> bool:
    import docker.errors

    try:
        client.images.get(tag)
        return True
    except docker.errors.ImageNotFound:
        return False


def _tar_of(files: dict[str, str]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = 0o644
            tf.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def build_test_image(client) -> str:
    """Return TEST_IMAGE, building it (and the base image) when absent."""
    from common.files import machine_lock

    with machine_lock("test-image"):  # parallel workers: one builds, the others find it built
        return _build_test_image(client)


def _build_test_image(client) -> str:
    from envd.images import ensure_base_image

    if _image_exists(client, TEST_IMAGE):
        return TEST_IMAGE
    # the same cached Debian base image the bundled tasks build on (one debootstrap, apt's mirror)
    base = ensure_base_image(client)
    c = client.containers.create(base, ["sleep", "infinity"], network_mode="none")
    try:
        c.start()
        assert c.exec_run(["mkdir", "-p", "/testbed"]).exit_code == 0
        c.put_archive("/testbed", _tar_of(_TESTBED_FILES))
        setup = ("cd /testbed && git init -q && git config user.email t@swarl && "
                 "git config user.name swarl && git add -A && git commit -qm base")
        res = c.exec_run(["bash", "-lc", setup])
        assert res.exit_code == 0, res.output
        c.commit(repository=TEST_IMAGE.split(":")[0], tag=TEST_IMAGE.split(":")[1],
                 conf={"Cmd": ["bash"], "WorkingDir": "/testbed"})
    finally:
        c.remove(force=True)
    return TEST_IMAGE


@pytest.fixture(scope="session")
def test_image(docker_url: str) -> str:
    """A small image with git + python3 + patch + procps and a git repo at /testbed."""
    import docker

    client = docker.DockerClient(base_url=docker_url, timeout=120)
    try:
        return build_test_image(client)
    finally:
        client.close()


# -- service processes ---------------------------------------------------------------


@dataclass
class ServiceProc(Child):
    url: str = ""
    token: str = ""
    port: int = 0
    node_id: str = ""
    args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)


def _wait_healthy(svc: ServiceProc, timeout: float = 30.0) -> None:
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if svc.proc.poll() is not None:
            raise RuntimeError(f"{svc.args[:3]} exited with {svc.proc.returncode}:\n{svc.log()}")
        with contextlib.suppress(httpx.HTTPError):
            headers = {"Authorization": f"Bearer {svc.token}"} if svc.token else {}
            r = httpx.get(f"{svc.url}/healthz", headers=headers, timeout=2)
            if r.status_code == 200:
                return
        time.sleep(0.1)
    svc.kill()
    raise RuntimeError(f"{svc.args[:3]} did not answer /healthz in {timeout}s:\n{svc.log()}")


def start_service(args: list[str], token: str, log_dir: Path, env: dict[str, str] | None = None,
                  port: int | None = None) -> ServiceProc:
    """Start `swarl <args> --port P` with SWARL_ENVD_TOKEN=token; wait for /healthz."""
    from common.services import free_port

    port = port or free_port()
    full_env = {**os.environ, "SWARL_ENVD_TOKEN": token, **(env or {})}
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"{args[0]}-{port}-{int(time.time() * 1000)}.log"
    logf = open(log_path, "wb")  # handed to the child
    cmd = [SWARL, *args, "--host", "127.0.0.1", "--port", str(port)]
    proc = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT, env=full_env,
                            start_new_session=True)
    logf.close()
    svc = ServiceProc(proc, log_path, url=f"http://127.0.0.1:{port}", token=token, port=port, args=cmd,
                      env=env or {})
    _wait_healthy(svc)
    return svc


def start_envd(token: str, log_dir: Path, node_id: str, sets: list[str] | None = None,
               env: dict[str, str] | None = None, port: int | None = None) -> ServiceProc:
    args = ["envd", "serve", "--node-id", node_id]
    for s in sets or []:
        args += ["--set", s]
    svc = start_service(args, token, log_dir, env=env, port=port)
    svc.node_id = node_id
    return svc


# The envds of the tests grade every evaluation afresh: a test that grades one patch twice (the agent's
# container tampered with, a check turned off) must see the second grading run; a --set turns the
# cache on (tests/envd/test_grade_cache.py).
NO_GRADE_CACHE = {"SWARL_ENVD__GRADE_CACHE_ENTRIES": "0"}


@pytest.fixture(scope="session")
def envd_token() -> str:
    return secrets.token_hex(16)


@pytest.fixture(scope="session")
def envd_server(docker_url: str, envd_token: str, tmp_path_factory) -> Iterator[ServiceProc]:
    """`swarl envd serve` (in-memory leases) on a free port; .url, .token, .node_id."""
    node_id = f"test-envd-{secrets.token_hex(3)}"
    env = {"DOCKER_HOST": docker_url, "SWARL_REDIS_URL": "", **NO_GRADE_CACHE}
    svc = start_envd(envd_token, tmp_path_factory.mktemp("envd-logs"), node_id, env=env)
    yield svc
    svc.stop()


@pytest.fixture
def envd_factory(docker_url: str, envd_token: str, tmp_path) -> Iterator:
    """Start extra envd processes: make(node_id=..., sets=[...], redis_url=None, port=None)."""
    started: list[ServiceProc] = []

    def make(node_id: str | None = None, sets: list[str] | None = None,
             redis_url: str | None = None, port: int | None = None) -> ServiceProc:
        env = {"DOCKER_HOST": docker_url, "SWARL_REDIS_URL": redis_url or "",
               "SWARL_RUN_ID": "test", **NO_GRADE_CACHE}
        svc = start_envd(envd_token, tmp_path / "envd-logs",
                         node_id or f"test-envd-{secrets.token_hex(3)}", sets=sets, env=env,
                         port=port)
        started.append(svc)
        return svc

    yield make
    for svc in started:
        svc.stop()


@pytest.fixture
def pool_factory(envd_token: str, tmp_path) -> Iterator:
    """Start `swarl pool serve`: make(exec_urls, redis_url, sets=[...], port=None)."""
    started: list[ServiceProc] = []

    def make(exec_urls: list[str], redis_url: str, sets: list[str] | None = None,
             port: int | None = None) -> ServiceProc:
        args = ["pool", "serve", "--exec-urls", ",".join(exec_urls)]
        for s in sets or []:
            args += ["--set", s]
        env = {"SWARL_REDIS_URL": redis_url, "SWARL_RUN_ID": "test"}
        svc = start_service(args, envd_token, tmp_path / "pool-logs", env=env, port=port)
        started.append(svc)
        return svc

    yield make
    for svc in started:
        svc.stop()


@pytest.fixture
def pool_server(pool_factory, envd_server: ServiceProc, redis_url: str) -> ServiceProc:
    """`swarl pool serve` over envd_server and the test Redis; .url, .token."""
    return pool_factory([envd_server.url], redis_url)


def main() -> None:  # `python tests/fixtures_envd.py`: build the test image ahead of time
    import docker

    from common.services import ensure_docker

    client = docker.DockerClient(base_url=ensure_docker(), timeout=120)
    print(build_test_image(client))
    client.close()


if __name__ == "__main__":
    sys.exit(main())
