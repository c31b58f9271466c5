"""envd.grade_cache: a verdict graded once is answered again only for the very same inputs, one
grading at a time per key; what the machine could have decided is never kept; the envd of a real
dockerd grades a repeated patch without a container, and a patch one byte apart afresh."""

from __future__ import annotations

import asyncio
import json
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from fixtures_envd import GOOD_PATCH

from envd.grade_cache import GradeCache, cacheable, grade_key

INPUTS = dict(image_id="sha256:aa", cwd="/testbed", instance={"instance_id": "x", "FAIL_TO_PASS": ["t"]},
              script="pytest t", patch="--- a/f\n+++ b/f\n", timeout_s=120.0, settings=[[], "1g"])
GRADED = {"resolved": True, "returncode": 0, "timed_out": False, "tests_status": {"t": "PASSED"}, "error": ""}


def test_the_key_covers_every_input_and_frames_them() -> None:
    base = grade_key(**INPUTS)
    assert base == grade_key(**{**INPUTS, "instance": {"FAIL_TO_PASS": ["t"], "instance_id": "x"}})  # key order
    changed = [{"image_id": "sha256:ab"}, {"cwd": "/testbed/"}, {"instance": {"instance_id": "x", "FAIL_TO_PASS": []}},
               {"script": "pytest t "}, {"patch": INPUTS["patch"] + " "}, {"timeout_s": 121},
               {"settings": [["referee"], "1g"]}]
    keys = {grade_key(**{**INPUTS, **c}) for c in changed}
    assert base not in keys and len(keys) == len(changed)
    # two inputs cannot run together into the same bytes
    assert grade_key(**{**INPUTS, "cwd": "/a", "script": "b"}) != grade_key(**{**INPUTS, "cwd": "/ab", "script": ""})


@pytest.mark.parametrize("result, kept", [
    (GRADED, True),
    ({**GRADED, "resolved": False, "returncode": 1}, True),
    ({"resolved": False, "returncode": 97, "error": "patch does not apply: ..."}, True),
    ({"resolved": False, "returncode": None, "reward_hack": [{"kind": "test_files"}]}, True),
    ({**GRADED, "timed_out": True}, False),
    ({**GRADED, "resolved": False, "returncode": 137}, False),  # killed by a signal: OOM, ...
    ({"resolved": False, "returncode": None, "error": "..."}, False),
    ({"resolved": False, "returncode": 1, "error": "the row's setup script failed: ..."}, False),
])
def test_only_what_the_patch_decided_is_kept(result: dict, kept: bool) -> None:
    assert cacheable(result) is kept


def test_hits_joins_and_what_is_left_after_a_failure() -> None:
    async def main() -> None:
        now = [0.0]
        cache = GradeCache(max_entries=2, ttl_s=10, clock=lambda: now[0])
        runs: list[str] = []
        gate = asyncio.Event()

        def grader(key: str, result: dict, fail: BaseException | None = None):
            async def run() -> dict:
                runs.append(key)
                await gate.wait()
                if fail is not None:
                    raise fail
                return dict(result, tests_status=dict(result.get("tests_status", {})))
            return run

        # three at once: one grades, two wait for it and get its verdict
        gate.clear()
        got = asyncio.gather(*(cache.grade("k1", grader("k1", GRADED)) for _ in range(3)))
        await asyncio.sleep(0.01)
        gate.set()
        answers = await got
        assert runs == ["k1"] and sorted(how for _, how in answers) == ["joined", "joined", "miss"]
        assert all(r == GRADED for r, _ in answers)
        answers[0][0]["tests_status"]["t"] = "FAILED"  # what a caller does to its answer stays with it
        r, how = await cache.grade("k1", grader("k1", GRADED))
        assert how == "hit" and r == GRADED and runs == ["k1"]

        # the first grading fails: nothing kept, the waiter grades for itself
        gate.clear()
        first = asyncio.ensure_future(cache.grade("k2", grader("k2", GRADED, fail=RuntimeError("docker"))))
        await asyncio.sleep(0.01)
        second = asyncio.ensure_future(cache.grade("k2", grader("k2", GRADED)))
        await asyncio.sleep(0.01)
        gate.set()
        with pytest.raises(RuntimeError):
            await first
        assert await second == (GRADED, "miss") and runs == ["k1", "k2", "k2"]

        # a cancelled grading (the client went away) leaves nothing behind either
        gate.clear()
        first = asyncio.ensure_future(cache.grade("k3", grader("k3", GRADED)))
        await asyncio.sleep(0.01)
        second = asyncio.ensure_future(cache.grade("k3", grader("k3", GRADED)))
        await asyncio.sleep(0.01)
        first.cancel()
        await asyncio.sleep(0.01)
        gate.set()
        assert await second == (GRADED, "miss") and "k3" not in cache._running

        # a timed-out run is not kept; the oldest entry goes past max_entries; entries expire
        timed_out = {**GRADED, "timed_out": True}
        assert (await cache.grade("k4", grader("k4", timed_out)))[1] == "miss"
        assert (await cache.grade("k4", grader("k4", timed_out)))[1] == "miss"
        assert len(cache) == 2  # k2, k3 (k1 dropped: least recently used)
        gate.clear()  # ...but those waiting on it get its answer: the same inputs at the same moment
        both = asyncio.gather(*(cache.grade("k4", grader("k4", timed_out)) for _ in range(2)))
        await asyncio.sleep(0.01)
        gate.set()
        assert sorted(how for _, how in await both) == ["joined", "miss"] and len(cache) == 2
        assert (await cache.grade("k1", grader("k1", GRADED)))[1] == "miss"
        now[0] = 9.5
        assert (await cache.grade("k1", grader("k1", GRADED)))[1] == "hit"
        now[0] = 10.5  # ttl_s after it was graded: graded again
        assert (await cache.grade("k1", grader("k1", GRADED)))[1] == "miss"

        off = GradeCache(max_entries=0, ttl_s=10)
        assert (await off.grade("k", grader("k", GRADED)))[1] == "off"
        assert (await off.grade("k", grader("k", GRADED)))[1] == "off"

    asyncio.run(main())


