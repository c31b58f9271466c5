"""The steps of a graded run in a fresh container that are not the referee's: the patch applied
and the test infrastructure put back in one exec (`prepare_script`), the files of a step put in
one archive (`put_files`), and, between the two parts of an eval script that runs the
project's code before its tests, what envd checks from outside the container
(`install_checks`): that no process of that part is left, and what it changed on disk
(swe.install.system_changes). The Docker calls go through the Docker SDK's low-level client."""

from __future__ import annotations

import io
import re
import shlex
import tarfile
import time
from typing import Any

from swe import grading, tamper
from swe.install import gitconfig_tampers, survivors, system_changes

__all__ = ["APPLY_FAILED", "RESTORE_FAILED", "SETUP_FAILED", "install_checks", "prepare_script", "put_files", "settings_tampers"]

APPLY_FAILED = 97
RESTORE_FAILED = 98
SETUP_FAILED = "the row's setup script failed"  # how an answer whose setup script failed begins
GITCONFIG = "/root/.gitconfig"


def put_files(api: Any, container_id: str, files: dict[str, tuple[bytes, int]]) -> None:
    """Write `files` ({path: (data, mode)}; a path ending in / is a directory) into the
    container with one archive."""
    buf = io.BytesIO()
    now = int(time.time())
    with tarfile.open(fileobj=buf, mode="w") as tf:
        for path, (data, mode) in files.items():
            info = tarfile.TarInfo(path.strip("/"))
            info.mode, info.mtime = mode, now
            if path.endswith("/"):
                info.type = tarfile.DIRTYPE
                tf.addfile(info)
                continue
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    api.put_archive(container_id, "/", buf.getvalue())


def prepare_script(instance: dict[str, Any] | None, patch: str, cwd: str, sep: str, prefix: str = "") -> str:
    """Bash: `prefix`, the patch applied as the harness applies it (exit APPLY_FAILED when no
    way applies), then for a row: each setup.cfg / pyproject.toml the patch touches as HEAD has
    it and as it is now (between `sep` lines, for settings_tampers), and the test
    infrastructure put back to the base commit (exit RESTORE_FAILED when that fails)."""
    attempts = " || ".join(f"{cmd} {grading.PATCH_PATH}" for cmd in grading.APPLY_PATCH_COMMANDS)
    lines = [f"cd {shlex.quote(cwd)}", f"{prefix}({attempts}) || exit {APPLY_FAILED}"]
    if instance is not None:
        for path in tamper.settings_files(patch):
            q = shlex.quote(path)
            lines.append(f"echo {shlex.quote(f'{sep}B {path}')}; git show HEAD:{q} 2>/dev/null; echo; echo '{sep}A'; "
                         f"cat {q} 2>/dev/null; echo; echo '{sep}E'")
        lines.append(f"( set -e\n{tamper.restore_script(instance, cwd)}) || exit {RESTORE_FAILED}")
    return "\n".join(lines) + "\n"


def settings_tampers(output: str, sep: str) -> list[tamper.Tamper]:
    """The pytest settings prepare_script printed, compared parsed (a change is refused)."""
    found = []
    for m in re.finditer(rf"^{sep}B (.*?)\n(.*?)^{sep}A\n(.*?)^{sep}E$", output, re.S | re.M):
        hit = tamper.pytest_settings_changed(m.group(1).strip(), m.group(2), m.group(3))
        if hit:
            found.append(hit)
    return found


def install_checks(api: Any, container_id: str) -> list[tamper.Tamper]:
    """From outside the container, after the part of the eval script that ran the project's
    code: processes it left, files it changed outside the repository and the package's place,
    git's global settings beyond what the eval script sets."""
    found = survivors(api.top(container_id, ps_args="-eo pid,ppid,stat,args"))
    changes = api.diff(container_id) or []
    found += system_changes(changes)
    if any(c.get("Path") == GITCONFIG for c in changes):
        found += gitconfig_tampers(_read(api, container_id, GITCONFIG))
    return found


def _read(api: Any, container_id: str, path: str) -> str:
    stream, _stat = api.get_archive(container_id, path)
    raw = b"".join(stream)
    with tarfile.open(fileobj=io.BytesIO(raw)) as tf:
        member = tf.next()
        f = tf.extractfile(member) if member is not None else None
        return f.read().decode("utf-8", "replace") if f is not None else ""
