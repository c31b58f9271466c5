"""Rigs for the node, envd, pool and actor-churn faults (tests/chaos/test_node_faults.py,
test_actor_churn.py): a second dockerd with its own data root standing for a second Docker node,
and the actors' service helpers (tests/actors/actor_services.py) re-exported."""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "actors"))

from actor_services import actor_sets, calc_row, start_actor, start_scripted, write_config

from common.services import docker_answers

__all__ = ["DockerNode", "actor_sets", "calc_row", "second_docker", "start_actor", "start_scripted",
           "write_config"]


@dataclass
class DockerNode:
    """A dockerd of its own (data root, exec root, socket, pidfile): kill() is SIGKILL, the node
    gone at once; start() brings it back on the same data root (its containers listed again)."""

    root: Path
    proc: subprocess.Popen[bytes] | None = None

    @property
    def sock(self) -> Path:
        return self.root / "docker.sock"

    @property
    def url(self) -> str:
        return f"unix://{self.sock}"

    def start(self, timeout: float = 60.0) -> DockerNode:
        exe = shutil.which("dockerd")
        assert exe, "dockerd is not installed"
        self.root.mkdir(parents=True, exist_ok=True)
        with open(self.root / "dockerd.log", "ab") as logf:
            self.proc = subprocess.Popen(
                [exe, "--storage-driver=overlay2", "--iptables=false", "--ip6tables=false",
                 "--bridge=none", f"--data-root={self.root / 'data'}", f"--exec-root={self.root / 'exec'}",
                 f"--pidfile={self.root / 'dockerd.pid'}", "-H", self.url],
                stdout=logf, stderr=logf, stdin=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + timeout
        while not docker_answers(self.url):
            assert self.proc.poll() is None, (self.root / "dockerd.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "second dockerd did not answer"
            time.sleep(0.5)
        return self

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(30)
        self.sock.unlink(missing_ok=True)
        (self.root / "dockerd.pid").unlink(missing_ok=True)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.kill()


@pytest.fixture(scope="module")
def second_docker(docker_url: str, test_image: str) -> Iterator[DockerNode]:
    """A second Docker node holding the test image (copied from the first with save | load)."""
    import docker

    node = DockerNode(Path("/var/lib/swarl-chaos-node2")).start()
    first = docker.DockerClient(base_url=docker_url, timeout=300)
    second = docker.DockerClient(base_url=node.url, timeout=300)
    try:
        if not second.api.images(name=test_image):
            second.images.load(b"".join(first.images.get(test_image).save(named=True)))
        for c in second.containers.list(all=True, ignore_removed=True):   # left by an earlier, interrupted run
            c.remove(force=True)
    finally:
        first.close()
        second.close()
    yield node
    node.stop()
