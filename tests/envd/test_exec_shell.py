"""envd.exec_shell (envd/shell.py) against a real dockerd: a command through an agent container's
shell server answers what `docker exec` answers (code, output, stderr, timeouts, the cap, what
background children write and how long they hold the answer), grading never uses it, and a
command that kills or robs the server gets a bounded answer and leaves the container usable or
gone, never hung."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from typing import Any

import docker
import httpx
import pytest
from fixtures_envd import EVAL_SCRIPT, GOOD_PATCH

from envd.config import EnvdConfig
from envd.docker_backend import DockerBackend, ExecOutcome

pytestmark = pytest.mark.docker

# (command, cwd, env, timeout, stderr): each is run by docker exec and through the shell
SAME = {
    "code_stdout_stderr_env": ("pwd; echo $FOO; echo err >&2; exit 3", "/testbed", {"FOO": "b a'r $x"}, 30, True),
    "no_newline": ("printf 'no newline'", "/testbed", {}, 30, True),
    "stdin_is_empty": ("cat; wc -c", "/testbed", {}, 30, True),
    "login_shell": ("shopt -q login_shell && echo login; echo $HOME; id -u; cat /etc/hostname", None, {}, 30, True),
    "image_workdir": ("pwd", None, {}, 30, True),
    "missing_dir": ("cd /no/such/dir", "/testbed", {}, 30, True),
    "late_child_output": ("(sleep 0.5; echo late) & echo early", "/testbed", {}, 30, True),
    "quiet_child": ("sleep 30 >/dev/null 2>&1 & echo detached", "/testbed", {}, 30, True),
    "stderr_dropped": ("echo out; echo err >&2", "/testbed", {}, 30, False),
    "over_the_cap": ("echo START; head -c 300000 /dev/zero | tr '\\0' x; echo; echo END", "/testbed", {}, 30, True),
    "timeout": ("echo before; sleep 30", "/testbed", {}, 1, True),
    "binary": ("printf '\\x00\\xff\\xfe ok'", "/testbed", {}, 30, True),
}

BOTH_STREAMS = {"code_stdout_stderr_env": "/testbed\nb a'r $x\nerr\n"}


@pytest.fixture(scope="module")
def engine(docker_url: str) -> Iterator[docker.APIClient]:
    """The Docker API, to look at containers from outside envd (closed after the module)."""
    client = docker.DockerClient(base_url=docker_url)
    yield client.api
    client.close()


@pytest.fixture(scope="module")
def backend(docker_url: str) -> Iterator[DockerBackend]:
    b = DockerBackend(EnvdConfig(), "test-shell", docker_url)
    yield b
    b.close()


@pytest.fixture
def agent(backend: DockerBackend, test_image: str) -> Iterator[str]:
    cid, _, labels = backend.create(test_image, "shell-test", 600, None, with_shell=True)
    assert labels["swarl.shell"] == "1"
    yield cid
    backend.destroy(cid)


def _both(backend: DockerBackend, cid: str, case: tuple[Any, ...]) -> tuple[ExecOutcome, ExecOutcome]:
    command, cwd, env, timeout, stderr = case
    plain = backend.exec(cid, command, cwd, env, timeout, 262144, stderr=stderr, via_shell=False)
    shelled = backend.exec(cid, command, cwd, env, timeout, 262144, stderr=stderr, via_shell=True)
    return plain, shelled


@pytest.mark.parametrize("name", sorted(SAME))
def test_the_shell_answers_what_docker_exec_answers(backend, agent, name):
    plain, shelled = _both(backend, agent, SAME[name])
    assert plain.via == "exec" and shelled.via == "shell"
    if name in BOTH_STREAMS:
        # docker copies stdout and stderr through two pipes, so their order varies (seen in CI);
        # through the shell they share one pipe and keep the order the command wrote them in
        assert sorted(shelled.output.splitlines()) == sorted(plain.output.splitlines()), name
        assert shelled.output == BOTH_STREAMS[name]
        plain.output = shelled.output
    assert (shelled.returncode, shelled.output, shelled.timed_out, shelled.truncated) == \
        (plain.returncode, plain.output, plain.timed_out, plain.truncated), name
    # how long children that keep the output open hold the answer: as docker exec, ~2 s at most
    assert abs(shelled.duration_s - plain.duration_s) < 1.5, (plain.duration_s, shelled.duration_s)
    if name == "timeout":
        assert shelled.returncode == -1 and shelled.timed_out and shelled.output == "before\n"
    if name == "over_the_cap":
        assert shelled.truncated and shelled.output.startswith("START") and shelled.output.rstrip().endswith("END")


def test_a_timeout_kills_what_the_command_left_behind(backend, agent):
    cmd = "setsid sh -c 'sleep 6; touch /tmp/escaped' & sleep 6; touch /tmp/fg"
    out = backend.exec(agent, cmd, "/testbed", {}, 1, 262144, via_shell=True)
    assert out.via == "shell" and out.timed_out and out.returncode == -1
    ps = backend.exec(agent, "ps -eo args", "/", {}, 10, 262144, via_shell=True)
    assert "sleep 6" not in ps.output, ps.output


def test_what_the_shell_cannot_pass_goes_by_docker_exec(backend, agent):
    out = backend.exec(agent, "env | grep -c '^A-B=1$'", "/testbed", {"A-B": "1"}, 10, 262144, via_shell=True)
    assert out.via == "exec" and out.output.strip() == "1"


def test_a_container_made_without_the_shell_runs_sleep_and_docker_exec(backend, test_image, engine):
    cid, _, labels = backend.create(test_image, "shell-test", 600, None)
    try:
        assert "swarl.shell" not in labels
        attrs = engine.inspect_container(cid)
        # `sleep infinity` (after writing /etc/hosts: envd.network_disabled, tests/envd/test_network_disabled.py)
        assert attrs["Config"]["Entrypoint"][-1].endswith("exec sleep infinity") and not attrs["Config"]["OpenStdin"]
        assert backend.exec(cid, "echo hi", "/", {}, 10, 1024, via_shell=True).via == "exec"
        rows = [r[-1] for r in engine.top(cid)["Processes"]]
        assert rows[1:] == ["sleep infinity"] and "docker-init" in rows[0], rows
    finally:
        backend.destroy(cid)


def test_a_restarted_container_gets_a_new_shell(backend, agent):
    assert backend.exec(agent, "echo one", "/", {}, 10, 1024, via_shell=True).via == "shell"
    backend.restart(agent)
    out = backend.exec(agent, "echo two", "/", {}, 10, 1024, via_shell=True)
    assert (out.via, out.output, out.returncode) == ("shell", "two\n", 0)


def _pids(engine: docker.APIClient, cid: str) -> int:
    return int(engine.stats(cid, stream=False)["pids_stats"]["current"])


def test_no_pid_to_fork_ends_the_server_not_the_container(backend, agent, engine):
    """dash exits when a fork fails (CI saw a fork bomb take every pid between two of the server's
    forks): the container must live on, as it did under `sleep infinity`, and envd go by docker exec."""
    assert backend.exec(agent, "echo warm", "/", {}, 10, 1024, via_shell=True).via == "shell"

    def pids_limit(n: int) -> None:  # docker-py's update_container has no pids_limit; the Engine API does
        engine._raise_for_status(engine._post_json(engine._url("/containers/{0}/update", agent), data={"PidsLimit": n}))

    pids_limit(_pids(engine, agent))  # the idle server's own: no fork left
    t0 = time.monotonic()
    out = backend.exec(agent, "echo lost", "/", {}, 30, 1024, via_shell=True)
    assert (out.via, out.returncode, out.timed_out) == ("shell", -1, False), out
    assert "shell ended" in out.output and time.monotonic() - t0 < 10, out
    pids_limit(256)
    assert engine.inspect_container(agent)["State"]["Running"]
    after = backend.exec(agent, "echo back; ps -o args= --ppid 1", "/", {}, 10, 1024, via_shell=True)
    assert (after.via, after.returncode) == ("exec", 0), after
    assert after.output.startswith("back\n") and "sleep infinity" in after.output, after.output


def test_a_command_that_ends_the_servers_loop_is_answered_and_swept(backend, agent):
    # the loop is the main process's child (pid 1 is Docker's init); what the command left running
    # is killed with it, as after a timeout
    loop = "$(ps -o pid= --ppid $(ps -o pid= --ppid 1 | head -1) | head -1)"
    out = backend.exec(agent, f"sleep 100 >/dev/null 2>&1 & sleep 0.2; kill -9 {loop}; sleep 5; echo never",
                       "/", {}, 30, 1024, via_shell=True)
    assert (out.via, out.returncode) == ("shell", -1) and "shell ended" in out.output and out.duration_s < 4, out
    left = backend.exec(agent, "pgrep -fc '^sleep (100|5)$' || true", "/", {}, 10, 1024, via_shell=True)
    assert (left.via, left.output.strip()) == ("exec", "0"), left


# -- through envd --------------------------------------------------------------------------

def _h(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture
def api(envd_server: Any) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=envd_server.url, headers=_h(envd_server.token), timeout=90) as c:
        yield c


def _via(api: httpx.Client) -> dict[str, float]:
    got = dict(re.findall(r'^envd_exec_via_total\{via="(\w+)"\} (\S+)$', api.get("/metrics").text, re.M))
    return {k: float(got.get(k, 0)) for k in ("shell", "exec")}


def _create(api: httpx.Client, image: str) -> str:
    r = api.post("/container/create", json={"image": image})
    assert r.status_code == 200, r.text
    return str(r.json()["container_id"])


def test_agents_commands_go_through_the_shell_and_grading_never_does(api, test_image):
    cid = _create(api, test_image)
    try:
        before = _via(api)
        out = api.post("/container/exec", json={"container_id": cid, "command": "echo hi"}).json()
        assert out["returncode"] == 0 and out["output"] == "hi\n"
        d = api.post("/container/diff", json={"container_id": cid}).json()
        assert d["ok"] and d["patch"] == ""
        mid = _via(api)
        assert mid["shell"] == before["shell"] + 2 and mid["exec"] == before["exec"]
        ev = api.post("/container/evaluate", json={"container_id": cid, "patch": GOOD_PATCH,
                                                   "eval_script": EVAL_SCRIPT}).json()
        assert ev["resolved"] is True, ev
        after = _via(api)
        assert after["shell"] == mid["shell"] and after["exec"] > mid["exec"]  # the grading container's
    finally:
        api.post("/container/destroy", json={"container_id": cid})


def test_a_command_that_kills_the_shell_gets_an_answer_and_the_container_is_ended(api, test_image):
    cid = _create(api, test_image)
    try:
        out = api.post("/container/exec", json={"container_id": cid, "command": "kill -9 -1", "timeout": 10}).json()
        assert out["ok"] and out["returncode"] == -1 and "shell ended" in out["output"], out
        # its main process ended, as when `sleep infinity` was killed: the agent's own doing
        # (tests/envd/test_ended_by_command.py), so answered, never a lost container
        r = api.post("/container/exec", json={"container_id": cid, "command": "true"})
        assert r.status_code == 200 and "has stopped" in r.json()["output"], r.text
    finally:
        api.post("/container/destroy", json={"container_id": cid})


def test_a_command_that_steals_the_shells_input_cannot_hang_envd(api, test_image):
    cid = _create(api, test_image)
    try:
        # the thief must be blocked reading the server's stdin before the next command is sent: a
        # pipe wakes its readers in the order they began to wait, so then it, not the server, gets
        # the line. A fixed sleep lost that race on a loaded machine (CI, stop 55).
        thief = ('srv=$(ps -o pid= --ppid 1 | head -1 | tr -d " "); p=$(readlink /proc/$srv/fd/0); '
                 'setsid nohup cat /proc/$srv/fd/0 >/dev/null 2>&1 & t=$!; '
                 'for i in $(seq 400); do '
                 '  if ls -l /proc/$t/fd 2>/dev/null | grep -qF "$p" && grep -q "^State:.*S" /proc/$t/status; '
                 '  then echo started; exit 0; fi; sleep 0.05; '
                 'done; echo "the thief never read"')
        out = api.post("/container/exec", json={"container_id": cid, "command": thief, "timeout": 60}).json()
        assert out["output"] == "started\n", out
        t0 = time.monotonic()
        out = api.post("/container/exec", json={"container_id": cid, "command": "echo lost", "timeout": 1}).json()
        assert out["ok"] and out["returncode"] == -1 and out["timed_out"], out
        # bounded: timeout + kill grace (5) + the shell's own slack
        assert time.monotonic() - t0 < 1 + 5 + 8
        # a shell that failed a command is not trusted again: docker exec from here on
        before = _via(api)
        for _ in range(3):
            out = api.post("/container/exec", json={"container_id": cid, "command": "echo back"}).json()
            assert out["returncode"] == 0 and out["output"] == "back\n"
        assert _via(api)["exec"] == before["exec"] + 3
    finally:
        api.post("/container/destroy", json={"container_id": cid})
