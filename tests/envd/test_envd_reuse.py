"""envd's reused containers (envd.reuse) against a real dockerd: a container whose lease ended is
reset and handed to the next create of its image that allows reuse, holding nothing of its
episode — no file in the repository (its .git included), no process; an episode that changed
anything outside the repository, wherever, makes the reset unverifiable and the container is
destroyed; a grading container is never a reused one."""

from __future__ import annotations

import time

import docker
import docker.errors
import httpx
import pytest
from fixtures_envd import GOOD_PATCH
from polling import wait_until
from test_envd_evaluate import INSTANCE

pytestmark = pytest.mark.docker

# the repository as a file list with modes, owners, sizes, link targets and contents
REPO_STATE = ("cd / && find /testbed -printf '%y %m %U %G %s %p -> %l\\n' | LC_ALL=C sort && "
              "find /testbed -type f -print0 | LC_ALL=C sort -z | xargs -0r sha256sum")
# the container's processes but this exec's own (its pipeline's processes come and go as it
# runs: `timeout` leads one process group with all of them)
PROCS = """ps -eo pgid=,comm= | awk -v me="$(ps -o pgid= -p $$)" '$1 != me {print $2}' | sort | uniq -c"""
# an episode that changes only the repository, including what git would run later, and leaves
# processes behind: one sleeping, one still writing into the repository
IN_REPO = ("echo changed >> calc.py && echo new > new.txt && mkdir -p build && echo x > build/obj && "
           "git -c user.email=a@b -c user.name=a commit -qam 'the episode' && "
           "git config core.fsmonitor 'touch /tmp/fsmonitor-ran; false' && "
           "printf '#!/bin/sh\\ntouch /tmp/hook-ran\\n' > .git/hooks/post-checkout && chmod +x .git/hooks/post-checkout && "
           "(setsid nohup sleep 1000 >/dev/null 2>&1 &) && "
           "(setsid nohup sh -c 'while true; do date > /testbed/late; sleep 0.2; done' >/dev/null 2>&1 &) && true")
# the files Docker mounts into a container (not in docker diff): written again at every start
DOCKER_FILES = "echo other > /etc/hostname && echo '10.0.0.1 pypi.org' >> /etc/hosts"
OUTSIDE = {
    "tmp": "echo secret > /tmp/answer",
    "home": "mkdir -p /root/.cache/pip && echo x > /root/.cache/pip/log",
    "site_packages": "echo 'import os' > /usr/lib/python3/dist-packages/zz_episode.pth",
    "usr_file": "echo 'VARIANT=episode' >> /usr/lib/os-release",
    "dir_mode": "chmod 700 /srv",
    "background_writer": "(setsid nohup sh -c 'echo x > /var/tmp/bg; sleep 1000' >/dev/null 2>&1 &) && sleep 0.5",
}


@pytest.fixture
def envd(envd_factory):
    return envd_factory(sets=["envd.reuse_per_image=2", "envd.reuse_max=4", "envd.reuse_idle_s=60",
                              "envd.reap_interval_s=0.5"])


@pytest.fixture
def api(envd):
    with httpx.Client(base_url=envd.url, headers={"Authorization": f"Bearer {envd.token}"}, timeout=180) as c:
        yield c


def _metric(api: httpx.Client, name: str, result: str) -> float:
    for line in api.get("/metrics").text.splitlines():
        if line.startswith(f'{name}{{result="{result}"}}'):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def _exists(docker_url: str, cid: str) -> bool:
    client = docker.DockerClient(base_url=docker_url)
    try:
        client.api.inspect_container(cid)
        return True
    except docker.errors.NotFound:
        return False
    finally:
        client.close()


def _create(api: httpx.Client, image: str, reuse: bool = True) -> str:
    out = api.post("/container/create", json={"image": image, "reuse": reuse}).json()
    assert out["ok"], out
    return str(out["container_id"])


def _run(api: httpx.Client, cid: str, command: str) -> str:
    out = api.post("/container/exec", json={"container_id": cid, "command": command, "timeout": 60}).json()
    assert out["ok"] and out["returncode"] == 0, out
    return str(out["output"])


def _resets_done(api: httpx.Client, before: float, timeout: float = 90.0) -> None:
    def resets() -> float:
        return _metric(api, "envd_reuse_resets_total", "ok") + _metric(api, "envd_reuse_resets_total", "failed")
    wait_until(lambda: resets() > before, timeout, "the reset to end")


