"""swe.adapters: one adapter per dataset family, on rows written from each dataset's documented
format (the dataset cards and harnesses named in each adapter's docstring), and the ways a real
row goes wrong: each is a RowError naming the field."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest
from fuzz_http import FUZZ_EXAMPLES, settings
from hypothesis import given
from hypothesis import strategies as st

from swe import harness
from swe.adapters import Adapter, adapter_for, adapters, get_adapter, register
from swe.adapters import base as registry
from swe.grading import END_TEST_OUTPUT, START_TEST_OUTPUT
from swe.rows import RowError, listed_tests, validate_row
from swe.schema import NonEmptyStr, RowModel
from swe.tasks import load_tasks

LITE = Path(__file__).resolve().parents[2] / ".." / "shared" / "data" / "swe-bench-lite-test.json"


# -- rows as each dataset documents them ----------------------------------------------------

def swe_bench(**over: Any) -> dict[str, Any]:
    """SWE-bench: twelve strings, FAIL_TO_PASS / PASS_TO_PASS JSON-encoded."""
    row = {"repo": "sympy/sympy", "instance_id": "sympy__sympy-20590", "base_commit": "cffd4e0f86",
           "patch": "diff --git a/x b/x\n", "test_patch": "diff --git a/t b/t\n",
           "problem_statement": "Symbol instances have __dict__", "hints_text": "",
           "created_at": "2020-12-12T18:18:38Z", "version": "1.7",
           "FAIL_TO_PASS": '["test_immutable"]', "PASS_TO_PASS": '["test__aresame", "test_structure"]',
           "environment_setup_commit": "cffd4e0f86"}
    return {**row, **over}


def swe_gym(**over: Any) -> dict[str, Any]:
    """SWE-Gym: SWE-bench's fields minus environment_setup_commit, the test lists as lists."""
    row = {"instance_id": "getmoto__moto-5752", "hints_text": "", "patch": "diff --git a/x b/x\n",
           "test_patch": "diff --git a/t b/t\n", "created_at": "2022-12-10T20:23:01Z",
           "problem_statement": "Describe parameters in ssm", "repo": "getmoto/moto",
           "base_commit": "b2300f1eae1", "version": "4.0",
           "PASS_TO_PASS": ["tests/test_ssm/test_ssm_boto3.py::test_get_parameter"],
           "FAIL_TO_PASS": ["tests/test_ssm/test_ssm_boto3.py::test_describe_parameters__multiple_tags"]}
    return {**row, **over}


def swe_smith(**over: Any) -> dict[str, Any]:
    """SWE-smith: instance_id, patch (the bug), FAIL_TO_PASS / PASS_TO_PASS lists, image_name,
    repo, problem_statement; no base_commit, version nor test_patch."""
    row = {"instance_id": "oauthlib__oauthlib.1fd52536.combine_file__09vlzwgc",
           "patch": "diff --git a/oauthlib/common.py b/oauthlib/common.py\n--- a/oauthlib/common.py\n"
                    "+++ b/oauthlib/common.py\n@@ -1 +1 @@\n-a = 1\n+a = 2\n",
           "FAIL_TO_PASS": ["tests/test_common.py::ParametersTest::test_add_params",
                            "tests/test_common.py::RequestTest::test_sanitized"],
           "PASS_TO_PASS": ["tests/test_common.py::ParametersTest::test_extract_params",
                            "tests/oauth1/test_client.py::ClientTest::test_sign"],
           "image_name": "swebench/swesmith.x86_64.oauthlib_1776_oauthlib.1fd52536",
           "repo": "swesmith/oauthlib__oauthlib.1fd52536",
           "problem_statement": "add_params_to_qs drops duplicate keys"}
    return {**row, **over}


R2E_EXPECTED = {"r2e_tests/test_1.py::TestSeries::test_rename": "PASSED",
                "r2e_tests/test_1.py::TestSeries::test_astype": "PASSED",
                "r2e_tests/test_1.py::TestSeries::test_xfail_case": "FAILED"}


