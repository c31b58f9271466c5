"""Every bundled task (`make long`; one per bug family in `make test`) in a real container of its image: the gold patch resolves it;
swarl_fix_command makes exactly the gold change; an empty patch, the test patch alone and
every wrong command do not resolve it."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from fixtures_tasks import Variant, run_variants

from swe.rows import listed_tests
from swe.tasks import load_tasks

pytestmark = [pytest.mark.docker, pytest.mark.slow]

TASKS = load_tasks("all")
GOLD_IDENTICAL = "@@gold-identical"


def _variants(row: dict[str, Any]) -> list[Variant]:
    # The fix command, then the gold patch in reverse: a clean tree means it made exactly
    # the gold change (which the "gold" variant shows to resolve the task).
    fix = (f"{row['swarl_fix_command']} && git apply -R /tmp/swarl_gold.patch && "
           f"test -z \"$(git status --porcelain)\" && echo {GOLD_IDENTICAL}")
    vs = [Variant("gold", patch=row["patch"]), Variant("empty"),
          Variant("test_patch", patch=row["test_patch"]),
          Variant("fix_command", command=fix, evaluate=False, files={"/tmp/swarl_gold.patch": row["patch"]})]
    vs += [Variant(f"wrong_{i}", command=c) for i, c in enumerate(row["swarl_wrong_commands"])]
    return vs


def _check_task(client: Any, image: str, row: dict[str, Any]) -> list[str]:
    """Problems found with one task (empty when it behaves)."""
    results = run_variants(client, image, row, _variants(row), timeout_s=600)
    tests = set(listed_tests(row, "FAIL_TO_PASS") + listed_tests(row, "PASS_TO_PASS"))
    iid = row["instance_id"]
    problems = []
    if GOLD_IDENTICAL not in results["fix_command"][1]:
        problems.append(f"{iid}: swarl_fix_command does not make the gold change:\n{results['fix_command'][1]}")
    for name, (report, log) in results.items():
        if report is None:
            continue
        if report.resolved != (name == "gold"):
            problems.append(f"{iid} {name}: resolved={report.resolved} f2p={report.fail_to_pass} "
                            f"p2p={report.pass_to_pass} error={report.error!r}\n{log[-1500:]}")
        if not report.error and set(report.tests_status) != tests:
            problems.append(f"{iid} {name}: the log's tests {sorted(report.tests_status)} "
                            "are not exactly FAIL_TO_PASS + PASS_TO_PASS")
    # On the base commit (+ test patch) the new tests fail and the old ones pass: a real bug.
    empty = results["empty"][0]
    if any(s == "PASSED" for s in empty.fail_to_pass.values()) or any(
            s != "PASSED" for s in empty.pass_to_pass.values()):
        problems.append(f"{iid}: on the base commit expected FAIL_TO_PASS to fail and PASS_TO_PASS "
                        f"to pass, got {empty.fail_to_pass} / {empty.pass_to_pass}")
    return problems


def _grade(client: Any, task_images: dict[str, str], tasks: list[dict[str, Any]]) -> None:
    # Two containers at a time: the machine has two cores.
    with ThreadPoolExecutor(max_workers=2) as pool:
        futures = [pool.submit(_check_task, client, task_images[t["instance_id"]], t) for t in tasks]
        problems = [p for f in futures for p in f.result()]
    assert not problems, "\n\n".join(problems)


@pytest.mark.timeout(600)
def test_one_task_per_family_graded_in_its_image(docker_client: Any, task_images: dict[str, str]) -> None:
    first = {}
    for t in TASKS:
        first.setdefault(t["swarl_family"], t)
    _grade(docker_client, task_images, list(first.values()))


@pytest.mark.long  # ~180 pytest runs in containers; ~1 min on an idle 2-core machine
@pytest.mark.timeout(900)
def test_every_task_graded_in_its_image(docker_client: Any, task_images: dict[str, str]) -> None:
    assert set(task_images) == {t["instance_id"] for t in TASKS}
    _grade(docker_client, task_images, TASKS)


def test_base_commit_is_checked_out_in_image(docker_client: Any, task_images: dict[str, str]) -> None:
    for row in TASKS[:3]:
        out = docker_client.containers.run(
            task_images[row["instance_id"]], ["bash", "-lc", "cd /testbed && git rev-parse HEAD && git status --porcelain"],
            remove=True, network_disabled=True)
        assert out.decode().split() == [row["base_commit"]]