def _release(api: httpx.Client, cid: str) -> None:
    before = _metric(api, "envd_reuse_resets_total", "ok") + _metric(api, "envd_reuse_resets_total", "failed")
    assert api.post("/container/destroy", json={"container_id": cid}).json()["ok"]
    _resets_done(api, before)


def test_a_reset_container_holds_nothing_of_its_episode(api, test_image):
    fresh = _create(api, test_image, reuse=False)
    clean, procs, hosts = _run(api, fresh, REPO_STATE), _run(api, fresh, PROCS), _run(api, fresh, "cat /etc/hosts")
    assert "ps" not in procs.split() and "docker-init" in procs.split(), procs  # not the reader's own
    cid = _create(api, test_image)
    _run(api, cid, IN_REPO)
    _run(api, cid, DOCKER_FILES)
    assert _run(api, cid, "git log --oneline | wc -l").strip() == "2" and "sleep" in _run(api, cid, PROCS)
    _release(api, cid)
    assert _metric(api, "envd_reuse_resets_total", "ok") == 1
    assert api.get("/status").json()["reuse"] == {test_image: 1}

    again = _create(api, test_image)
    assert again == cid and _metric(api, "envd_reuse_takes_total", "hit") == 1
    time.sleep(0.5)  # the writer, had it survived, would have written /testbed/late by now
    assert _run(api, again, REPO_STATE) == clean  # the base commit, .git included: no commit, config or hook
    # docker-init and sleep infinity: an earlier exec's shells can still be exiting for a moment on
    # a loaded machine (seen once in CI), an episode's survivor stays for good
    seen: list[str] = []

    def only_init() -> bool:
        seen.append(_run(api, again, PROCS))
        return seen[-1] == procs
    wait_until(only_init, 10, every=0.5,
               what=lambda: f"the episode's processes to be gone after the reset; last:\n{seen[-1]}\nwanted:\n{procs}")
    _run(api, again, "git status --porcelain && test -z \"$(git status --porcelain)\"")
    # git ran in the repository above: had the reset (or this) run the episode's config or hook
    assert _run(api, again, "ls -A /tmp").split() == []
    assert _run(api, again, "cat /etc/hostname").strip() == again[:12] and _run(api, again, "cat /etc/hosts") == hosts
    api.post("/container/destroy", json={"container_id": fresh})


@pytest.mark.parametrize("episode", sorted(OUTSIDE))
def test_an_unverifiable_reset_destroys_the_container(api, test_image, docker_url, episode):
    cid = _create(api, test_image)
    _run(api, cid, OUTSIDE[episode])
    _release(api, cid)
    assert _metric(api, "envd_reuse_resets_total", "failed") == 1
    assert not _exists(docker_url, cid) and api.get("/status").json()["reuse"] == {}
    nxt = _create(api, test_image)
    assert nxt != cid and _metric(api, "envd_reuse_takes_total", "miss") == 2
    # the next one is fresh: nothing in the temporary directories, no episode's sleeper
    assert _run(api, nxt, "find /tmp /var/tmp -mindepth 1 | wc -l; pgrep -fc '^sleep 1000' || true").split() == ["0", "0"]


def test_any_container_of_the_image_is_reset_to_its_first_ones_state(api, test_image):
    """The image's fresh state is recorded once, from its first container; a second one, used
    and reset, is checked against it (its own hostname, the same repository)."""
    first, second = _create(api, test_image), _create(api, test_image)
    clean = _run(api, first, REPO_STATE)
    _run(api, second, IN_REPO)
    _release(api, second)
    assert _metric(api, "envd_reuse_resets_total", "ok") == 1
    again = _create(api, test_image)
    assert again == second and _run(api, again, REPO_STATE) == clean
    assert _run(api, again, "cat /etc/hostname").strip() == second[:12]
    api.post("/container/destroy", json={"container_id": first})


def test_grading_and_plain_creates_never_get_a_reused_container(api, test_image):
    cid = _create(api, test_image)
    _release(api, cid)
    assert api.get("/status").json()["reuse"] == {test_image: 1}
    agent = _create(api, test_image, reuse=False)  # a create that does not allow reuse: a new one
    assert agent != cid
    ev = api.post("/container/evaluate", json={"container_id": agent, "patch": GOOD_PATCH,
                                               "instance": INSTANCE}).json()
    assert ev["ok"] and ev["resolved"] is True, ev
    # grading created its own fresh container: the reset one is still there, untaken
    assert api.get("/status").json()["reuse"] == {test_image: 1}
    assert _metric(api, "envd_reuse_takes_total", "hit") == 0
    api.post("/container/destroy", json={"container_id": agent})
