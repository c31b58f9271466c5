"""The bundled SWE tasks' specs: one real bug per task, injected into a small repository.

Each repository under swe/tasks/repos/<repo>/ holds the *correct* code and the tests that
exist before the bug report; beside it, swe/tasks/repos/<repo>.yaml lists that repository's
tasks (a YAML list of `TaskSpec` fields, `repo` being the file's name). Families: 8 kinds of
bug × 4 tasks; the task with `heldout: true` in each family is the held-out one ("other tasks
of the same bug families").

This module also names what a bundled task is called: its instance_id, its repo and its image.
"""

from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path, PurePosixPath
from typing import Any, Literal, get_args

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

REPOS_DIR = Path(__file__).resolve().parent / "repos"
# The repositories, in the order of tasks.jsonl (each has repos/<name>/ and repos/<name>.yaml).
REPOS = ("invoicekit", "textkit", "pagekit", "stockroom", "schedkit", "statkit", "confparse", "gradebook")
Family = Literal[
    "off_by_one",
    "comparison_operator",
    "arithmetic_operator",
    "empty_input",
    "default_argument",
    "none_handling",
    "boolean_logic",
    "index_or_arguments",
]
FAMILIES: tuple[str, ...] = get_args(Family)

REPO_PREFIX = "swarl-tasks"  # rows: repo `swarl-tasks/<repo>`, instance_id `swarl-tasks__<repo>-<n>`
TASK_IMAGE_PREFIX = "swarl/task."


def task_image_name(instance_id: str) -> str:
    """`swarl-tasks__pricing-2` → `swarl/task.pricing-2:latest`."""
    short = instance_id.split("__", 1)[-1].lower()
    if not re.fullmatch(r"[a-z0-9][a-z0-9._-]*", short):
        raise ValueError(f"instance_id: {instance_id!r} does not make a valid image name")
    return f"{TASK_IMAGE_PREFIX}{short}:latest"


class TaskSpecError(ValueError):
    """A bad task spec file; the message names the file, the task and the field."""


class TaskSpec(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    repo: str = Field(description="The repository under swe/tasks/repos/ (the spec file's name).")
    n: int = Field(ge=1, description="The task's number within its repository.")
    family: Family = Field(description="The kind of bug.")
    path: str = Field(description="The module the bug lives in, relative to the repository.")
    good: str = Field(min_length=1, description="A fragment of the one correct line the bug replaces.")
    bad: str = Field(min_length=1, description="What replaces `good` at the base commit (the bug).")
    wrong: tuple[str, ...] = Field(
        min_length=2, max_length=3, description="Plausible wrong fixes: what an agent might write in place of `bad`.")
    test_path: str = Field(description="The test file the fix's tests are appended to.")
    tests: str = Field(min_length=1, description="The tests the fix adds (Python source).")
    fail_to_pass: tuple[str, ...] = Field(
        min_length=1, description="Names of the added tests that fail with the bug (FAIL_TO_PASS).")
    statement: str = Field(min_length=1, description="The issue text: the symptom, not the fix.")
    heldout: bool = Field(False, description="The family's held-out task.")
    anchor: str = Field("", description="When `good` is not unique in the file: the target line also contains this.")
    created_at: str = Field("2024-03-01T09:00:00Z", description="The row's created_at.")

    @field_validator("path", "test_path")
    @classmethod
    def _relative(cls, v: str) -> str:
        p = PurePosixPath(v)
        if not v or p.is_absolute() or ".." in p.parts:
            raise ValueError(f"must be a path inside the repository, got {v!r}")
        return v

    @property
    def name(self) -> str:
        return f"{self.repo}-{self.n}"

    @property
    def instance_id(self) -> str:
        return f"{REPO_PREFIX}__{self.name}"


def load_spec_file(path: Path) -> list[TaskSpec]:
    """The tasks of one `repos/<repo>.yaml`; TaskSpecError names the file, task and field."""
    repo = path.stem
    try:
        data: Any = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        raise TaskSpecError(f"{path}: not valid YAML: {e}") from None
    if not isinstance(data, list) or not data:
        raise TaskSpecError(f"{path}: expected a non-empty list of tasks, got {type(data).__name__}")
    specs = []
    for i, item in enumerate(data):
        task = f"task {repo}-{item['n']}" if isinstance(item, dict) and "n" in item else f"task #{i + 1}"
        if not isinstance(item, dict):
            raise TaskSpecError(f"{path}: {task}: expected a mapping of fields, got {type(item).__name__}")
        if "repo" in item:
            raise TaskSpecError(f"{path}: {task}: field 'repo': given by the file's name, not a field")
        try:
            specs.append(TaskSpec.model_validate({**item, "repo": repo}))
        except ValidationError as e:
            err = e.errors()[0]
            where = ".".join(str(p) for p in err["loc"]) or "?"
            raise TaskSpecError(f"{path}: {task}: field {where!r}: {err['msg']}") from None
    numbers = [s.n for s in specs]
    if len(set(numbers)) != len(numbers):
        raise TaskSpecError(f"{path}: field 'n': each task needs its own number, got {numbers}")
    return specs


@lru_cache(maxsize=1)
def load_specs(repos_dir: Path = REPOS_DIR) -> tuple[TaskSpec, ...]:
    """Every bundled task, in REPOS order (tasks.jsonl's)."""
    found = {p.stem for p in repos_dir.glob("*.yaml")}
    if found != set(REPOS):
        raise TaskSpecError(f"{repos_dir}: spec files {sorted(found)} do not match REPOS {sorted(REPOS)}")
    return tuple(spec for repo in REPOS for spec in load_spec_file(repos_dir / f"{repo}.yaml"))
