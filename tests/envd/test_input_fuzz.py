"""Fuzzed rows and patches: a row is either valid or refused with a RowError naming its field;
patch checks and the reward-hack inspection answer any text without crashing."""

from __future__ import annotations

import pytest
from fuzz_http import FUZZ_EXAMPLES, settings
from hypothesis import given
from hypothesis import strategies as st

from swe.grading import check_patch
from swe.rows import REQUIRED, RowError, validate_row
from swe.tamper import KINDS, inspect_patch
from swe.tasks import load_tasks

pytestmark = pytest.mark.fuzz
ROW = load_tasks("all")[0]
VALUES = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
                      lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
                      max_leaves=6)


def _check_row(row: object) -> None:
    try:
        out = validate_row(row, where="fuzz line 1")
    except RowError as e:
        assert e.field is None or e.field in str(e), e
        assert str(e).startswith("fuzz line 1"), e
        return
    assert isinstance(out, dict) and out["image_name"]


@settings(FUZZ_EXAMPLES * 10)
@given(field=st.sampled_from(sorted(set(ROW) | set(REQUIRED) | {"eval_script", "version", "image_name"})),
       value=VALUES, drop=st.booleans())
def test_rows_with_one_field_changed(field: str, value: object, drop: bool) -> None:
    row = dict(ROW)
    if drop:
        row.pop(field, None)
    else:
        row[field] = value
    _check_row(row)


@settings(FUZZ_EXAMPLES * 10)
@given(row=VALUES)
def test_anything_as_a_row(row: object) -> None:
    _check_row(row)


LINES = st.sampled_from(["diff --git a/conftest.py b/conftest.py", "--- a/x.py", "+++ b/x.py", "@@ -1,2 +1,3 @@",
                         "+print('PASSED x')", "-old", " ctx", "new file mode 120000", "rename to tox.ini",
                         "[tool:pytest]", "+[pytest]", "--- /dev/null", "+++ b/setup.cfg", "\\ No newline"])


@settings(FUZZ_EXAMPLES * 10)
@given(lines=st.lists(LINES | st.text(max_size=30), max_size=20), row=st.sampled_from([ROW, None, {}]))
def test_patch_checks_answer_any_text(lines: list[str], row: dict | None) -> None:
    patch = "\n".join(lines)
    reason = check_patch(patch)
    assert reason is None or isinstance(reason, str)
    found = inspect_patch(patch, row)
    assert all(t.kind in KINDS and t.reason for t in found)
