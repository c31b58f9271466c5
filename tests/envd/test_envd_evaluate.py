"""/container/evaluate with `instance`: SWE-bench grading in a fresh container from the
agent's image (tampering in the agent's container does not count), per-test status, bad
patches unresolved with the reason, bounded eval timeouts."""

from __future__ import annotations

import json

import docker
import httpx
import pytest
from fixtures_envd import GOOD_PATCH

pytestmark = pytest.mark.docker

# Passes test_add when the fix is in, or when the agent's container was tampered with.
EVAL = """cd /testbed
echo '>>>>> Start Test Output'
if [ -e /testbed/TAMPERED ] || python3 -c 'from calc import add; assert add(2, 3) == 5' 2>/dev/null; then
  echo 'PASSED test_calc.py::test_add'
else
  echo 'FAILED test_calc.py::test_add'
fi
echo 'PASSED test_calc.py::test_other'
echo '>>>>> End Test Output'
"""
INSTANCE = {"instance_id": "swarl__calc-1", "repo": "swarl/calc", "eval_script": EVAL,
            "problem_statement": "add(2, 3) is not 5",
            "FAIL_TO_PASS": '["test_calc.py::test_add"]', "PASS_TO_PASS": ["test_calc.py::test_other"]}
NOOP_PATCH = GOOD_PATCH.replace("+    return a + b", "+    return a - b  # same")


@pytest.fixture
def api(envd_server):
    with httpx.Client(base_url=envd_server.url, headers={"Authorization": f"Bearer {envd_server.token}"},
                      timeout=120) as c:
        yield c


@pytest.fixture
def agent(api, test_image):
    cid = api.post("/container/create", json={"image": test_image}).json()["container_id"]
    api.post("/container/exec", json={"container_id": cid, "command": "touch /testbed/TAMPERED"})
    yield cid
    api.post("/container/destroy", json={"container_id": cid})


def _count(docker_url: str, node_id: str) -> int:
    client = docker.DockerClient(base_url=docker_url)
    try:
        return len(client.api.containers(all=True, filters={"label": f"swarl.owner={node_id}"}))
    finally:
        client.close()


def test_grading_in_a_fresh_container(api, agent, envd_server, docker_url):
    before = _count(docker_url, envd_server.node_id)
    ev = api.post("/container/evaluate", json={"container_id": agent, "patch": GOOD_PATCH,
                                               "instance": INSTANCE}).json()
    assert ev["ok"] and ev["mode"] == "swebench" and ev["resolved"] is True, ev
    assert ev["fail_to_pass"] == {"test_calc.py::test_add": "PASSED"}
    assert ev["pass_to_pass"] == {"test_calc.py::test_other": "PASSED"}
    assert ev["tests_status"] == {"test_calc.py::test_add": "PASSED", "test_calc.py::test_other": "PASSED"}
    # a patch that changes nothing that matters: the tampering in the agent's container is ignored
    ev = api.post("/container/evaluate", json={"container_id": agent, "patch": NOOP_PATCH,
                                               "instance": INSTANCE}).json()
    assert ev["resolved"] is False and ev["fail_to_pass"] == {"test_calc.py::test_add": "FAILED"}, ev
    # the agent's container is untouched by grading, and the fresh ones are gone
    ls = api.post("/container/exec", json={"container_id": agent, "command": "ls TAMPERED; git status --short"})
    assert ls.json()["output"].split() == ["TAMPERED", "??", "TAMPERED"]
    assert _count(docker_url, envd_server.node_id) == before


def test_bad_patches_and_timeouts_are_reported(api, agent, envd_server, docker_url):
    before = _count(docker_url, envd_server.node_id)
    ev = api.post("/container/evaluate", json={"container_id": agent, "patch": "", "instance": INSTANCE})
    assert ev.status_code == 200 and ev.json()["resolved"] is False and "empty patch" in ev.json()["error"]
    conflicting = GOOD_PATCH.replace("-    return a - b", "-    return a ** b")
    ev = api.post("/container/evaluate", json={"container_id": agent, "patch": conflicting, "instance": INSTANCE})
    body = ev.json()
    assert ev.status_code == 200 and body["resolved"] is False and "patch does not apply" in body["error"]
    slow = {**INSTANCE, "eval_script": "echo '>>>>> Start Test Output'; sleep 30"}
    ev = api.post("/container/evaluate", json={"container_id": agent, "patch": GOOD_PATCH, "instance": slow,
                                               "timeout": 2}).json()
    assert ev["resolved"] is False and ev["timed_out"] is True and "timed out" in ev["error"], ev
    ev = api.post("/container/evaluate", json={"container_id": agent, "patch": GOOD_PATCH,
                                               "instance": {**INSTANCE, "FAIL_TO_PASS": "not json"}})
    assert ev.status_code == 422 and "FAIL_TO_PASS" in ev.json()["error"]
    assert _count(docker_url, envd_server.node_id) == before


async def test_bundled_task_graded_through_the_pool(pool_server, docker_url):
    """A real SWE-style row of the bundled suite: gold patch resolved, empty patch and the
    test patch alone not — graded by the harness's pytest parser via the pool's /evaluate."""
    import asyncio

    from envd.client import EnvdClient
    from envd.images import build_task_image, ensure_base_image
    from swe.tasks import load_tasks

    row = load_tasks("all")[0]
    client = docker.DockerClient(base_url=docker_url, timeout=600)
    try:
        await asyncio.to_thread(ensure_base_image, client)
        image, _built = await asyncio.to_thread(build_task_image, client, row)
    finally:
        client.close()
    pool = EnvdClient.pool(pool_server.url, pool_server.token)
    try:
        lease = await pool.allocate(image, row["instance_id"])
        gold = await pool.evaluate(lease.lease_id, row["patch"], instance=row, timeout=300)
        assert gold.resolved, (gold.error, gold.output[-2000:])
        f2p = json.loads(row["FAIL_TO_PASS"])
        assert gold.fail_to_pass == dict.fromkeys(f2p, "PASSED")
        assert set(gold.tests_status) >= set(f2p) | set(json.loads(row["PASS_TO_PASS"]))
        empty = await pool.evaluate(lease.lease_id, "", instance=row, timeout=300)
        assert not empty.resolved and "empty patch" in empty.error
        tests_only = await pool.evaluate(lease.lease_id, row["test_patch"], instance=row, timeout=300)
        assert not tests_only.resolved
        assert set(tests_only.fail_to_pass.values()) != {"PASSED"}
        await pool.close(lease.lease_id)
    finally:
        await pool.aclose()
