"""Shared fixtures: a real redis-server per session (flushed per test) and a real Docker engine.

Component-specific fixtures live in tests/<area>/conftest.py.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator

import ast_guard
import pytest
import redis
import redis.asyncio as aioredis

from broker.keys import Keys
from common.services import RedisProcess, ensure_docker, start_redis
from swarl.config import SwarlConfig, load_config

ast_guard.install()  # before pytest parses (rewrites) the test modules


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The whole-system runs (tests/system, minutes each) first: `make test` runs on parallel
    workers (pytest-xdist, worksteal), and a long test started last would be the suite's tail."""
    items.sort(key=lambda item: item.path.parent.name != "system")  # stable: order kept otherwise


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisProcess]:
    srv = start_redis(tmp_path_factory.mktemp("redis"))
    yield srv
    srv.stop()


@pytest.fixture
def redis_url(redis_server: RedisProcess) -> str:
    """A clean database on the session's redis-server."""
    r = redis.Redis.from_url(redis_server.url)
    r.flushall()
    r.close()
    return redis_server.url


@pytest.fixture
def redis_factory(tmp_path_factory: pytest.TempPathFactory) -> Iterator:
    """Start extra redis-servers (e.g. with AOF, to kill and restart); all stopped at the end."""
    started: list[RedisProcess] = []

    def make(appendonly: bool = False, dir=None, port: int | None = None) -> RedisProcess:
        srv = start_redis(dir or tmp_path_factory.mktemp("redis-x"), port=port, appendonly=appendonly)
        started.append(srv)
        return srv

    yield make
    for srv in started:
        srv.stop()


@pytest.fixture
async def aredis(redis_url: str) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis.from_url(redis_url)
    yield client
    await client.aclose()


@pytest.fixture
def keys() -> Keys:
    return Keys(prefix="swarl", run="test")


@pytest.fixture
def cfg(redis_url: str, tmp_path) -> SwarlConfig:
    """The local config pointed at the test Redis and a temp run dir."""
    return load_config(None, [f"redis.url={redis_url}", "run.id=test", f"run.dir={tmp_path / 'run'}"],
                       environ={})


@pytest.fixture(scope="session")
def docker_url() -> str:
    """A Docker engine that answers: the system's, or a private dockerd started for the tests."""
    url = ensure_docker()
    os.environ["DOCKER_HOST"] = url
    return url


# Component fixtures, each file owned by its component (pytest puts tests/ on sys.path).
from fixtures_envd import *  # noqa: E402,F403
from fixtures_images import *  # noqa: E402,F403
from fixtures_inference import *  # noqa: E402,F403
from fixtures_model import *  # noqa: E402,F403
from fixtures_real_rows import *  # noqa: E402,F403
from fixtures_tasks import *  # noqa: E402,F403