def r2e_gym(**over: Any) -> dict[str, Any]:
    """R2E-Gym: repo_name, docker_image, commit_hash, expected_output_json and metadata; no
    instance_id, owner/name repo nor test lists."""
    row = {"repo_name": "pandas", "docker_image": "namanjain12/pandas_final:0b6b1a5",
           "commit_hash": "0b6b1a5", "parsed_commit_content": "{}", "execution_result_content": "{}",
           "modified_files": ["pandas/core/series.py"], "relevant_files": [],
           "num_non_test_files": 1, "num_non_test_func_methods": 1, "num_non_test_lines": 4,
           "prompt": "...", "problem_statement": "Series.rename ignores inplace",
           "expected_output_json": json.dumps(R2E_EXPECTED)}
    return {**row, **over}


FAMILIES = {"swe-bench": swe_bench, "swe-gym": swe_gym, "swe-smith": swe_smith, "r2e-gym": r2e_gym}


def _error(row: Any, **kw: Any) -> RowError:
    with pytest.raises(RowError) as ei:
        validate_row(row, **kw)
    return ei.value


def _log(body: str, nonce: str | None = None) -> str:
    tag = f" {nonce}" if nonce else ""
    return f"+ setup\n{START_TEST_OUTPUT}{tag}\n{body}\n{END_TEST_OUTPUT}{tag}\n"


# -- the registry --------------------------------------------------------------------------

def test_every_family_is_registered_with_a_description() -> None:
    assert {"swe-bench", "swe-gym", "swe-smith", "r2e-gym", "swarl"} <= set(adapters())
    for name, a in adapters().items():
        assert a.family == name and a.description
        assert get_adapter(name) is a
        for hub in a.hub_datasets:
            assert get_adapter(hub) is a  # a dataset id names its family exactly


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_each_documented_row_is_told_apart_by_its_shape(family: str) -> None:
    row = FAMILIES[family]()
    assert adapter_for(row).family == family
    out = validate_row(row)
    assert out["dataset_family"] == family and out["image_name"]
    assert validate_row(out) == out  # a prepared row validates to itself
    assert validate_row(row, family=family) == out


def test_a_source_name_is_never_searched_for_substrings() -> None:
    row = swe_bench()
    # "my-gym-export" mentions gym; it names no family, so the row's shape decides
    assert validate_row(row, "my-gym-export")["dataset_family"] == "swe-bench"
    assert validate_row(row, "SWE-Gym/SWE-Gym")["dataset_family"] == "swe-gym"  # a listed id
    assert validate_row(row, "swe-gym")["dataset_family"] == "swe-gym"          # a family name


def test_the_family_must_be_known_and_agree_with_the_row() -> None:
    e = _error(swe_bench(), family="swe-bench-pro", where="d.jsonl line 1")
    assert e.field == "dataset_family" and "unknown dataset family 'swe-bench-pro'" in e.msg
    assert "swe-smith" in e.msg and str(e).startswith("d.jsonl line 1")
    e = _error(validate_row(swe_gym()), family="swe-bench")
    assert e.field == "dataset_family" and "the row says 'swe-gym'" in e.msg
    e = _error(swe_bench(dataset_family="nope"))
    assert e.field == "dataset_family" and "unknown dataset family 'nope'" in e.msg
    e = _error(swe_bench(dataset_family=3))
    assert e.field == "dataset_family" and "must be a string" in e.msg


def test_a_row_no_family_fits_says_to_name_the_family() -> None:
    e = _error({"title": "a bug", "body": "..."}, where="x.jsonl line 7")
    assert e.field == "dataset_family" and "fit no known dataset family" in e.msg
    assert "--family" in e.msg and str(e).startswith("x.jsonl line 7")


@pytest.fixture
def own_family() -> Iterator[type[Adapter]]:
    """A user's dataset in one class (what one file in swe/adapters/ holds), removed after."""

    class TicketRow(RowModel):
        instance_id: NonEmptyStr
        problem_statement: NonEmptyStr
        repo: NonEmptyStr
        FAIL_TO_PASS: list[str]
        PASS_TO_PASS: list[str]
        ticket: NonEmptyStr

    class Tickets(Adapter):
        family = "tickets"
        hub_datasets: ClassVar[dict[str, str]] = {"acme/tickets": "train"}
        model = TicketRow
        description = "acme's tickets"

        def matches(self, row: dict[str, Any]) -> bool:
            return "ticket" in row

        def image_name(self, row: dict[str, Any]) -> str:
            return f"acme/{row['instance_id']}:1"

    register(Tickets)
    try:
        yield Tickets
    finally:
        del registry._REGISTRY["tickets"]
        for name in ("tickets", "acme/tickets"):
            del registry._NAMES[name]


