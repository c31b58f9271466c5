"""envd.network_disabled against a real dockerd: with network `none`, task containers are made
without Docker's network stack (NetworkDisabled: no libnetwork sandbox, endpoint or prestart
hook) and are the same to what runs in them as Docker's own `none` network: a network namespace
of their own with only loopback, loopback usable, `localhost` resolving from the first command
on (the /etc/hosts Docker would have written), nothing else reachable; for an agent's container
(its shell server) and a grading one (`sleep infinity` and docker exec) alike."""

from __future__ import annotations

from collections.abc import Iterator

import docker
import pytest

from envd.config import EnvdConfig
from envd.docker_backend import HOSTS, DockerBackend

pytestmark = pytest.mark.docker

# what a repository's tests may do with the network, and what they see of it
PROBE = ("ls /sys/class/net | tr '\\n' ' '; echo; "
         "python3 -c 'import socket; s = socket.socket(); s.bind((\"localhost\", 0)); s.listen(); "
         "c = socket.create_connection(s.getsockname(), timeout=5); print(\"loopback\", socket.gethostbyname(\"localhost\"))'; "
         "python3 -c 'import socket; socket.create_connection((\"1.1.1.1\", 53), timeout=3)' 2>&1 | tail -1")


@pytest.fixture(scope="module", params=[True, False], ids=["without_stack", "docker_none"])
def backend(request, docker_url: str) -> Iterator[DockerBackend]:
    b = DockerBackend(EnvdConfig(network_disabled=request.param), "test-netless", docker_url)
    yield b
    b.close()


@pytest.mark.parametrize("with_shell", [True, False], ids=["agent_shell", "sleep_exec"])
def test_the_first_command_sees_loopback_localhost_and_no_network(backend, test_image, docker_url, with_shell):
    cid, _, _ = backend.create(test_image, "netless", 600, None, with_shell=with_shell)
    try:
        # the very first command, right after the start (the container's first process may not have run)
        out = backend.exec(cid, PROBE, "/", {}, 30, 65536, via_shell=with_shell)
        assert out.returncode == 0, out
        ifaces, loop, unreachable = out.output.splitlines()
        assert ifaces.split() == ["lo"], out.output                     # no interface but loopback
        assert loop == "loopback 127.0.0.1", out.output
        assert "Network is unreachable" in unreachable, out.output
        hosts = backend.exec(cid, "cat /etc/hosts; ls -a /etc | grep -c '^\\.hosts' || true", "/", {}, 10, 65536)
        assert hosts.output.startswith("127.0.0.1\tlocalhost\n") and hosts.output.endswith("\n0\n"), hosts.output
        attrs = docker.DockerClient(base_url=docker_url).api.inspect_container(cid)
        assert attrs["HostConfig"]["NetworkMode"] == "none"
        if backend.network_disabled:
            assert attrs["Config"]["NetworkDisabled"] is True and not attrs["NetworkSettings"]["Networks"]
            assert hosts.output == HOSTS + "0\n"
        else:
            assert list(attrs["NetworkSettings"]["Networks"]) == ["none"]
    finally:
        backend.destroy(cid)


def test_other_network_modes_keep_dockers_stack(docker_url):
    b = DockerBackend(EnvdConfig(network="bridge"), "test-netless", docker_url)
    try:
        assert not b.network_disabled
    finally:
        b.close()


def test_an_image_of_another_user_than_root_keeps_dockers_stack(docker_url, test_image):
    """Its first process could not write /etc/hosts: Docker's `none` network writes it instead."""
    client = docker.DockerClient(base_url=docker_url)
    box = client.containers.create(test_image, ["true"])
    tag = "swarl-test/not-root:latest"
    box.commit(repository=tag.split(":")[0], tag="latest", changes=["USER nobody"])
    box.remove()
    b = DockerBackend(EnvdConfig(), "test-netless", docker_url)
    cid = b.create(tag, "netless", 600, None)[0]
    try:
        attrs = client.api.inspect_container(cid)
        assert b.network_disabled and not attrs["Config"].get("NetworkDisabled")
        out = b.exec(cid, "id -un; getent hosts localhost", "/", {}, 30, 65536)
        user, address = [*out.output.split(), "", ""][:2]
        assert out.returncode == 0 and user == "nobody" and address in ("::1", "127.0.0.1"), out
    finally:
        b.destroy(cid)
        b.close()
        client.images.remove(tag, force=True)
        client.close()