# -- through envd and a real dockerd -----------------------------------------------------------

EVAL = """cd /testbed
echo '>>>>> Start Test Output'
if python3 -c 'from calc import add; assert add(2, 3) == 5' 2>/dev/null; then
  echo 'PASSED test_calc.py::test_add'
else
  echo 'FAILED test_calc.py::test_add'
fi
echo '>>>>> End Test Output'
"""
INSTANCE = {"instance_id": "swarl__calc-cache", "repo": "swarl/calc", "eval_script": EVAL,
            "problem_statement": "add(2, 3) is not 5", "FAIL_TO_PASS": ["test_calc.py::test_add"], "PASS_TO_PASS": []}


def _metrics(api: httpx.Client) -> dict[str, float]:
    out = {}
    for line in api.get("/metrics").text.splitlines():
        if line.startswith(("envd_grade_cache_total", "envd_containers_created_total")):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


@pytest.mark.docker
def test_envd_grades_a_repeated_patch_once(envd_factory, test_image) -> None:
    svc = envd_factory(sets=["envd.grade_cache_entries=64"])
    with httpx.Client(base_url=svc.url, headers={"Authorization": f"Bearer {svc.token}"}, timeout=120) as api:
        cid = api.post("/container/create", json={"image": test_image}).json()["container_id"]

        def evaluate(patch: str, instance: dict = INSTANCE) -> dict:
            return api.post("/container/evaluate", json={"container_id": cid, "patch": patch,
                                                         "instance": instance}).json()

        first = evaluate(GOOD_PATCH)
        assert first["resolved"] is True and first["cached"] is False, first
        made = _metrics(api)['envd_containers_created_total']
        again = evaluate(GOOD_PATCH)
        assert again["cached"] is True and again["resolved"] is True
        assert {k: v for k, v in again.items() if k != "cached"} == {k: v for k, v in first.items() if k != "cached"}
        assert _metrics(api)['envd_containers_created_total'] == made  # no grading container

        # a patch one character apart, and the same patch against a row with other tests: graded afresh
        wrong = GOOD_PATCH.replace("+    return a + b", "+    return a * b")
        ev = evaluate(wrong)
        assert ev["cached"] is False and ev["resolved"] is False, ev
        other_row = {**INSTANCE, "FAIL_TO_PASS": ["test_calc.py::test_missing"]}
        ev = evaluate(GOOD_PATCH, other_row)
        assert ev["cached"] is False and ev["resolved"] is False, ev

        # four at once of a new patch: one grading, three wait for it
        spaced = GOOD_PATCH.replace("+    return a + b", "+    return b + a")
        with ThreadPoolExecutor(4) as ex:
            many = list(ex.map(lambda _: evaluate(spaced), range(4)))
        assert all(m["resolved"] for m in many) and sum(m["cached"] for m in many) == 3, many
        m = _metrics(api)
        assert m['envd_grade_cache_total{result="miss"}'] == 4, json.dumps(m)
        assert m['envd_grade_cache_total{result="hit"}'] + m['envd_grade_cache_total{result="joined"}'] == 4
        api.post("/container/destroy", json={"container_id": cid})


@pytest.mark.docker
def test_envd_without_the_cache_grades_every_time(envd_factory, test_image) -> None:
    svc = envd_factory(sets=["envd.grade_cache_entries=0"])
    with httpx.Client(base_url=svc.url, headers={"Authorization": f"Bearer {svc.token}"}, timeout=120) as api:
        cid = api.post("/container/create", json={"image": test_image}).json()["container_id"]
        for _ in range(2):
            ev = api.post("/container/evaluate", json={"container_id": cid, "patch": GOOD_PATCH,
                                                       "instance": INSTANCE}).json()
            assert ev["resolved"] is True and ev["cached"] is False, ev
        assert _metrics(api)['envd_grade_cache_total{result="off"}'] == 2
        api.post("/container/destroy", json={"container_id": cid})
