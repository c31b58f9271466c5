"""The agent is untrusted: hostile commands in its container, against a real dockerd and a real
`swarl envd serve`. Each is contained (limits, output cap, timeouts that kill the whole process
tree), envd keeps answering (p95 of /healthz polled in parallel under 200 ms) and the next
episode on the node (a fresh container) works as if nothing had happened.

The node runs with small limits (256 MiB, 256 pids) so the tests are quick; the mechanisms are
the defaults' (docs/reliability.md has the measured figures). `make test` runs the fork bomb,
the memory hog, the output flood and the ignored SIGTERMs (the last three with a 3 s exec
timeout); `make chaos` runs every command at its full timeout."""

from __future__ import annotations

import asyncio
import json
import secrets
import shlex
import time
from dataclasses import dataclass, replace

import docker
import httpx
import pytest

pytestmark = [pytest.mark.docker]

CAP = 65536
LIMITS = ["envd.memory=256m", "envd.pids_limit=256", f"envd.output_cap_bytes={CAP}", "envd.kill_grace_s=2"]


@dataclass
class Hostile:
    command: str
    timeout: float = 6.0


HOSTILE = {
    "fork_bomb": Hostile(":(){ :|:& };:"),
    "memory_hog": Hostile("python3 -c 'a = []\nwhile True: a.append(bytearray(32 << 20))'"),
    "gigabyte_of_output": Hostile("head -c 1000000000 /dev/zero | tr '\\0' a", timeout=8.0),
    "rm_rf_root": Hostile("rm -rf --no-preserve-root / 2>/dev/null; echo gone", timeout=60.0),
    "kills_its_container": Hostile("kill -9 -1; sleep 3; echo never"),
    "ignores_sigterm": Hostile("trap '' TERM; while :; do sleep 1; done"),
    "ignores_sigterm_in_own_session": Hostile(
        "setsid bash -c 'trap \"\" TERM; while :; do sleep 1; done'; echo never"),
    "writes_outside_testbed": Hostile(
        "echo owned > /etc/owned && echo 'import os' > /usr/lib/python3/dist-packages/sitecustomize.py"
        " && mkdir -p /root/.ssh && echo key > /root/.ssh/authorized_keys && echo written"),
}
# `make test` runs these, those that can only end by their timeout with it cut to FAST_TIMEOUT_S
# (a short version of the same containment checks); `make chaos` runs every one at full length.
FAST = {"fork_bomb", "kills_its_container", "memory_hog", "gigabyte_of_output", "ignores_sigterm", "ignores_sigterm_in_own_session"}
FAST_TIMEOUT_S = 3.0
TIMED_OUT_ONLY = {"gigabyte_of_output", "ignores_sigterm", "ignores_sigterm_in_own_session"}


@pytest.fixture(scope="module")
def node(docker_url, envd_token, tmp_path_factory, test_image):
    from fixtures_envd import start_envd

    # a node id of its own: xdist may start this module's fixture on both workers, and an envd's start-up
    # sweep destroys the containers of its node id that it does not own
    svc = start_envd(envd_token, tmp_path_factory.mktemp("hostile-envd"), f"hostile-{secrets.token_hex(3)}", sets=LIMITS,
                     env={"DOCKER_HOST": docker_url, "SWARL_REDIS_URL": ""})
    yield svc
    svc.stop()


async def _healthz_probe(c: httpx.AsyncClient, stop: asyncio.Event, lat: list[float]) -> None:
    while not stop.is_set():
        t = time.monotonic()
        r = await c.get("/healthz")
        assert r.status_code == 200, r.text
        lat.append((time.monotonic() - t) * 1000)
        await asyncio.sleep(0.05)


def _p95(xs: list[float]) -> float:
    xs = sorted(xs)
    return xs[max(0, int(len(xs) * 0.95) - 1)]


# what a fresh agent container runs: Docker's init, envd's shell server (its subshells, one not yet
# reaped, the cat copying the output) and the probing command itself
_OURS = r"^(/sbin/docker-init |sh -c |\[sh\] <defunct>$|cat$|timeout |bash -lc |ps |grep )"


