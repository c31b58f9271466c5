"""What an eval script's install step (`pip install -e .`: the patch's setup.py, run as root)
may leave behind, judged from outside the container before the referee's files exist
(envd.graded_run.install_checks): a process still running, a change on disk outside the
repository and the places an install writes, git's global settings beyond the eval script's
own `safe.directory`. Each is a Tamper of kind `install_step`: the install step would have
reached the interpreter, the runner, git or the shell that run the tests, or the referee's key.

Allowed: the repository (/testbed, but not git's hooks, settings and attributes, nor a root
module named like a standard-library one; its test infrastructure is compared with git's HEAD
just before the referee starts, envd.referee.RefereePlan.scripts), temporary
and cache directories, and site-packages except the runner's own packages and start-up hooks
(an install writes its package, its metadata, .pth files and console scripts there); console
scripts in a bin directory, except the interpreter, pip, pytest, the shell and git."""

from __future__ import annotations

import re
from pathlib import PurePosixPath
from typing import Any

from swe.tamper import STDLIB, Tamper

__all__ = ["gitconfig_tampers", "survivors", "system_changes"]

_FREE = ("/tmp/", "/var/tmp/", "/root/.cache/", "/run/", "/dev/", "/proc/", "/sys/")
_DOCKER = {"/usr/sbin/docker-init", "/sbin/docker-init", "/.dockerenv", "/etc/hostname", "/etc/hosts",
           "/etc/resolv.conf"}  # Docker's own, in every container
_GIT_INTERNALS = ("hooks", "config", "info", "modules")
_RUNNER_DISTS = re.compile(r"^(_?pytest|pluggy|py|iniconfig|_pytest\w*|pytest_\w+)(\.py|-[^/]*\.(dist|egg)-info)?$",
                           re.I)
_SITE_HOOKS = {"sitecustomize.py", "usercustomize.py"}  # run by every interpreter start, the referee's too
_KEPT_BINS = re.compile(r"^(python[\d.]*(-config)?|pip[\d.]*|pytest|py\.test|bash|sh|dash|env|git|timeout|"
                        r"conda|activate|deactivate)$")
_SITE = re.compile(r"/(site|dist)-packages/")


def survivors(top: dict[str, Any]) -> list[Tamper]:
    """Processes in the container other than its init and main process (docker top's table):
    what the install step started and left running would be there when the key is written."""
    titles = [str(t).upper() for t in top.get("Titles", [])]
    rows = [dict(zip(titles, r, strict=False)) for r in top.get("Processes", []) or []]
    alive = [r for r in rows if not str(r.get("STAT", "")).startswith("Z")]
    pids = {str(r.get("PID")) for r in alive}
    stray = [r for r in alive if str(r.get("PPID")) in pids and not _main(str(r.get("COMMAND", r.get("ARGS", ""))))]
    if not stray:
        return []
    what = ", ".join(str(r.get("COMMAND", r.get("ARGS", "?")))[:60] for r in stray[:3])
    return [Tamper("install_step", "<processes>", f"a process of the install step outlived it ({what})")]


def _main(cmd: str) -> bool:
    return cmd.split()[:2] == ["sleep", "infinity"] or cmd.startswith(("/sbin/docker-init", "docker-init"))


def system_changes(changes: list[dict[str, Any]]) -> list[Tamper]:
    """Changed paths (docker diff: Path, Kind 0 changed / 1 added / 2 deleted) outside what an
    install writes; directories are judged by what changed inside them."""
    paths = sorted({str(c.get("Path", "")) for c in changes if c.get("Path")})
    leaves = [p for i, p in enumerate(paths) if not (i + 1 < len(paths) and paths[i + 1].startswith(p + "/"))]
    bad = [p for p in leaves if not _allowed(p)]
    return [Tamper("install_step", p, f"{p}: changed by the install step, outside the package and its install "
                                      "(the interpreter, the runner, git or shell start-up files)") for p in bad[:5]]


def _allowed(path: str) -> bool:
    if path == "/root/.gitconfig" or path.startswith(_FREE) or path in ("/tmp", "/root/.cache", "/root") or \
            path in _DOCKER:
        return True
    if path == "/testbed" or path.startswith("/testbed/"):
        rel = PurePosixPath(path[len("/testbed/"):]) if path != "/testbed" else PurePosixPath(".")
        parts = rel.parts
        if parts[:1] == (".git",):
            return len(parts) < 2 or parts[1] not in _GIT_INTERNALS
        # a root module the tests would import instead of the standard library's; the rest of the
        # repository is the package's (its test infrastructure is checked by git before the tests)
        return not ((len(parts) == 1 and parts[0].endswith(".py") and parts[0][:-3] in STDLIB) or
                    (len(parts) == 2 and parts[1] == "__init__.py" and parts[0] in STDLIB))
    m = _SITE.search(path)
    if m:
        rel = PurePosixPath(path[m.end():])
        return bool(rel.parts) and not _RUNNER_DISTS.match(rel.parts[0]) and rel.parts[0] not in _SITE_HOOKS
    name = PurePosixPath(path)
    return name.parent.name == "bin" and "/lib/" not in path and not _KEPT_BINS.match(name.name)


def gitconfig_tampers(text: str) -> list[Tamper]:
    """/root/.gitconfig may hold only what the eval script writes (`safe.directory`)."""
    section, extra = "", []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            section = line.strip("[]").strip().lower()
            continue
        key = line.split("=", 1)[0].strip().lower()
        if not (section == "safe" and key == "directory"):
            extra.append(f"{section}.{key}")
    if not extra:
        return []
    return [Tamper("install_step", "/root/.gitconfig", f"/root/.gitconfig: git settings the eval script does not "
                                                       f"write ({', '.join(extra[:3])}) run code in its git steps")]
