"""Image naming (SWE-bench, SWE-Gym, image_name, bundled), the Debian mirror, `swarl images`
commands, and the cached building of the base and task images (real dockerd)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from envd.images import (
    BASE_IMAGE,
    LABEL_HASH,
    LABEL_TASK,
    build_task_image,
    build_task_images,
    debian_mirror,
    ensure_base_image,
)
from swe.harness import image_for
from swe.tasks import get_task, load_tasks

SWARL = [str(Path(sys.executable).with_name("swarl"))]
LITE = Path(__file__).resolve().parents[2] / ".." / "shared" / "data" / "swe-bench-lite-test.json"


def test_swe_bench_naming() -> None:
    row = {"instance_id": "django__django-15202", "repo": "django/django", "environment_setup_commit": "x"}
    assert image_for(row) == "docker.io/swebench/sweb.eval.x86_64.django_1776_django-15202:latest"
    row = {"instance_id": "Scikit-Learn__scikit-learn-1", "environment_setup_commit": "x"}
    assert image_for(row) == "docker.io/swebench/sweb.eval.x86_64.scikit-learn_1776_scikit-learn-1:latest"


def test_swe_gym_naming() -> None:
    # SWE-Gym rows have no environment_setup_commit; data_source says so explicitly too.
    row = {"instance_id": "getmoto__moto-5752", "repo": "getmoto/moto", "base_commit": "b2300f1eae1"}
    expected = "docker.io/xingyaoww/sweb.eval.x86_64.getmoto_s_moto-5752:latest"
    assert image_for(row) == expected
    with_env = {**row, "environment_setup_commit": "x"}
    assert image_for(with_env, data_source="SWE-Gym/SWE-Gym") == expected
    assert image_for({**with_env, "data_source": "SumanthRH/SWE-Gym-Subset"}) == expected
    assert image_for(row, data_source="princeton-nlp/SWE-bench_Lite").startswith("docker.io/swebench/")


def test_image_name_wins_and_bundled_tasks() -> None:
    assert image_for({"instance_id": "a__b-1", "image_name": "reg.local/custom:1"}) == "reg.local/custom:1"
    assert image_for({"instance_id": "swarl-tasks__pagekit-2", "repo": "swarl-tasks/pagekit"}) == \
        "swarl/task.pagekit-2:latest"
    with pytest.raises(ValueError, match=r"^field .instance_id.: required to name the image"):
        image_for({"repo": "django/django"})


def test_naming_matches_the_harness_for_real_rows() -> None:
    if not LITE.is_file():
        pytest.skip(f"{LITE} is absent")
    from swebench.harness.test_spec.test_spec import make_test_spec

    rows = [r for r in json.loads(LITE.read_text()) if r["repo"] in ("psf/requests", "pytest-dev/pytest")]
    assert rows
    for row in rows:
        assert image_for(row) == "docker.io/" + make_test_spec(row, namespace="swebench").instance_image_key


def test_debian_mirror_from_apt_sources(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SWARL_DEBIAN_MIRROR", raising=False)
    d = tmp_path / "sources.list.d"
    d.mkdir()
    (d / "debian.sources").write_text(
        "Types: deb\nURIs: http://mirror.example/debian-security\nSuites: bookworm-security\n"
        "Components: main\n\nTypes: deb\n# comment\nURIs: http://mirror.example/debian\n"
        "Suites: bookworm bookworm-updates\nComponents: main\n")
    assert debian_mirror(tmp_path) == "http://mirror.example/debian"
    (d / "debian.sources").unlink()
    (tmp_path / "sources.list").write_text("# x\ndeb [arch=amd64] http://old.example/debian bookworm main\n")
    assert debian_mirror(tmp_path) == "http://old.example/debian"
    (tmp_path / "sources.list").unlink()
    assert debian_mirror(tmp_path) == "http://deb.debian.org/debian"
    monkeypatch.setenv("SWARL_DEBIAN_MIRROR", "http://env.example/debian")
    assert debian_mirror(tmp_path) == "http://env.example/debian"


def _swarl(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*SWARL, "images", *args], input=stdin, capture_output=True, text=True, timeout=120)


def test_cli_name(tmp_path: Path) -> None:
    row = {"instance_id": "psf__requests-2317", "repo": "psf/requests", "environment_setup_commit": "x"}
    out = _swarl("name", json.dumps(row))
    assert out.returncode == 0 and out.stdout.strip() == "docker.io/swebench/sweb.eval.x86_64.psf_1776_requests-2317:latest"
    f = tmp_path / "row.json"
    f.write_text(json.dumps({"text": "x", "metadata": {"instance": {"instance_id": "getmoto__moto-1"},
                                                       "data_source": "SWE-Gym/SWE-Gym"}}))
    assert _swarl("name", str(f)).stdout.strip() == "docker.io/xingyaoww/sweb.eval.x86_64.getmoto_s_moto-1:latest"
    assert _swarl("name", "--data-source", "swe-gym", json.dumps({"instance_id": "getmoto__moto-1"})).stdout.strip() \
        == "docker.io/xingyaoww/sweb.eval.x86_64.getmoto_s_moto-1:latest"
    # no family's marks: read in SWE-bench's format (SWE-Gym's fallback), named as SWE-Gym's
    bare = _swarl("name", json.dumps({"instance_id": "getmoto__moto-1"}))
    assert bare.returncode == 0 and bare.stdout.strip() == "docker.io/xingyaoww/sweb.eval.x86_64.getmoto_s_moto-1:latest"
    assert _swarl("name", "-", stdin=json.dumps(get_task("swarl-tasks__statkit-3"))).stdout.strip() == \
        "swarl/task.statkit-3:latest"
    bad = _swarl("name", "{not json")
    assert bad.returncode == 2 and "swarl:" in bad.stderr
    missing = _swarl("name", json.dumps({"repo": "x/y"}))
    assert missing.returncode == 2 and "instance_id" in missing.stderr


def test_cli_list_tasks() -> None:
    out = _swarl("list-tasks", "--split", "heldout")
    assert out.returncode == 0
    lines = out.stdout.strip().splitlines()
    assert len(lines) == 8 and all(line.split("\t")[1] == "heldout" for line in lines)


# --- building (real dockerd) ---------------------------------------------------------------

@pytest.mark.docker
def test_base_image_is_cached(docker_client: Any) -> None:
    assert ensure_base_image(docker_client) == BASE_IMAGE  # built once (debootstrap), then cached
    out = docker_client.containers.run(BASE_IMAGE, ["bash", "-c", "python3 -m pytest --version && git --version && patch --version && ps --version"],
                                       remove=True, network_disabled=True, stderr=True)
    assert b"pytest" in out and b"git version" in out and b"GNU patch" in out and b"procps" in out


@pytest.mark.docker
def test_task_images_cached_by_content_hash(docker_client: Any, task_images: dict[str, str]) -> None:
    row = get_task("swarl-tasks__gradebook-2")
    image = docker_client.images.get(task_images[row["instance_id"]])
    assert image.labels[LABEL_TASK] == row["instance_id"] and len(image.labels[LABEL_HASH]) == 16
    assert image.attrs["Config"]["WorkingDir"] == "/testbed"
    seen: list[tuple[str, bool]] = []
    build_task_images(docker_client, [row], progress=False, on_image=lambda i, b: seen.append((i, b)))
    assert seen == [(row["image_name"], False)]  # cache hit
    assert build_task_image(docker_client, row, force=True) == (row["image_name"], True)
    rebuilt = docker_client.images.get(row["image_name"])
    assert rebuilt.labels[LABEL_HASH] == image.labels[LABEL_HASH]
    assert build_task_image(docker_client, row) == (row["image_name"], False)


@pytest.mark.docker
def test_cli_build_tasks(docker_client: Any, task_images: dict[str, str]) -> None:
    iid = load_tasks("heldout")[0]["instance_id"]
    out = _swarl("build-tasks", "--only", iid)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == task_images[iid]
    bad = _swarl("build-tasks", "--only", "swarl-tasks__nope-9")
    assert bad.returncode == 2 and "swarl-tasks__nope-9" in bad.stderr
