"""Durable files: what a crash (kill -9, power loss) must not leave half-written."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from filelock import FileLock


def fsync_dir(path: Path) -> None:
    """Make a rename or a new entry in directory `path` durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextmanager
def machine_lock(name: str, timeout_s: float = 3600.0) -> Iterator[None]:
    """Serialise one job across the processes of this machine (tests run in parallel workers,
    a demo and a CLI may build or start the same thing at once). Bounded: a holder that hangs
    for `timeout_s` is an error, not a silent wait."""
    with FileLock(Path(tempfile.gettempdir()) / f"swarl-{name}.lock", timeout=timeout_s):
        yield


def atomic_write_text(path: Path, text: str) -> None:
    """Replace `path` with `text` whole: a kill leaves the old file or the new one, never half."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)
