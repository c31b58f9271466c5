"""envd grades what a row's adapter says, in real containers: a SWE-smith-shaped row (one image
for the repository, the instance's change applied by the adapter's setup script, pytest on the
FAIL_TO_PASS files, the verbose lines parsed) graded by envd's /container/evaluate.

The repository image is a bundled task's; the row's `patch` (what SWE-smith applies to reach the
instance's state) is that task's test patch, so the FAIL_TO_PASS tests exist only once the setup
script has run: a grade that skipped it would find them missing."""

from __future__ import annotations

import json
from typing import Any

import pytest
from fixtures_tasks import build_task_image, envd_client

from swe import harness
from swe.rows import validate_row
from swe.tasks import load_tasks

pytestmark = [pytest.mark.docker, pytest.mark.slow]


def smith_row(task: dict[str, Any], image: str) -> dict[str, Any]:
    return validate_row({
        "instance_id": f"{task['instance_id'].replace('swarl-tasks__', 'acme__')}.deadbeef.lm_rewrite__x1",
        "repo": "swesmith/acme__statkit.deadbeef", "image_name": image, "patch": task["test_patch"],
        "problem_statement": task["problem_statement"],
        "FAIL_TO_PASS": json.loads(task["FAIL_TO_PASS"]), "PASS_TO_PASS": json.loads(task["PASS_TO_PASS"]),
        # the base image has pytest without conda: the default command with python3's pytest
        "test_cmd": "python3 -m pytest --disable-warnings --color=no --tb=no --verbose "
                    + " ".join(sorted({t.split("::")[0] for t in json.loads(task["FAIL_TO_PASS"])})),
    })


def test_swe_smith_row_graded_by_envd(envd_server: Any, docker_url: str) -> None:
    task = load_tasks("all")[0]
    image = build_task_image(docker_url, task)
    row = smith_row(task, image)
    assert row["dataset_family"] == "swe-smith" and harness.setup_script_for(row)
    with envd_client(envd_server) as api:
        cid = api.post("/container/create", json={"image": image}).json()["container_id"]
        try:
            def evaluate(patch: str) -> dict[str, Any]:
                r = api.post("/container/evaluate", json={"container_id": cid, "patch": patch,
                                                          "instance": row, "timeout": 300})
                assert r.status_code == 200, r.text
                return r.json()

            gold = evaluate(task["patch"])
            assert gold["resolved"], (gold["error"], gold["output"][-3000:])
            assert set(gold["fail_to_pass"].values()) == {"PASSED"}
            unfixed = evaluate("diff --git a/NOTES b/NOTES\nnew file mode 100644\n--- /dev/null\n+++ b/NOTES\n@@ -0,0 +1 @@\n+x\n")
            assert not unfixed["resolved"] and "FAILED" in unfixed["fail_to_pass"].values(), unfixed
            # the tamper rules know the row's test files (FAIL_TO_PASS names them)
            tests = evaluate(task["test_patch"])
            assert not tests["resolved"] and {h["kind"] for h in tests["reward_hack"]} == {"test_files"}
        finally:
            api.post("/container/destroy", json={"container_id": cid})


def test_swe_smith_agent_container_starts_at_the_bug_with_no_way_back(envd_server: Any, docker_url: str) -> None:
    """The actor runs the row's setup script in the agent's container before the first command
    (actors.leased): the instance's change is there and committed, nothing reachable holds the
    version before it (no `git revert` to the fix), and the diff the agent leaves grades as it
    should in envd's container set up by the same script."""
    task = load_tasks("all")[0]
    image = build_task_image(docker_url, task)
    row = smith_row(task, image)
    script = harness.setup_script_for(row)
    assert script
    with envd_client(envd_server) as api:
        cid = api.post("/container/create", json={"image": image}).json()["container_id"]
        try:
            def sh(command: str) -> dict[str, Any]:
                r = api.post("/container/exec", json={"container_id": cid, "command": command, "timeout": 120})
                assert r.status_code == 200, r.text
                return r.json()

            assert sh(script)["returncode"] == 0
            assert sh("git status --porcelain")["output"].strip() == ""
            assert sh("git rev-list --all | wc -l")["output"].strip() == "1"  # one commit: the start
            assert sh("git fsck --unreachable --no-reflogs 2>&1 | grep -c '^unreachable commit' || true")["output"].strip() == "0"
            for f in sorted({t.split("::")[0] for t in row["FAIL_TO_PASS"]}):
                assert sh(f"test -f {f}")["returncode"] == 0, f  # the instance's change is applied
            gold = task["patch"] if task["patch"].endswith("\n") else task["patch"] + "\n"
            assert sh(f"git apply - <<'SWARL_EOF'\n{gold}SWARL_EOF")["returncode"] == 0
            patch = api.post("/container/diff", json={"container_id": cid}).json()["patch"]
            assert patch.startswith("diff --git")
            graded = api.post("/container/evaluate", json={"container_id": cid, "patch": patch, "instance": row,
                                                            "timeout": 300}).json()
            assert graded["resolved"], (graded["error"], graded["output"][-3000:])
        finally:
            api.post("/container/destroy", json={"container_id": cid})
