"""Which code made a result: the git commit of the checkout swarl's modules were loaded from.

A recorded figure (a demo run's result, a benchmark's section) names it, so that a later reader
can tell two figures of different code apart, and rerun the one they doubt.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import TypedDict

ROOT = Path(__file__).resolve().parents[1]  # the checkout (or site-packages, for an installed wheel)


class Code(TypedDict):
    commit: str
    dirty: bool  # tracked files differed from the commit when it was read


def code_version(root: Path = ROOT) -> Code | None:
    """The commit checked out at `root` and whether its tracked files differ from it. None when
    `root` is not the top of a git checkout: an installed wheel's site-packages may sit inside
    some other repository (a venv in a project), whose commit says nothing about this code."""
    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True,
                              timeout=10, check=True).stdout.strip()

    try:
        if Path(git("rev-parse", "--show-toplevel")).resolve() != root.resolve():
            return None
        return {"commit": git("rev-parse", "HEAD"),
                "dirty": bool(git("status", "--porcelain", "--untracked-files=no"))}
    except (OSError, subprocess.SubprocessError):  # no git, not a checkout, no commit yet
        return None


def describe(code: Code | None) -> str:
    """`code` in a sentence: the short commit, and whether the files differed from it."""
    if code is None:
        return "code not recorded"
    return code["commit"][:7] + (" with uncommitted changes" if code["dirty"] else "")
