"""Fixtures for the bundled task suite and its images (owned by the task suite).

`task_images` (session): builds every bundled task image once (cached by content hash) and
returns {instance_id: image}. `TaskRunner` evaluates several patch / command variants of one
task in one container of its image (reset between variants with git reset/clean), the way
envd's /container/evaluate does, and grades each with swe.grading.grade. `patch_of` and
`evaluate_patch` drive an agent container through envd's own HTTP API instead (what the reward-hack
tests grade through).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

LITE = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "swe-bench-lite-test.json"
VARIANT_START = "@@swarl-variant-start "
VARIANT_END = "@@swarl-variant-end "


@dataclass
class Variant:
    name: str
    patch: str | None = None  # a diff applied the harness's way
    command: str | None = None  # or a bash command run in /testbed (e.g. swarl_fix_command)
    evaluate: bool = True  # run the eval script and grade; False: only the command's output
    files: dict[str, str] = field(default_factory=dict)  # written into the container first


def _put_files(container: Any, files: dict[str, str]) -> None:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for path, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(path.lstrip("/"))
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
    container.put_archive("/", buf.getvalue())


class TaskRunner:
    """One container of a task image; `run(row, variants)` → {variant name: (EvalReport | None, log)}."""

    def __init__(self, client: Any, image: str) -> None:
        self.container = client.containers.create(image, command=["sleep", "infinity"],
                                                  network_disabled=True, working_dir="/testbed")
        self.container.start()

    def run(self, row: dict[str, Any], variants: list[Variant], timeout_s: int = 240) -> dict[str, tuple[Any, str]]:
        from swe.grading import apply_patch_script, eval_script_for, grade

        files = {"/tmp/swarl_eval.sh": eval_script_for(row)}
        script = ["cd /testbed"]
        for i, v in enumerate(variants):
            files.update(v.files)
            script += [f"echo '{VARIANT_START}{v.name}'",
                       "(cd /testbed && git reset -q --hard && git clean -qfdx) 2>&1"]
            if v.patch is not None:
                files[f"/tmp/swarl_variant_{i}.sh"] = apply_patch_script(v.patch, path=f"/tmp/swarl_{i}.patch")
                script.append(f"bash /tmp/swarl_variant_{i}.sh 2>&1")
            if v.command is not None:
                script.append(f"(cd /testbed && {v.command}) 2>&1")
            if v.evaluate:
                script.append("bash /tmp/swarl_eval.sh 2>&1")
            script.append(f"echo '{VARIANT_END}{v.name}'")
        files["/tmp/swarl_run.sh"] = "\n".join(script) + "\n"
        _put_files(self.container, files)
        res = self.container.exec_run(["timeout", str(timeout_s), "bash", "/tmp/swarl_run.sh"])
        out = res.output.decode(errors="replace")
        results = {}
        for v in variants:
            log = out.split(VARIANT_START + v.name + "\n", 1)[-1].split(VARIANT_END + v.name, 1)[0]
            results[v.name] = (grade(row, log) if v.evaluate else None, log)
        return results

    def close(self) -> None:
        self.container.remove(force=True)


def run_variants(client: Any, image: str, row: dict[str, Any], variants: list[Variant],
                 timeout_s: int = 240) -> dict[str, tuple[Any, str]]:
    """`TaskRunner.run` in a container of its own, removed afterwards whatever happens."""
    runner = TaskRunner(client, image)
    try:
        return runner.run(row, variants, timeout_s=timeout_s)
    finally:
        runner.close()


@pytest.fixture(scope="session")
def docker_client(docker_url: str) -> Iterator[Any]:
    import docker

    client = docker.DockerClient(base_url=docker_url, timeout=600)
    yield client
    client.close()


@pytest.fixture(scope="session")
def task_images(docker_client: Any) -> dict[str, str]:
    """Every bundled task's image, built once (cached across sessions): {instance_id: image}."""
    from envd.images import build_task_images
    from swe.tasks import load_tasks

    tasks = load_tasks("all")
    images = build_task_images(docker_client, tasks, progress=False)
    return {t["instance_id"]: image for t, image in zip(tasks, images, strict=True)}


def read_lite() -> list[dict[str, Any]]:
    """The 300 SWE-bench Lite rows; absent, the tests that need them skip, except in CI (CI=true),
    where a missing data file is a failure."""
    if not LITE.is_file():
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(f"{LITE} is absent: CI must provide the SWE-bench Lite rows in <repo>/../shared/data")
        pytest.skip(f"{LITE} is absent")
    return json.loads(LITE.read_text())


__all__ = ["TaskRunner", "Variant", "docker_client", "task_images"]


def build_task_image(docker_url: str, task: dict[str, Any]) -> str:
    """The task's image, built on the base image (both cached by content hash)."""
    import docker

    from envd.images import build_task_image as build
    from envd.images import ensure_base_image

    client = docker.DockerClient(base_url=docker_url, timeout=600)
    try:
        ensure_base_image(client)
        return build(client, task)[0]
    finally:
        client.close()


@contextlib.contextmanager
def envd_client(envd_server: Any) -> Iterator[Any]:
    """An httpx.Client at envd's URL with its token."""
    import httpx

    with httpx.Client(base_url=envd_server.url, headers={"Authorization": f"Bearer {envd_server.token}"},
                      timeout=300) as c:
        yield c


def patch_of(api: Any, cid: str, command: str) -> str:
    """Reset container `cid` on envd, run `command` in it, return the diff it left."""
    reset = api.post("/container/exec", json={"container_id": cid, "command": "git reset -q --hard && git clean -qfdx"})
    assert reset.json()["returncode"] == 0, reset.text
    out = api.post("/container/exec", json={"container_id": cid, "command": command}).json()
    assert out["returncode"] == 0, out
    patch = api.post("/container/diff", json={"container_id": cid}).json()["patch"]
    assert patch.startswith("diff --git"), patch
    return patch


def evaluate_patch(api: Any, cid: str, patch: str, task: dict[str, Any]) -> dict[str, Any]:
    """envd's /container/evaluate of `patch` on `task` in container `cid`."""
    r = api.post("/container/evaluate", json={"container_id": cid, "patch": patch, "instance": task, "timeout": 120})
    assert r.status_code == 200, r.text
    return r.json()
