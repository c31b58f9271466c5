"""An agent's command that ends its own container (kill -9 -1 takes the main process, whichever way
commands run) must leave its episode with no patch, as a broken repository does: later commands
and the diff are answered (never a 404, which the actor takes for a lost lease and reruns the
episode, sparing it the penalty). A container the engine stopped (docker stop or kill, between
commands or during one) stays a lost container: that is infrastructure, not the agent."""

from __future__ import annotations

import re
import secrets
import threading
import time
from collections.abc import Iterator
from typing import Any

import docker
import httpx
import pytest
from fixtures_envd import NO_GRADE_CACHE, start_envd
from polling import wait_until

pytestmark = pytest.mark.docker


@pytest.fixture(scope="module", params=["shell", "docker_exec"])
def api(request, docker_url: str, envd_token: str, tmp_path_factory) -> Iterator[httpx.Client]:
    sets = [] if request.param == "shell" else ["envd.exec_shell=false"]
    svc = start_envd(envd_token, tmp_path_factory.mktemp("ended-envd"), f"ended-{request.param}-{secrets.token_hex(3)}", sets=sets,
                     env={"DOCKER_HOST": docker_url, "SWARL_REDIS_URL": "", **NO_GRADE_CACHE})
    try:
        with httpx.Client(base_url=svc.url, headers={"Authorization": f"Bearer {svc.token}"}, timeout=90) as c:
            yield c
    finally:
        svc.stop()


def _create(api: httpx.Client, image: str) -> str:
    r = api.post("/container/create", json={"image": image})
    assert r.status_code == 200, r.text
    return str(r.json()["container_id"])


def _exec(api: httpx.Client, cid: str, command: str, timeout: float = 10) -> httpx.Response:
    return api.post("/container/exec", json={"container_id": cid, "command": command, "timeout": timeout})


def _ended_count(api: httpx.Client) -> float:
    m = re.search(r"^envd_containers_ended_by_command_total (\S+)$", api.get("/metrics").text, re.M)
    return float(m.group(1)) if m else 0.0


def test_a_command_that_ends_its_container_leaves_the_episode_no_patch(api, test_image, docker_url):
    cid = _create(api, test_image)
    dc = docker.DockerClient(base_url=docker_url)
    try:
        before = _ended_count(api)
        assert _exec(api, cid, "echo x >> calc.py").json()["returncode"] == 0  # a change a diff would show
        assert _exec(api, cid, "kill -9 -1; sleep 5").status_code == 200
        # the engine takes a moment to see its init leave
        wait_until(lambda: not dc.api.inspect_container(cid)["State"]["Running"], 10, "the container to stop")
        for _ in range(2):  # every later command is answered, none runs
            r = _exec(api, cid, "echo ran-it")
            assert r.status_code == 200, r.text
            out = r.json()
            assert out["returncode"] == -1 and "ran-it" not in out["output"], out
            assert "has stopped: " in out["output"] and "ended its main process" in out["output"], out
        d = api.post("/container/diff", json={"container_id": cid})
        assert d.status_code == 200, d.text
        body = d.json()
        # what envd.client reads as DiffFailed: the actor's no patch, reward_unresolved
        assert body["ok"] and body["patch"] == "" and body["returncode"] != 0 and "stopped" in body["error"], body
        assert _ended_count(api) == before + 1
        assert api.post("/container/heartbeat", json={"container_id": cid}).status_code == 200
    finally:
        assert api.post("/container/destroy", json={"container_id": cid}).status_code == 200
    with pytest.raises(docker.errors.NotFound):
        dc.api.inspect_container(cid)
    dc.close()


def test_the_engine_stopping_a_container_between_commands_is_a_lost_container(api, test_image, docker_url):
    cid = _create(api, test_image)
    dc = docker.DockerClient(base_url=docker_url)
    assert _exec(api, cid, "echo one").json()["returncode"] == 0
    time.sleep(1.5)  # outside the command's time
    dc.api.stop(cid, timeout=0)
    r = _exec(api, cid, "echo two")
    assert r.status_code == 404, r.text
    with pytest.raises(docker.errors.NotFound):  # envd forgot it, and removed it
        dc.api.inspect_container(cid)
    dc.close()


def test_the_engine_killing_a_container_during_a_command_is_a_lost_container(api, test_image, docker_url):
    cid = _create(api, test_image)
    dc = docker.DockerClient(base_url=docker_url)
    got: dict[str, Any] = {}

    def run() -> None:
        got["r"] = _exec(api, cid, "sleep 4; echo done")

    t = threading.Thread(target=run)
    t.start()
    time.sleep(1.0)
    dc.api.kill(cid)  # an operator's docker kill (or a daemon shutdown) while the command runs
    t.join(30)
    assert got["r"].status_code in (200, 404), got["r"].text
    r = _exec(api, cid, "echo two")
    assert r.status_code == 404, r.text  # not the agent's doing: the lease is lost
    with pytest.raises(docker.errors.NotFound):  # and envd forgot it
        dc.api.inspect_container(cid)
    dc.close()


def test_a_stop_outside_every_command_is_a_lost_container(api, test_image, docker_url):
    """The window alone (no engine signal at all): a process the agent left behind ends the
    container 4 s after its command's answer, past the grace, so nothing shows a command did it.
    That stays a lost container (docs/reliability.md names this gap)."""
    cid = _create(api, test_image)
    dc = docker.DockerClient(base_url=docker_url)
    out = _exec(api, cid, "setsid sh -c 'sleep 4; kill -9 -1' >/dev/null 2>&1 < /dev/null & echo left").json()
    assert out["output"] == "left\n", out
    wait_until(lambda: not dc.api.inspect_container(cid)["State"]["Running"], 15, "the container to stop")
    r = _exec(api, cid, "echo two")
    assert r.status_code == 404, r.text
    dc.close()
