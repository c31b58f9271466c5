"""envd against a real dockerd: lifecycle, limits, timeouts, output cap, auth, bad inputs."""

from __future__ import annotations

import asyncio
import time

import docker
import httpx
import pytest
from fixtures_envd import EVAL_SCRIPT, GOOD_PATCH

from envd.client import EnvdClient, EnvRequestError, LeaseLost

pytestmark = pytest.mark.docker


def _h(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture
def api(envd_server):
    with httpx.Client(base_url=envd_server.url, headers=_h(envd_server.token), timeout=60) as c:
        yield c


@pytest.fixture
def container(api, test_image):
    r = api.post("/container/create", json={"image": test_image})
    assert r.status_code == 200, r.text
    cid = r.json()["container_id"]
    yield cid
    api.post("/container/destroy", json={"container_id": cid})


def test_auth_refusals(envd_server):
    for path in ("/healthz", "/status", "/images", "/metrics"):
        assert httpx.get(envd_server.url + path).status_code == 401
        assert httpx.get(envd_server.url + path, headers=_h("wrong")).status_code == 401
    r = httpx.post(envd_server.url + "/container/exec", json={"container_id": "x", "command": "id"},
                   headers=_h("wrong"))
    assert r.status_code == 401 and r.json()["ok"] is False and "wrong bearer token" in r.json()["error"]


def test_lifecycle_and_container_settings(api, envd_server, test_image, docker_url):
    r = api.post("/container/create", json={"image": test_image})
    body = r.json()
    assert r.status_code == 200 and body["ok"] and body["name"]
    cid = body["container_id"]
    attrs = docker.DockerClient(base_url=docker_url).api.inspect_container(cid)
    hc = attrs["HostConfig"]
    assert hc["NetworkMode"] == "none" and hc["Privileged"] is False
    assert hc["Memory"] == 4 * 1024**3 and hc["PidsLimit"] == 1024 and hc["NanoCpus"] == 10**9
    labels = attrs["Config"]["Labels"]
    assert labels["swarl.owner"] == envd_server.node_id
    assert {"swarl.lease", "swarl.created", "swarl.expires"} <= set(labels)

    r = api.post("/container/exec", json={"container_id": cid, "command": "pwd; echo $FOO; echo err >&2; exit 3",
                                          "env": {"FOO": "bar"}})
    out = r.json()
    assert out["ok"] and out["returncode"] == 3 and sorted(out["output"].split()) == ["/testbed", "bar", "err"]
    assert out["timed_out"] is False
    # no network inside
    r = api.post("/container/exec", json={"container_id": cid, "command": "ls /sys/class/net"})
    assert r.json()["output"].split() == ["lo"]

    api.post("/container/exec", json={"container_id": cid, "command": "sed -i s/a\\ -\\ b/a\\ +\\ b/ calc.py"})
    d = api.post("/container/diff", json={"container_id": cid}).json()
    assert d["ok"] and d["returncode"] == 0 and "+    return a + b" in d["patch"]
    # the patch is git's diff alone: the login shell's noise (a profile that prints, a container
    # out of processes) and git's warnings are in the merged output, never in the patch
    # (stderr written after git's diff began, by a process the profile left behind: docker
    # delivers the two streams apart, so only leaving stderr unattached keeps it out)
    api.post("/container/exec", json={"container_id": cid, "command":
             "echo 'echo profile-noise; echo more >&2; (sleep 0.5; echo late >&2) &' >> /etc/profile"})
    d2 = api.post("/container/diff", json={"container_id": cid}).json()
    assert d2["ok"] and d2["returncode"] == 0 and d2["patch"] == d["patch"], d2
    assert d2["patch"].startswith("diff --git")

    st = api.get("/status").json()
    assert st["ok"] and cid in st["containers"] and st["active_containers"] >= 1
    assert api.get("/healthz").json()["running_containers"] >= 1
    assert test_image in api.get("/images").json()["images"]

    # script mode: reset, apply, run the script; exit 0 = resolved
    ev = api.post("/container/evaluate", json={"container_id": cid, "patch": GOOD_PATCH,
                                               "eval_script": EVAL_SCRIPT}).json()
    assert ev["ok"] and ev["resolved"] is True and ev["returncode"] == 0, ev
    ev = api.post("/container/evaluate", json={"container_id": cid, "patch": "",
                                               "eval_script": EVAL_SCRIPT}).json()
    assert ev["ok"] and ev["resolved"] is False and "empty patch" in ev["error"]
    bad = GOOD_PATCH.replace("return a - b", "return a * b")  # does not apply
    ev = api.post("/container/evaluate", json={"container_id": cid, "patch": bad,
                                               "eval_script": EVAL_SCRIPT})
    assert ev.status_code == 200 and ev.json()["resolved"] is False
    assert "patch does not apply" in ev.json()["error"]
    ev = api.post("/container/evaluate", json={"container_id": cid, "patch": "hello",
                                               "eval_script": EVAL_SCRIPT}).json()
    assert ev["resolved"] is False and "not a git diff" in ev["error"]

    assert api.post("/container/heartbeat", json={"container_id": cid}).json()["expires"] > time.time()
    assert api.post("/container/destroy", json={"container_id": cid}).json() == {"ok": True}
    r = api.post("/container/exec", json={"container_id": cid, "command": "true"})
    assert r.status_code == 404 and cid in r.json()["error"]
    m = api.get("/metrics").text
    assert "envd_execs_total" in m and "envd_exec_duration_seconds_bucket" in m


def test_timeout_kills_the_command_inside(api, container):
    # a foreground sleep, a background child and one that escaped the process group
    cmd = ("(sleep 6; touch /tmp/bg) & setsid sh -c 'sleep 6; touch /tmp/escaped' & "
           "sleep 6; touch /tmp/fg")
    t0 = time.monotonic()
    r = api.post("/container/exec", json={"container_id": container, "command": cmd, "timeout": 1})
    out = r.json()
    assert out["ok"] and out["returncode"] == -1 and out["timed_out"] is True
    assert time.monotonic() - t0 < 5.5  # well before the command would end (generous: shared CPU)
    ps = api.post("/container/exec", json={"container_id": container, "command": "ps -eo args"}).json()
    assert "sleep 6" not in ps["output"], ps["output"]
    time.sleep(max(0.0, t0 + 6.5 - time.monotonic()))
    ls = api.post("/container/exec", json={"container_id": container,
                                           "command": "ls /tmp/fg /tmp/bg /tmp/escaped"}).json()
    assert ls["returncode"] != 0 and ls["output"].count("No such file") == 3


def test_output_cap_keeps_head_and_tail(api, container):
    cmd = "echo START; head -c 3000000 /dev/zero | tr '\\0' x; echo; echo END"
    out = api.post("/container/exec", json={"container_id": container, "command": cmd}).json()
    assert out["returncode"] == 0 and out["truncated"] is True
    assert out["output"].startswith("START") and out["output"].rstrip().endswith("END")
    assert "bytes of output cut by envd" in out["output"]
    assert len(out["output"]) < 262144 + 200


def test_bad_inputs_get_clear_4xx(api, container, envd_server):
    r = api.post("/container/exec", json={"command": "true"})
    assert r.status_code == 422 and "container_id" in r.json()["error"]
    r = api.post("/container/create", json={})
    assert r.status_code == 422 and "image" in r.json()["error"]
    r = api.post("/container/exec", json={"container_id": container, "command": "true", "timeout": "soon"})
    assert r.status_code == 422 and "timeout" in r.json()["error"]
    r = api.post("/container/create", content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 422 and r.json()["ok"] is False
    r = api.post("/container/exec", json={"container_id": "nope-nope-nope", "command": "true"})
    assert r.status_code == 404 and "nope-nope-nope" in r.json()["error"]
    r = api.post("/container/create", json={"image": "swarl/no-such-image:1"})
    assert r.status_code == 404 and "swarl/no-such-image:1" in r.json()["error"]
    r = api.post("/container/evaluate", json={"container_id": container, "patch": GOOD_PATCH})
    assert r.status_code == 422 and "eval_script" in r.json()["error"]
    r = api.post("/container/evaluate", json={"container_id": container, "patch": GOOD_PATCH,
                                              "instance": {"repo": "x"}})
    assert r.status_code == 422 and "instance" in r.json()["error"]
    big = b'{"container_id": "' + b"x" * (17 * 1024 * 1024) + b'", "command": "true"}'
    r = api.post("/container/exec", content=big, headers={"content-type": "application/json"})
    assert r.status_code == 413 and "too large" in r.json()["error"]

    def chunked():  # no Content-Length: envd counts what arrives
        for _ in range(17):
            yield b" " * (1024 * 1024)

    r = api.post("/container/exec", content=chunked(), headers={"content-type": "application/json"})
    assert r.status_code == 413 and "too large" in r.json()["error"]
    assert api.get("/healthz").status_code == 200  # nothing lost


async def test_sixteen_containers_at_once(envd_server, test_image):
    client = EnvdClient.node(envd_server.url, envd_server.token)
    ids: list[str] = []
    try:
        ids = list(await asyncio.gather(*(client.create(test_image) for _ in range(16))))
        assert len(set(ids)) == 16
        # a slow exec does not block the others
        slow = asyncio.create_task(client.exec(ids[0], "sleep 10; echo slow"))
        res = list(await asyncio.gather(*(client.exec(c, f"echo {i}") for i, c in enumerate(ids))))
        # Docker 20.10 now and then delivers none of the output of an exec that ran and exited 0
        # (moby/moby#27289, docker/docker-py#2042; 2 of ~6 CI runs here, one exec of the 16): the
        # echo is idempotent, so such a one runs again, once; more than one of 16 fails the test
        lost = [i for i, r in enumerate(res) if r.returncode == 0 and not r.output and not r.timed_out]
        assert len(lost) <= 1, res
        for i in lost:
            res[i] = await client.exec(ids[i], f"echo {i}")
        assert [r.output.strip() for r in res] == [str(i) for i in range(16)], res
        assert not slow.done()  # the 16 finished while the slow exec still ran
        assert (await slow).output.strip() == "slow"
    finally:
        await asyncio.gather(*(client.destroy(c) for c in ids), return_exceptions=True)
        with pytest.raises(LeaseLost):
            await client.exec(ids[0], "true") if ids else (_ for _ in ()).throw(LeaseLost("none"))
        with pytest.raises(EnvRequestError):
            await client.exec("", "true")
        await client.aclose()
