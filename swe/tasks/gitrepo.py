"""Deterministic git commits for the bundled tasks.

The same files committed with this identity, date and message give the same commit sha on
any git (here, to write base_commit into the rows, and inside the image's /testbed)."""

from __future__ import annotations

import subprocess
from pathlib import Path

GIT_ENV = {
    "GIT_AUTHOR_NAME": "swarl tasks",
    "GIT_AUTHOR_EMAIL": "tasks@swarl.invalid",
    "GIT_AUTHOR_DATE": "2024-01-01T00:00:00+0000",
    "GIT_COMMITTER_NAME": "swarl tasks",
    "GIT_COMMITTER_EMAIL": "tasks@swarl.invalid",
    "GIT_COMMITTER_DATE": "2024-01-01T00:00:00+0000",
}
COMMIT_MESSAGE = "Initial commit"
# Neutralise the caller's git config (signing, hooks, prefixes, renames) for stable output.
_GIT_OPTS = ["-c", "commit.gpgsign=false", "-c", "core.hooksPath=/dev/null", "-c", "core.autocrlf=false",
             "-c", "diff.noprefix=false", "-c", "diff.mnemonicPrefix=false", "-c", "core.abbrev=12",
             "-c", "init.defaultBranch=main", "-c", "user.useConfigOnly=false"]


def git(repo: Path, *args: str) -> str:
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": str(repo), "GIT_CONFIG_NOSYSTEM": "1",
           "GIT_CONFIG_GLOBAL": "/dev/null", **GIT_ENV}
    proc = subprocess.run(["git", *_GIT_OPTS, *args], cwd=repo, env=env, capture_output=True, text=True,
                          timeout=60)
    if proc.returncode != 0:
        raise RuntimeError(f"git {' '.join(args)} failed in {repo}: {proc.stderr.strip()}")
    return proc.stdout


def write_files(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
        p.chmod(0o644)


def commit_all(root: Path) -> str:
    """`git init && git add -A && git commit` with the fixed identity; returns the sha."""
    git(root, "init", "-q")
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", COMMIT_MESSAGE)
    return git(root, "rev-parse", "HEAD").strip()


def diff_after(root: Path, changed: dict[str, str]) -> str:
    """The git diff that writing `changed` into the committed tree makes; the tree is reset after."""
    write_files(root, changed)
    try:
        return git(root, "diff", "--no-color", "--no-ext-diff", "--no-renames", "--src-prefix=a/",
                   "--dst-prefix=b/")
    finally:
        git(root, "checkout", "-q", "--", *changed)
