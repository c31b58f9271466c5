"""Fixtures for inference servers (owned by inference).

`cpu_server_factory.start(model_dir, ...)` launches `swarl inference serve` as a subprocess on a
free loopback port and waits for /health; `.start_scripted(tokenizer_dir, rows, ...)` does the
same for `swarl scripted-policy serve`; `cpu_server` is one CPU server on `tiny_model_dir`.
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from polling import wait_for

from inference.local_server import CpuServerHandle, start_cpu_server, start_scripted_server

__all__ = ["CpuServerHandle", "cpu_server", "cpu_server_factory", "entry", "start_cpu_server", "wait_for"]


def entry(servers: Any, server_id: str, check: Callable[[Any], bool]) -> Callable[[], Awaitable[bool]]:
    """A wait_for condition: `server_id` has a registry entry and `check(entry)` holds."""
    async def cond() -> bool:
        s = await servers.get(server_id)
        return s is not None and check(s)

    return cond


class CpuServerFactory:
    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.started: list[CpuServerHandle] = []

    def start(self, model_dir: str | os.PathLike, weight_version: str = "0", redis_url: str | None = None,
              run_id: str = "test", api_key: str | None = None, **kw) -> CpuServerHandle:
        h = start_cpu_server(model_dir, weight_version=weight_version, redis_url=redis_url, run_id=run_id,
                             api_key=api_key, log_dir=self.log_dir, **kw)
        self.started.append(h)
        return h

    def start_scripted(self, tokenizer_dir: str | os.PathLike, rows: Sequence[dict[str, Any]],
                       **kw) -> CpuServerHandle:
        h = start_scripted_server(tokenizer_dir, rows, log_dir=self.log_dir, **kw)
        self.started.append(h)
        return h

    def stop_all(self) -> None:
        for h in self.started:
            h.stop()
        self.started.clear()


@pytest.fixture
def cpu_server_factory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CpuServerFactory]:
    """Start CPU or scripted servers (subprocesses); every one is stopped at teardown."""
    factory = CpuServerFactory(tmp_path_factory.mktemp("cpu-servers"))
    yield factory
    factory.stop_all()


@pytest.fixture(scope="session")
def cpu_server(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[CpuServerHandle]:
    """One CPU server on the tiny model for the whole session (no registry). Tests that change
    its weights or pause it must restore them."""
    factory = CpuServerFactory(tmp_path_factory.mktemp("cpu-server"))
    h = factory.start(tiny_model_dir)
    yield h
    factory.stop_all()
