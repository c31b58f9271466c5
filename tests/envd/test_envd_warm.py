"""envd's warm containers (envd.warm) against a real dockerd: a create after the first is served
by a container started ahead, which is as fresh as a created one; refills stay within their
bounds; an image no longer asked for, and a stopping envd, leave no container behind."""

from __future__ import annotations

import time

import docker
import httpx
import pytest

pytestmark = pytest.mark.docker


def _owned(docker_url: str, node_id: str) -> list[str]:
    client = docker.DockerClient(base_url=docker_url)
    try:
        # not containers.list(): it inspects each container after listing it, and the warm reaper may
        # have removed one in between (a 404 that fails the test)
        return [c["Id"] for c in client.api.containers(all=True, filters={"label": f"swarl.owner={node_id}"})]
    finally:
        client.close()


def _until(pred, timeout: float = 60.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def _takes(api: httpx.Client) -> dict[str, float]:
    out = {}
    for line in api.get("/metrics").text.splitlines():
        if line.startswith("envd_warm_takes_total{"):
            out[line.split('result="')[1].split('"')[0]] = float(line.rsplit(" ", 1)[1])
    return out


def test_creates_are_served_warm_and_nothing_is_left(envd_factory, test_image, docker_url):
    svc = envd_factory(sets=["envd.warm_per_image=2", "envd.warm_max=2", "envd.warm_idle_s=4",
                             "envd.reap_interval_s=0.5"])
    with httpx.Client(base_url=svc.url, headers={"Authorization": f"Bearer {svc.token}"}, timeout=120) as api:
        first = api.post("/container/create", json={"image": test_image}).json()
        assert first["ok"] and _takes(api) == {"miss": 1.0}
        _until(lambda: api.get("/status").json()["warm"].get(test_image) == 2, what="two warm containers")
        warm_ids = set(_owned(docker_url, svc.node_id)) - {first["container_id"]}
        assert len(warm_ids) == 2

        # the next creates take them (no docker create on the way) and refill behind them
        second = api.post("/container/create", json={"image": test_image}).json()
        assert second["container_id"] in warm_ids and _takes(api) == {"miss": 1.0, "hit": 1.0}
        # as fresh as a created container: the clean repository, nothing else running
        out = api.post("/container/exec", json={"container_id": second["container_id"],
                                                 "command": "git status --porcelain; ps -eo comm="}).json()
        assert out["ok"] and out["returncode"] == 0
        assert set(out["output"].split()) <= {"docker-init", "sleep", "timeout", "bash", "ps"}, out["output"]
        st = api.get("/status").json()
        assert second["container_id"] in st["containers"] and st["active_containers"] == 2
        _until(lambda: api.get("/status").json()["warm"].get(test_image) == 2, what="the refill")
        # warm_max bounds them: two leased and two warm, never more
        assert len(_owned(docker_url, svc.node_id)) == 4
        warm_ids = set(_owned(docker_url, svc.node_id)) - {first["container_id"], second["container_id"]}

        # a create served warm keeps its labels in /status (a started container's are fixed);
        # one that asks for a container of its own (warm false) gets one created
        labelled = api.post("/container/create", json={"image": test_image, "labels": {"k": "v"}}).json()
        assert _takes(api) == {"miss": 1.0, "hit": 2.0}
        assert api.get("/status").json()["containers"][labelled["container_id"]]["labels"] == {"k": "v"}
        third = api.post("/container/create", json={"image": test_image, "warm": False}).json()
        assert third["container_id"] not in warm_ids and _takes(api)["miss"] == 2.0

        for c in (first, second, labelled, third):
            assert api.post("/container/destroy", json={"container_id": c["container_id"]}).json()["ok"]
        # no create asks for the image any more: its warm containers go after warm_idle_s
        _until(lambda: not _owned(docker_url, svc.node_id), timeout=60, what="the idle sweep")
        assert api.get("/status").json()["warm"] == {}

        # and a stopping envd destroys the warm containers it holds
        api.post("/container/create", json={"image": test_image})
        _until(lambda: api.get("/status").json()["warm"].get(test_image) == 2, what="warm again")
    svc.stop()
    assert _owned(docker_url, svc.node_id) == []


def test_off_by_default(envd_server, test_image, docker_url):
    with httpx.Client(base_url=envd_server.url, headers={"Authorization": f"Bearer {envd_server.token}"},
                      timeout=120) as api:
        before = set(_owned(docker_url, envd_server.node_id))
        made = api.post("/container/create", json={"image": test_image}).json()
        time.sleep(2)
        assert api.get("/status").json()["warm"] == {} and _takes(api) == {}
        assert set(_owned(docker_url, envd_server.node_id)) - before == {made["container_id"]}
        api.post("/container/destroy", json={"container_id": made["container_id"]})


def test_at_warm_max_the_image_wanted_least_recently_gives_way(envd_factory, test_image, docker_url):
    """Warm containers of an image asked for minutes ago must not hold the node's warm capacity
    against the image the creates want now."""
    other = "swarl-test/warm-other:latest"
    client = docker.DockerClient(base_url=docker_url)
    client.images.get(test_image).tag(other)
    svc = envd_factory(sets=["envd.warm_per_image=2", "envd.warm_max=2"])
    try:
        with httpx.Client(base_url=svc.url, headers={"Authorization": f"Bearer {svc.token}"},
                          timeout=120) as api:
            api.post("/container/create", json={"image": test_image})
            _until(lambda: api.get("/status").json()["warm"] == {test_image: 2}, what="warm A")
            api.post("/container/create", json={"image": other})
            _until(lambda: api.get("/status").json()["warm"] == {other: 2}, what="B taking A's place")
            assert len(_owned(docker_url, svc.node_id)) == 4  # two leased, two warm
        svc.stop()
        assert _owned(docker_url, svc.node_id) == []
    finally:
        client.images.remove(other)  # the tag only
        client.close()


def test_grading_takes_a_warm_container_and_stays_fresh(envd_factory, test_image):
    """The agent tampers with its container; grading runs in a warm container (a hit: warm
    containers are kept by the image name the agent's was created from), where the tampering is
    absent, so a patch that fixes nothing stays unresolved."""
    from fixtures_envd import GOOD_PATCH

    script = ("cd /testbed\necho '>>>>> Start Test Output'\n"
              "if [ -e /testbed/TAMPERED ] || python3 -c 'from calc import add; assert add(2, 3) == 5'; "
              "then echo 'PASSED test_calc.py::test_add'; else echo 'FAILED test_calc.py::test_add'; fi\n"
              "echo '>>>>> End Test Output'\n")
    instance = {"instance_id": "swarl__calc-1", "repo": "swarl/calc", "eval_script": script,
                "problem_statement": "add(2, 3) is not 5", "FAIL_TO_PASS": ["test_calc.py::test_add"],
                "PASS_TO_PASS": []}
    noop = GOOD_PATCH.replace("+    return a + b", "+    return a - b  # same")
    svc = envd_factory(sets=["envd.warm_per_image=1", "envd.warm_max=1"])
    with httpx.Client(base_url=svc.url, headers={"Authorization": f"Bearer {svc.token}"}, timeout=120) as api:
        agent = api.post("/container/create", json={"image": test_image}).json()["container_id"]
        api.post("/container/exec", json={"container_id": agent, "command": "touch /testbed/TAMPERED"})
        _until(lambda: api.get("/status").json()["warm"].get(test_image) == 1, what="a warm container")
        ev = api.post("/container/evaluate", json={"container_id": agent, "patch": noop,
                                                   "instance": instance}).json()
        assert ev["ok"] and ev["resolved"] is False, ev
        assert _takes(api) == {"miss": 1.0, "hit": 1.0}
        ev = api.post("/container/evaluate", json={"container_id": agent, "patch": GOOD_PATCH,
                                                   "instance": instance}).json()
        assert ev["resolved"] is True, ev
        api.post("/container/destroy", json={"container_id": agent})