def test_a_family_added_in_one_class(own_family: type[Adapter]) -> None:
    row = {"instance_id": "acme-1", "problem_statement": "x", "repo": "acme/app", "ticket": "T-1",
           "FAIL_TO_PASS": ["t::a"], "PASS_TO_PASS": []}
    out = validate_row(row)
    assert out["dataset_family"] == "tickets" and out["image_name"] == "acme/acme-1:1"
    e = _error({**row, "ticket": ""})
    assert e.field == "ticket" and "must not be empty" in e.msg
    # a row two families claim is refused, naming both
    e = _error({**row, "base_commit": "abc"})
    assert e.field == "dataset_family" and "several families (swe-gym, tickets)" in e.msg
    assert validate_row({**row, "base_commit": "abc"}, family="tickets")["dataset_family"] == "tickets"

    class Again(own_family):  # type: ignore[valid-type,misc]
        family = "tickets-2"

    with pytest.raises(ValueError, match="'acme/tickets' is already 'tickets'"):
        register(Again)


# -- SWE-bench ------------------------------------------------------------------------------

def test_swe_bench_real_rows() -> None:
    if not LITE.is_file():
        pytest.skip(f"{LITE} is absent")
    rows = json.loads(LITE.read_text())
    for row in rows:
        out = validate_row(row, where="lite")
        assert out["dataset_family"] == "swe-bench"
        assert out["FAIL_TO_PASS"] == row["FAIL_TO_PASS"]  # the JSON string form is kept
        assert out["image_name"].startswith("docker.io/swebench/sweb.eval.x86_64.")
    sympy = next(r for r in rows if r["instance_id"] == "sympy__sympy-20590")
    script = harness.eval_script_for(validate_row(sympy))
    assert "bin/test" in script and START_TEST_OUTPUT in script


def test_swe_bench_grades_by_the_harness() -> None:
    row = validate_row(swe_bench(repo="psf/requests", instance_id="psf__requests-1",
                                 FAIL_TO_PASS='["tests/t.py::test_a"]',
                                 PASS_TO_PASS='["tests/t.py::test_b"]'))
    ok = harness.grade(row, _log("PASSED tests/t.py::test_a\nPASSED tests/t.py::test_b"))
    assert ok.resolved and ok.fail_to_pass == {"tests/t.py::test_a": "PASSED"}
    missing = harness.grade(row, _log("PASSED tests/t.py::test_a"))
    assert not missing.resolved and missing.pass_to_pass == {"tests/t.py::test_b": "MISSING"}


# -- SWE-Gym --------------------------------------------------------------------------------

def test_swe_gym_rows_and_the_subset_with_its_own_script() -> None:
    out = validate_row(swe_gym())
    assert out["image_name"] == "docker.io/xingyaoww/sweb.eval.x86_64.getmoto_s_moto-5752:latest"
    assert listed_tests(out, "FAIL_TO_PASS") == swe_gym()["FAIL_TO_PASS"]
    subset = validate_row(swe_gym(eval_script="#!/bin/bash\npytest tests\n",
                                  image_name="xingyaoww/sweb.eval.x86_64.getmoto_s_moto-5752"))
    assert subset["dataset_family"] == "swe-gym"
    assert subset["image_name"] == "xingyaoww/sweb.eval.x86_64.getmoto_s_moto-5752"
    assert harness.eval_script_for(subset) == "#!/bin/bash\npytest tests\n"


def test_swe_gym_repo_the_harness_does_not_know_needs_its_own_script() -> None:
    with pytest.raises(ValueError, match="unknown to the swebench harness; the row must carry its own eval_script"):
        harness.eval_script_for(validate_row(swe_gym()))


# -- SWE-smith ------------------------------------------------------------------------------

def test_swe_smith_script_runs_pytest_on_the_fail_to_pass_files() -> None:
    row = validate_row(swe_smith())
    assert row["image_name"] == "swebench/swesmith.x86_64.oauthlib_1776_oauthlib.1fd52536"
    script = harness.eval_script_for(row)
    assert "conda activate testbed" in script
    assert "pytest --disable-warnings --color=no --tb=no --verbose tests/test_common.py\n" in script
    assert script.index(START_TEST_OUTPUT) < script.index("pytest") < script.index(END_TEST_OUTPUT)
    setup = harness.setup_script_for(row)
    assert setup is not None and "git apply" in setup and row["patch"] in setup and "commit" in setup
    own = validate_row(swe_smith(test_cmd="python -m pytest -rA tests/unit"))
    assert "\npython -m pytest -rA tests/unit\n" in harness.eval_script_for(own)


