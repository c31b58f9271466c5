"""Real SWE-bench Lite rows of repositories that run their own test runner, in images built
here from Debian packages (no registry is reachable): django's tests/runtests.py and sympy's
bin/test, each with its row's own eval script (SWE-bench's: `pip install -e .` before the
tests), and the bundled invoicekit task given the same install step (a pytest row that runs the
project's code before its tests).

`real_row(client, name)` -> (image, row): the image is cached by a content-hash label; the row
is the Lite row with its base_commit replaced by the image's commit (the source is PyPI's sdist
of the last release the row's fix is not in, committed afresh; `pip download`, cached under
~/.cache/swarl/real-rows; without PyPI the tests that need it skip, and fail under CI). The row's
patches apply to those releases as they do to its base commit. sympy's sdist ships no bin/test, so
the image gets BIN_TEST: the options the row's eval script passes, then sympy's own runner
(sympy.test, which is what the grader observes), as sympy's bin/test does. The image's Python
is Debian's 3.11 with pip, setuptools and wheel; pip works offline (PIP_NO_INDEX), installs
into the system (PIP_BREAK_SYSTEM_PACKAGES) without build isolation, as a SWE-bench env does.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

import pytest
from fixtures_tasks import read_lite

REAL_BASE = "swarl/real-base:bookworm"
REAL_PACKAGES = ["git", "python3", "python3-pytest", "patch", "procps", "coreutils", "ca-certificates",
                 "python3-pip", "python3-setuptools", "python3-wheel", "python-is-python3", "python3-mpmath",
                 "python3-sqlparse"]
PIP_ENV = ["PIP_BREAK_SYSTEM_PACKAGES=1", "PIP_NO_INDEX=1", "PIP_NO_BUILD_ISOLATION=0",
           "PIP_DISABLE_PIP_VERSION_CHECK=1", "PIP_ROOT_USER_ACTION=ignore"]
CACHE = Path(os.environ.get("SWARL_REAL_ROWS_CACHE", Path.home() / ".cache" / "swarl" / "real-rows"))
RECIPE = "2"
# sympy's bin/test as the row uses it (written here: the sdist has no bin/): -C turns the cache off
# before sympy is imported, the rest goes to sympy.test in its own subprocess, as upstream's does.
BIN_TEST = """#!/usr/bin/env python
import argparse, os, sys
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
p = argparse.ArgumentParser(prog="bin/test")
p.add_argument("-v", "--verbose", action="store_true")
p.add_argument("-C", "--no-cache", dest="cache", action="store_false")
p.add_argument("-k", dest="kw", default="")
p.add_argument("--tb", default="short")
p.add_argument("--timeout", type=int, default=False)
p.add_argument("tests", nargs="*")
a = p.parse_args()
if not a.cache:
    os.environ["SYMPY_USE_CACHE"] = "no"
import sympy
sys.exit(0 if sympy.test(*a.tests, verbose=a.verbose, kw=a.kw, tb=a.tb, timeout=a.timeout) else 1)
"""
# name -> how to get its source: the Lite row, the pip sdist, files added to it, and wheels
ROWS: dict[str, dict[str, Any]] = {
    "django": {"lite": "django__django-16595", "sdist": "Django==4.2", "wheels": ["asgiref==3.7.2"]},
    "sympy": {"lite": "sympy__sympy-24152", "sdist": "sympy==1.11.1", "wheels": ["mpmath==1.3.0"],
              "files": {"bin/test": BIN_TEST}},  # Debian's python3-mpmath says it is 0.0.0
    "invoicekit-install": {"bundled": "swarl-tasks__invoicekit-1"},
}
INSTALL = "python -m pip install -e ."


def _skip(why: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(why)
    pytest.skip(why)


def _pip_download(spec: str, binary: bool) -> Path:
    out = CACHE / "dl"
    out.mkdir(parents=True, exist_ok=True)
    name = spec.split("==")[0].lower()
    have = [p for p in out.iterdir() if p.name.lower().startswith(name.replace("-", "_")) or
            p.name.lower().startswith(name)]
    want = [p for p in have if p.name.endswith(".whl" if binary else ".tar.gz") and spec.split("==")[1] in p.name]
    if not want:
        kind = ["--only-binary", ":all:"] if binary else ["--no-binary", ":all:"]
        proc = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", *kind, spec, "-d", str(out)],
                              capture_output=True, text=True, timeout=600)
        if proc.returncode != 0:
            _skip(f"pip download {spec} failed: {proc.stderr[-500:]}")
        want = [p for p in out.iterdir() if p.name.endswith(".whl" if binary else ".tar.gz")
                and spec.split("==")[1] in p.name and p.name.lower().startswith(name)]
    return want[0]


def _source(spec: dict[str, Any]) -> tuple[bytes, list[Path]]:
    """(a tar of the repository's tree at /testbed, wheels to install first)."""
    if "sdist" in spec:
        sdist = _pip_download(spec["sdist"], binary=False)
        top = sdist.name.removesuffix(".tar.gz")
        buf = io.BytesIO()
        with tarfile.open(sdist) as src, tarfile.open(fileobj=buf, mode="w") as dst:
            for m in src.getmembers():
                if not m.name.startswith(top + "/") or m.issym() or m.islnk():
                    continue
                f = src.extractfile(m) if m.isfile() else None
                m.name = "testbed/" + m.name[len(top) + 1:]
                dst.addfile(m, f)
            for name, text in spec.get("files", {}).items():
                info = tarfile.TarInfo("testbed/" + name)
                info.size, info.mode = len(text.encode()), 0o755
                dst.addfile(info, io.BytesIO(text.encode()))
        return buf.getvalue(), [_pip_download(w, binary=True) for w in spec.get("wheels", [])]
    from envd.images import _tar_of
    from swe.tasks import task_files

    return _tar_of(task_files(spec["bundled"])), []


def _row(spec: dict[str, Any]) -> dict[str, Any]:
    if "lite" in spec:
        return next(dict(r) for r in read_lite() if r["instance_id"] == spec["lite"])
    from swe.tasks import load_tasks

    row = dict(next(r for r in load_tasks("all") if r["instance_id"] == spec["bundled"]))
    lines = row["eval_script"].splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("git checkout "))
    row["eval_script"] = "\n".join([*lines[:at], INSTALL, *lines[at:]]) + "\n"  # as SWE-bench's scripts do
    row["instance_id"] = "swarl-tasks__invoicekit-install-1"
    return row


