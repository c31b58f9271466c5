"""common.provenance names the commit of a real git checkout, says when its tracked files differ,
and names nothing for a directory that is not a checkout's top (an installed wheel inside some
other project's repository)."""

from __future__ import annotations

import subprocess
from pathlib import Path

from common.provenance import ROOT, code_version, describe


def git(root: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(root), "-c", "user.name=t", "-c", "user.email=t@t", *args],
                          capture_output=True, text=True, check=True).stdout.strip()


def test_a_checkout_its_commit_and_its_changes(tmp_path: Path) -> None:
    git(tmp_path, "init", "-q")
    assert code_version(tmp_path) is None  # no commit yet
    (tmp_path / "a.py").write_text("x = 1\n")
    git(tmp_path, "add", "a.py")
    git(tmp_path, "commit", "-qm", "one")
    head = git(tmp_path, "rev-parse", "HEAD")
    assert code_version(tmp_path) == {"commit": head, "dirty": False}
    (tmp_path / "new.py").write_text("untracked\n")  # an untracked file is not the code that ran
    assert code_version(tmp_path) == {"commit": head, "dirty": False}
    (tmp_path / "a.py").write_text("x = 2\n")
    assert code_version(tmp_path) == {"commit": head, "dirty": True}
    assert describe(code_version(tmp_path)) == f"{head[:7]} with uncommitted changes"


def test_not_the_top_of_a_checkout_is_not_recorded(tmp_path: Path) -> None:
    git(tmp_path, "init", "-q")
    (tmp_path / "a.py").write_text("x = 1\n")
    git(tmp_path, "add", "a.py")
    git(tmp_path, "commit", "-qm", "one")
    site = tmp_path / ".venv" / "lib" / "site-packages"
    site.mkdir(parents=True)
    assert code_version(site) is None  # inside the project's repository, not swarl's checkout
    plain = tmp_path.parent / (tmp_path.name + "-plain")
    plain.mkdir()
    assert code_version(plain) is None
    assert describe(None) == "code not recorded"


def test_this_checkout() -> None:
    code = code_version()
    if (ROOT / ".git").exists():
        assert code is not None and code["commit"] == git(ROOT, "rev-parse", "HEAD")
    else:
        assert code is None