def test_swe_smith_grades_the_listed_tests_of_the_files_it_ran() -> None:
    row = validate_row(swe_smith())
    good = ("tests/test_common.py::ParametersTest::test_add_params PASSED [ 33%]\n"
            "tests/test_common.py::RequestTest::test_sanitized PASSED [ 66%]\n"
            "tests/test_common.py::ParametersTest::test_extract_params PASSED [100%]")
    report = harness.grade(row, _log(good, "n1"), "n1")
    # tests/oauth1/test_client.py was not run: SWE-smith's filter leaves it out of the grade
    assert report.resolved and "tests/oauth1/test_client.py::ClientTest::test_sign" not in report.pass_to_pass
    failed = good.replace("test_sanitized PASSED", "test_sanitized FAILED")
    assert not harness.grade(row, _log(failed, "n1"), "n1").resolved
    # absent from the log: not passed (SWE-smith would count it passed; a patch that stops a
    # file from being collected must not earn the reward)
    absent = "\n".join(good.splitlines()[:1] + good.splitlines()[2:])
    report = harness.grade(row, _log(absent, "n1"), "n1")
    assert not report.resolved and report.fail_to_pass["tests/test_common.py::RequestTest::test_sanitized"] == "MISSING"


# -- R2E-Gym --------------------------------------------------------------------------------

def test_r2e_gym_rows_get_an_id_a_repo_and_their_tests() -> None:
    out = validate_row(r2e_gym())
    assert out["instance_id"] == "r2e-gym__pandas-0b6b1a5" and out["repo"] == "r2e-gym/pandas"
    assert out["image_name"] == "namanjain12/pandas_final:0b6b1a5"
    assert out["FAIL_TO_PASS"] == ["r2e_tests/test_1.py::TestSeries::test_rename",
                                   "r2e_tests/test_1.py::TestSeries::test_astype"]
    assert out["PASS_TO_PASS"] == [] and out["num_non_test_files"] == 1
    script = harness.eval_script_for(out)
    assert 'bash "$swarl_rt"' in script and "/root/r2e_tests" in script
    assert "mv run_tests.sh /root/run_tests.sh" in (harness.setup_script_for(out) or "")


def test_r2e_gym_resolved_when_every_status_is_the_expected_one() -> None:
    row = validate_row(r2e_gym())
    lines = "\n".join(f"{s} {t}" + (" - AssertionError: x" if s == "FAILED" else "")
                      for t, s in R2E_EXPECTED.items())
    coloured = lines.replace("PASSED", "\x1b[32mPASSED\x1b[0m")
    assert harness.grade(row, _log(lines)).resolved
    assert harness.grade(row, _log(coloured)).resolved
    # the test expected to fail passes: not what R2E-Gym expects
    assert not harness.grade(row, _log(lines.replace("FAILED", "PASSED"))).resolved
    # one test more, or one less: not the same run
    assert not harness.grade(row, _log(lines + "\nPASSED r2e_tests/test_1.py::test_new")).resolved
    report = harness.grade(row, _log("\n".join(lines.splitlines()[1:])))
    assert not report.resolved and report.fail_to_pass["r2e_tests/test_1.py::TestSeries::test_rename"] == "MISSING"
    assert harness.grade(row, "no markers at all").error.startswith("no test output")


# -- swarl's own ----------------------------------------------------------------------------

def test_swarl_suites_are_their_own_family() -> None:
    for suite in ("bundled", "generated"):
        for task in load_tasks(suite=suite)[:5]:
            assert adapter_for({k: v for k, v in task.items() if k != "dataset_family"}).family == "swarl"
            assert validate_row(task) == task


# -- rows that go wrong as real rows do ------------------------------------------------------

