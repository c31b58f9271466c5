"""SWE-smith (SWE-bench/SWE-smith and its per-language sets): bugs synthesised into a repository,
one image per repository.

Rows (the dataset card): instance_id (`<owner>__<repo>.<commit8>.<bug kind>__<hash>`), repo
(`swesmith/<owner>__<repo>.<commit8>`), image_name (the repository's image), patch, problem_statement,
FAIL_TO_PASS and PASS_TO_PASS as lists. No base_commit, version, test_patch nor
environment_setup_commit: the repository's test command comes from SWE-smith's repo profile, and
the buggy state is a branch named after the instance in SWE-smith's mirror repository, whose
diff from the image's commit is the row's `patch` (SWE-smith's harness reverts it to check the
gold fix). Shape: `image_name` and none of base_commit / version / test_patch /
environment_setup_commit.

How swarl maps it:
- image: the row's image_name;
- start state: `setup_script` applies the row's `patch` (the bug) in /testbed and commits it, so
  the agent's `git diff` is its fix alone and no network fetch of the mirror is needed;
- test command: the row's `test_cmd` when it has one (a repo profile whose command is not the
  default), else the Python profile's default, `pytest --disable-warnings --color=no --tb=no
  --verbose`, on the files FAIL_TO_PASS names (what SWE-smith's get_test_command runs) in the
  conda env `testbed`; the row's own `eval_script` wins over both;
- log parser: pytest's verbose lines (`path::test STATUS`) and -rA summary lines
  (`STATUS path::test`); a row's `log_parser` names a swebench parser instead;
- resolved: SWE-smith grades only the listed tests in the files it ran (its
  filter_irrelevant_tests) and counts a listed test absent from the log as passed. swarl keeps the
  filter but counts an absent test as not passed (SWE-bench's rule): a patch that stops a test
  file from being collected must not earn the reward.
"""

from __future__ import annotations

import shlex
from typing import Any, ClassVar

from swe import grading
from swe.adapters.base import Adapter, register
from swe.grading import END_TEST_OUTPUT, HEREDOC, START_TEST_OUTPUT, EvalReport, parse_pytest
from swe.schema import (
    InstanceId,
    NonEmptyStr,
    Repo,
    RowError,
    RowModel,
    TestIds,
    check_tests_and_scripts,
    listed_tests,
)

DEFAULT_TEST_CMD = "pytest --disable-warnings --color=no --tb=no --verbose"
ENV_NAME = "testbed"
_NOT_SMITH = ("base_commit", "version", "test_patch", "environment_setup_commit")


def smith_shape(row: dict[str, Any]) -> bool:
    """SWE-smith's rows: an image per repository (and the bug as `patch`), in a repository named
    `swesmith/<owner>__<repo>.<commit>` (SWE-smith's mirrors). A user's own row with an image and
    an eval script but not that repository is SWE-bench's format, not this."""
    return "image_name" in row and str(row.get("repo") or "").startswith("swesmith/") \
        and not any(f in row for f in _NOT_SMITH) and "docker_image" not in row


class SweSmithRow(RowModel):
    instance_id: InstanceId
    problem_statement: NonEmptyStr
    repo: Repo
    image_name: NonEmptyStr
    patch: NonEmptyStr
    FAIL_TO_PASS: TestIds
    PASS_TO_PASS: TestIds
    test_cmd: str | None = None
    eval_script: str | None = None
    log_parser: str | None = None


def test_files(row: dict[str, Any]) -> list[str]:
    """The files FAIL_TO_PASS names (pytest ids `path::test`), in first-seen order."""
    return list(dict.fromkeys(t.split("::", 1)[0] for t in listed_tests(row, "FAIL_TO_PASS") if "::" in t))


@register
class SweSmith(Adapter):
    family = "swe-smith"
    aliases = ("swesmith",)
    hub_datasets: ClassVar[dict[str, str]] = {"SWE-bench/SWE-smith": "train", "SWE-bench/SWE-smith-py": "train"}
    model = SweSmithRow
    description = ("SWE-smith: the repository's image with the row's bug patch applied, pytest on "
                   "the FAIL_TO_PASS files, every listed test of those files must pass")

    def matches(self, row: dict[str, Any]) -> bool:
        return smith_shape(row)

    def check(self, row: dict[str, Any]) -> None:
        check_tests_and_scripts(row, ("test_cmd", "eval_script"))
        if not row.get("eval_script") and not row.get("test_cmd") and not test_files(row):
            raise RowError("no test names a file (`path::test`): give the row its test_cmd or "
                           "eval_script", field="FAIL_TO_PASS")

    def setup_script(self, row: dict[str, Any]) -> str:
        # The bug becomes the start of a history of one commit: with the clean version reachable
        # (a parent commit, a branch, the reflog) the agent could `git revert` its way to the
        # fix. Every other ref and the reflog go, and gc prunes what nothing reaches.
        body = row["patch"] if row["patch"].endswith("\n") else row["patch"] + "\n"
        who = "git -c user.name=swarl -c user.email=swarl@localhost"
        return "\n".join([
            "set -e", "cd /testbed",
            f"git apply --whitespace=nowarn - <<'{HEREDOC}'\n{body}{HEREDOC}",
            "git checkout -q --orphan swarl-task", "git add -A",
            f"{who} commit -q --no-verify -m 'task start'",
            "git for-each-ref --format='%(refname)' | grep -vx refs/heads/swarl-task | xargs -r -n1 git update-ref -d",
            "git stash clear", "git reflog expire --expire=now --all", "git gc -q --prune=now", ""])

    def test_command(self, row: dict[str, Any]) -> str:
        if row.get("test_cmd"):
            return str(row["test_cmd"])
        return " ".join([DEFAULT_TEST_CMD, *(shlex.quote(f) for f in test_files(row))])

    def eval_script(self, row: dict[str, Any]) -> str:
        if row.get("eval_script"):
            return str(row["eval_script"])
        return "\n".join(["#!/bin/bash", "set -uxo pipefail", "source /opt/miniconda3/bin/activate",
                          f"conda activate {ENV_NAME}", "cd /testbed", f": '{START_TEST_OUTPUT}'",
                          self.test_command(row), f": '{END_TEST_OUTPUT}'"]) + "\n"

    def graded(self, row: dict[str, Any]) -> dict[str, Any]:
        """The row with its test lists cut to the files the command runs (SWE-smith's filter)."""
        files = [] if row.get("eval_script") or row.get("test_cmd") else test_files(row)
        if not files:
            return row
        keep = tuple(f"{f}::" for f in files)
        return {**row,
                "FAIL_TO_PASS": [t for t in listed_tests(row, "FAIL_TO_PASS") if t.startswith(keep)],
                "PASS_TO_PASS": [t for t in listed_tests(row, "PASS_TO_PASS") if t.startswith(keep)]}

    def grade(self, row: dict[str, Any], log: str, nonce: str | None = None) -> EvalReport:
        parser = None if row.get("log_parser") else parse_pytest
        return grading.grade(self.graded(row), log, nonce, parser=parser)
