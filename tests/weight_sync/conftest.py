"""Fixtures for weight_sync tests: a quick config, servers, a publisher wired to them."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from ws_helpers import API_KEY


@pytest.fixture
def ws_cfg(cfg):
    """The test config tuned for quick rolling updates."""
    ws = cfg.weight_sync
    ws.poll_interval_s = 0.2
    ws.drain_timeout_s = 20
    ws.update_timeout_s = 60
    ws.group_timeout_s = 30
    ws.retry_failed_s = 2
    ws.api_key = API_KEY
    ws.wait_rollout = True
    return cfg


@pytest.fixture
def start_servers(cpu_server_factory, tiny_model_dir, redis_url):
    def start(n: int, weight_version: str = "0") -> list[Any]:
        return [cpu_server_factory.start(tiny_model_dir, weight_version=weight_version,
                                         redis_url=redis_url, run_id="test", api_key=API_KEY)
                for _ in range(n)]

    return start


@pytest.fixture
async def publisher_factory(aredis, keys, tiny_model_dir) -> AsyncIterator[Callable[..., Any]]:
    from weight_sync import make_publisher

    made: list[Any] = []

    def make(cfg) -> Any:
        p = make_publisher(cfg.weight_sync, aredis, keys, cfg.run.dir, str(tiny_model_dir),
                           api_key=cfg.inference.api_key, redis_cfg=cfg.redis)
        made.append(p)
        return p

    yield make
    for p in made:
        await p.close()
