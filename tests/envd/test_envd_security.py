"""Task containers are unprivileged (docs/security.md): only the capabilities a repository's tests
need, no new privileges, Docker's default seccomp profile, no Docker socket, no network; envd and
the pool refuse every call without their token and never log it."""

from __future__ import annotations

from collections.abc import Iterator

import docker
import httpx
import pytest

from envd.config import TASK_CAPS

pytestmark = pytest.mark.docker

# Linux capability numbers (linux/capability.h) of the ones swarl keeps.
CAP_BITS = {"CHOWN": 0, "DAC_OVERRIDE": 1, "DAC_READ_SEARCH": 2, "FOWNER": 3, "FSETID": 4, "KILL": 5,
            "SETGID": 6, "SETUID": 7, "SETPCAP": 8, "NET_BIND_SERVICE": 10, "NET_RAW": 13, "SYS_CHROOT": 18,
            "MKNOD": 27, "AUDIT_WRITE": 29, "SETFCAP": 31}
DOCKER_DEFAULT = 0xA80425FB


@pytest.fixture(scope="module")
def api(envd_server) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=envd_server.url, headers={"Authorization": f"Bearer {envd_server.token}"},
                      timeout=120) as c:
        yield c


@pytest.fixture(scope="module")
def container(api: httpx.Client, test_image: str) -> Iterator[str]:
    cid = api.post("/container/create", json={"image": test_image}).json()["container_id"]
    yield cid
    api.post("/container/destroy", json={"container_id": cid})


def sh(api: httpx.Client, cid: str, command: str) -> tuple[int, str]:
    out = api.post("/container/exec", json={"container_id": cid, "command": command}).json()
    return out["returncode"], out["output"]


def test_capabilities_inside_a_task_container(api: httpx.Client, container: str, docker_url: str) -> None:
    code, status = sh(api, container, "grep -E '^(CapEff|CapBnd|CapPrm|NoNewPrivs|Seccomp):' /proc/self/status")
    assert code == 0, status
    fields = dict(line.split(":\t") for line in status.strip().splitlines())
    want = sum(1 << CAP_BITS[c] for c in TASK_CAPS)
    assert want == 0xFB and want & DOCKER_DEFAULT == want        # a subset of Docker's default set
    assert int(fields["CapEff"], 16) == want, fields
    assert int(fields["CapBnd"], 16) == want, fields              # nothing to regain, even by exec
    assert fields["NoNewPrivs"].strip() == "1" and fields["Seccomp"].strip() == "2", fields  # default profile
    hc = docker.DockerClient(base_url=docker_url).api.inspect_container(container)["HostConfig"]
    assert hc["CapDrop"] == ["ALL"] and sorted(hc["CapAdd"]) == sorted(TASK_CAPS)
    assert hc["SecurityOpt"] == ["no-new-privileges"] and hc["Privileged"] is False


def test_what_the_dropped_capabilities_stop(api: httpx.Client, container: str) -> None:
    # MKNOD, NET_RAW, SYS_CHROOT are gone; no docker socket is mounted; no network but loopback
    assert sh(api, container, "mknod /tmp/dev-x c 1 3")[0] != 0
    raw = "python3 -c 'import socket; socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)'"
    code, out = sh(api, container, raw)
    assert code != 0 and "PermissionError" in out
    assert sh(api, container, "chroot / true")[0] != 0
    assert sh(api, container, "test -e /var/run/docker.sock || test -e /run/docker.sock")[0] != 0
    assert sh(api, container, "ls /sys/class/net")[1].split() == ["lo"]


def test_what_repository_tests_still_do(api: httpx.Client, container: str) -> None:
    # root's file semantics, as under the official harness: chown, reading a mode-000 file,
    # changing uid (tests that drop privileges), and killing a process that did so
    script = ("cd /tmp && echo x > f && chmod 000 f && cat f && chown 65534:65534 f && chmod 644 f && "
              "python3 -c 'import os; os.setgid(65534); os.setuid(65534); print(os.getuid())'; "
              "setpriv --reuid 65534 --regid 65534 --clear-groups sleep 60 & p=$!; sleep 0.2; "
              "kill -9 $p && echo kill-ok; wait $p 2>/dev/null; true")
    code, out = sh(api, container, script)
    assert code == 0 and out.split() == ["x", "65534", "kill-ok"], out


def test_every_mutating_endpoint_needs_the_token(envd_server, pool_server) -> None:
    for svc in (envd_server, pool_server):
        spec = httpx.get(f"{svc.url}/openapi.json", headers={"Authorization": f"Bearer {svc.token}"}).json()
        posts = [p for p, ops in spec["paths"].items() if set(ops) & {"post", "put", "patch", "delete"}]
        assert len(posts) >= 5, posts
        for path in posts:
            for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": svc.token}):
                r = httpx.post(svc.url + path, json={}, headers=headers)
                assert r.status_code == 401, (svc.url, path, headers, r.text)
        assert httpx.get(f"{svc.url}/openapi.json").status_code == 401
        assert svc.token not in svc.log(), "the token reached the log"


def test_tokens_are_compared_in_constant_time() -> None:
    import inspect

    from common.http import BearerAuth

    assert "hmac.compare_digest" in inspect.getsource(BearerAuth.__call__)
