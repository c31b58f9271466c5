"""Which Docker image a SWE row runs in (building the bundled tasks' images is envd.images)."""

from __future__ import annotations

from typing import Any

from swe.tasks.specs import REPO_PREFIX, task_image_name


def image_for(instance: dict[str, Any], data_source: str | None = None) -> str:
    """The Docker image a SWE row runs in.

    A row's own `image_name` wins; bundled tasks (repo `swarl-tasks/...`) use
    `swarl/task.<name>-<n>:latest`; otherwise SWE-bench or SWE-Gym naming. SWE-Gym rows are
    told apart by `data_source` (argument or row field) mentioning "gym", or, failing that, by
    lacking `environment_setup_commit` (SWE-Gym rows have no such column).
    """
    if instance.get("image_name"):
        return str(instance["image_name"])
    iid = instance.get("instance_id")
    if not iid or not isinstance(iid, str):
        raise ValueError("instance_id: required to name the image")
    repo = str(instance.get("repo") or "")
    if repo.startswith(f"{REPO_PREFIX}/"):
        return task_image_name(iid)
    source = (data_source or instance.get("data_source") or "").lower()
    if "gym" in source:
        gym = True
    elif "swe-bench" in source or "swe_bench" in source or "swebench" in source:
        gym = False
    else:
        gym = "environment_setup_commit" not in instance
    if gym:
        return f"docker.io/xingyaoww/sweb.eval.x86_64.{iid.replace('__', '_s_')}:latest".lower()
    return f"docker.io/swebench/sweb.eval.x86_64.{iid.replace('__', '_1776_')}:latest".lower()