async def _next_episode_works(c: httpx.AsyncClient, image: str) -> None:
    """A fresh container on the same node: exec, a file write in /testbed, diff, all as usual."""
    cid = (await c.post("/container/create", json={"image": image})).json()["container_id"]
    try:
        r = (await c.post("/container/exec", json={
            "container_id": cid, "command": "test ! -e /etc/owned && python3 -c 'print(6*7)' && "
            "echo x >> calc.py && { ps -eo args= | grep -cvE " + shlex.quote(_OURS) + " || true; }",
            "timeout": 30})).json()
        assert r["returncode"] == 0 and r["output"].split() [0] == "42", r
        assert int(r["output"].split()[1]) == 0, r       # nothing runs but envd's shell and this command
        d = (await c.post("/container/diff", json={"container_id": cid})).json()
        assert d["returncode"] == 0 and "+x" in d["patch"], d
    finally:
        await c.post("/container/destroy", json={"container_id": cid})


async def _run_hostile(name: str, node, image: str, docker_url: str, exec_timeout: float | None = None) -> None:
    h = HOSTILE[name] if exec_timeout is None else replace(HOSTILE[name], timeout=min(exec_timeout, HOSTILE[name].timeout))
    headers = {"Authorization": f"Bearer {node.token}"}
    dc = docker.DockerClient(base_url=docker_url)
    async with httpx.AsyncClient(base_url=node.url, headers=headers, timeout=300) as c:
        cid = (await c.post("/container/create", json={"image": image})).json()["container_id"]
        try:
            lat: list[float] = []
            stop = asyncio.Event()
            probe = asyncio.create_task(_healthz_probe(c, stop, lat))
            t0 = time.monotonic()
            r = await c.post("/container/exec", json={"container_id": cid, "command": h.command,
                                                      "timeout": h.timeout})
            took = time.monotonic() - t0
            stats = await asyncio.to_thread(dc.api.stats, cid, stream=False)
            stop.set()
            await probe
            assert r.status_code == 200, r.text
            out = r.json()
            print(json.dumps({"hostile": name, "exec_s": round(took, 1), "returncode": out["returncode"],
                              "timed_out": out["timed_out"], "truncated": out["truncated"],
                              "output_bytes": len(out["output"]), "pids": stats["pids_stats"].get("current"),
                              "healthz_p95_ms": round(_p95(lat)), "healthz_max_ms": round(max(lat))}))
            # bounded: the exec's own timeout plus envd's sweep
            assert took < h.timeout + 2 + 15, (took, out)
            assert len(out["output"]) <= CAP + 200, len(out["output"])
            assert len(lat) >= (3 if took > 1 else 1) and _p95(lat) < 200, (name, _p95(lat), max(lat))
            assert stats["pids_stats"].get("current", 0) <= 256
            if name == "memory_hog":
                assert out["returncode"] == 137, out                      # OOM-killed inside
            if name == "gigabyte_of_output":
                assert out["truncated"] and "bytes of output cut by envd" in out["output"], out["output"][:200]
            if name.startswith("ignores_sigterm"):
                assert out["timed_out"] and out["returncode"] == -1, out
                left = (await c.post("/container/exec", json={
                    "container_id": cid, "command": "ps -eo args= | grep -cE '^sleep 1$|[t]rap' || true"})).json()
                assert left["output"].strip() == "0", left                 # the whole tree is gone
            if name in ("rm_rf_root", "fork_bomb", "kills_its_container"):
                # the agent broke its own container: git fails there (or, the container ended by
                # its command, envd answers so: tests/envd/test_ended_by_command.py), which the
                # actor grades as no patch (never an infrastructure failure that would spare it the -1)
                # (git fails, or, when the bomb's forks let it run, leaves no change: the shell's
                # complaints never count as a patch)
                d = (await c.post("/container/diff", json={"container_id": cid})).json()
                assert d["ok"] and (d["returncode"] != 0 or d["patch"] == ""), d
            attrs = await asyncio.to_thread(dc.api.inspect_container, cid)
            assert not attrs["HostConfig"]["Binds"] and not attrs["Mounts"]  # nothing of the host to reach
            assert attrs["HostConfig"]["SecurityOpt"] == ["no-new-privileges"]
        finally:
            await c.post("/container/destroy", json={"container_id": cid})
        await _next_episode_works(c, image)
        assert (await c.get("/healthz")).json()["running_containers"] == 0
    dc.close()


@pytest.mark.parametrize("name", sorted(FAST))
async def test_hostile_command_is_contained_fast(name, node, test_image, docker_url):
    await _run_hostile(name, node, test_image, docker_url,
                       exec_timeout=FAST_TIMEOUT_S if name in TIMED_OUT_ONLY else None)


@pytest.mark.chaos
@pytest.mark.parametrize("name", sorted(HOSTILE))
async def test_hostile_command_is_contained(name, node, test_image, docker_url):
    await _run_hostile(name, node, test_image, docker_url)