def real_row(client: Any, name: str) -> tuple[str, dict[str, Any]]:
    """The image and row of ROWS[name], built once (cached by content hash)."""
    from common.files import machine_lock
    from envd.images import IMAGE_ENV, LABEL_HASH, ensure_debian_image
    from swe.tasks.gitrepo import GIT_ENV

    spec = ROWS[name]
    row = _row(spec)
    image = f"swarl/real-{name}:latest"
    with machine_lock(f"real-row-{name}"):
        base = ensure_debian_image(client, REAL_BASE, REAL_PACKAGES)
        want = hashlib.sha256(json.dumps([RECIPE, spec, client.images.get(base).id, PIP_ENV]).encode()).hexdigest()[:16]
        with contextlib.suppress(Exception):
            img = client.images.get(image)
            if img.labels.get(LABEL_HASH) == want:
                row["base_commit"] = img.labels["swarl.commit"]
                return image, _finish(row, image)
        tree, wheels = _source(spec)
        c = client.containers.create(base, ["sleep", "infinity"], network_mode="none", working_dir="/")
        try:
            c.start()
            c.put_archive("/", tree)
            buf = io.BytesIO()
            with tarfile.open(fileobj=buf, mode="w") as tf:
                for w in wheels:
                    tf.add(str(w), arcname=f"tmp/wheels/{w.name}")
            if wheels:
                c.put_archive("/", buf.getvalue())
            env = {**dict(e.split("=", 1) for e in PIP_ENV), **GIT_ENV}
            steps = [*(["python -m pip install -q /tmp/wheels/*.whl"] if wheels else []),
                     "cd /testbed && git init -q && git add -A && git commit -q -m 'Initial commit'",
                     f"cd /testbed && {INSTALL} -q && rm -rf /root/.cache /tmp/wheels && git status --porcelain"]
            for step in steps:
                res = c.exec_run(["bash", "-lc", step], environment=env)
                assert res.exit_code == 0, (step, res.output.decode(errors="replace")[-2000:])
            commit = c.exec_run(["git", "-C", "/testbed", "rev-parse", "HEAD"]).output.decode().strip()
            repo, tag = image.rsplit(":", 1)
            c.commit(repository=repo, tag=tag, conf={
                "Labels": {LABEL_HASH: want, "swarl.commit": commit}, "WorkingDir": "/testbed",
                "Env": [*IMAGE_ENV, *PIP_ENV], "Cmd": ["sleep", "infinity"]})
        finally:
            c.remove(force=True)
        row["base_commit"] = commit
        return image, _finish(row, image)


def _finish(row: dict[str, Any], image: str) -> dict[str, Any]:
    row["image_name"] = image
    return row


@pytest.fixture(scope="session")
def real_rows(docker_client: Any) -> Any:
    """make(name) -> (image, row), built at most once per session."""
    made: dict[str, tuple[str, dict[str, Any]]] = {}

    def make(name: str) -> tuple[str, dict[str, Any]]:
        if name not in made:
            made[name] = real_row(docker_client, name)
        return made[name][0], dict(made[name][1])

    return make


def main() -> None:  # `python tests/fixtures_real_rows.py [name...]`: build the images ahead of time
    import docker

    from common.services import ensure_docker

    client = docker.DockerClient(base_url=ensure_docker(), timeout=1800)
    for name in sys.argv[1:] or list(ROWS):
        print(name, real_row(client, name)[0], flush=True)


if __name__ == "__main__":
    main()