BAD: list[tuple[str, dict[str, Any], str, str]] = [
    # (family, changes: a value, or None to drop the field, the field named, words in the error)
    ("swe-bench", {"instance_id": None}, "instance_id", "missing"),
    ("swe-bench", {"FAIL_TO_PASS": None}, "FAIL_TO_PASS", "missing"),
    ("swe-bench", {"FAIL_TO_PASS": "[\"test_a\""}, "FAIL_TO_PASS", "not a JSON list"),
    ("swe-bench", {"FAIL_TO_PASS": "[]"}, "FAIL_TO_PASS", "empty"),
    ("swe-bench", {"PASS_TO_PASS": "test_a"}, "PASS_TO_PASS", "not a JSON list"),
    ("swe-bench", {"version": 3.1}, "version", "must be a string, got float"),
    ("swe-bench", {"instance_id": "sympy/sympy 1"}, "instance_id", "not a valid id"),
    ("swe-bench", {"test_patch": None}, "test_patch", "required to build the eval script"),
    ("swe-bench", {"repo": "sympy"}, "repo", "owner/name"),
    ("swe-gym", {"FAIL_TO_PASS": []}, "FAIL_TO_PASS", "empty"),
    ("swe-gym", {"FAIL_TO_PASS": [""]}, "FAIL_TO_PASS", "non-empty strings"),
    ("swe-gym", {"PASS_TO_PASS": {"a": "b"}}, "PASS_TO_PASS", "expected a list"),
    ("swe-gym", {"problem_statement": ["a", "b"]}, "problem_statement", "must be a string, got list"),
    ("swe-gym", {"instance_id": 5752}, "instance_id", "must be a string, got int"),
    ("swe-smith", {"image_name": ""}, "image_name", "must not be empty"),
    ("swe-smith", {"patch": None}, "patch", "missing"),
    ("swe-smith", {"problem_statement": ""}, "problem_statement", "must not be empty"),
    ("swe-smith", {"FAIL_TO_PASS": []}, "FAIL_TO_PASS", "empty"),
    ("swe-smith", {"FAIL_TO_PASS": ["test_add_params"]}, "FAIL_TO_PASS", "no test names a file"),
    ("swe-smith", {"instance_id": "oauthlib oauthlib"}, "instance_id", "not a valid id"),
    ("r2e-gym", {"docker_image": None}, "docker_image", "missing"),
    ("r2e-gym", {"expected_output_json": "{"}, "expected_output_json", "not a JSON object"),
    ("r2e-gym", {"expected_output_json": "{}"}, "expected_output_json", "non-empty JSON object"),
    ("r2e-gym", {"expected_output_json": {"t": "PASSED"}}, "expected_output_json", "must be a string, got dict"),
    ("r2e-gym", {"commit_hash": 12}, "commit_hash", "must be a string, got int"),
    ("r2e-gym", {"problem_statement": "  "}, "problem_statement", "must not be empty"),
]


def bad_row(family: str, changes: dict[str, Any]) -> dict[str, Any]:
    row = FAMILIES[family]()
    for k, v in changes.items():
        if v is None:
            row.pop(k, None)
        else:
            row[k] = v
    return row


@pytest.mark.parametrize(("family", "changes", "field", "words"), BAD,
                         ids=[f"{f}-{next(iter(c))}-{w}" for f, c, _, w in BAD])
def test_a_bad_row_names_its_field(family: str, changes: dict[str, Any], field: str, words: str) -> None:
    row = bad_row(family, changes)
    for kw in ({"family": family}, {}):  # named, or told apart by its shape
        e = _error(row, where="bad.jsonl line 2", **kw)
        assert e.field == field and words in e.msg, str(e)
        assert str(e).startswith("bad.jsonl line 2") and f"field {field!r}" in str(e)


# -- fuzzed rows of every family --------------------------------------------------------------

VALUES = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
                      lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
                      max_leaves=6)


@pytest.mark.fuzz
@settings(FUZZ_EXAMPLES * 10)
@given(family=st.sampled_from(sorted(FAMILIES)), data=st.data(), value=VALUES, drop=st.booleans(),
       named=st.booleans())
def test_a_fuzzed_row_is_valid_or_names_its_field(family: str, data: st.DataObject, value: Any,
                                                  drop: bool, named: bool) -> None:
    row = FAMILIES[family]()
    field = data.draw(st.sampled_from(sorted(row)))
    if drop:
        row.pop(field)
    else:
        row[field] = value
    try:
        out = validate_row(row, family=family if named else None, where="fuzz line 1")
    except RowError as e:
        assert str(e).startswith("fuzz line 1") and (e.field is None or e.field in str(e)), e
        return
    assert out["image_name"] and out["dataset_family"] in adapters()
    json.dumps(out)
