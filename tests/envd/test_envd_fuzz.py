"""Bad input against envd and the pool: their OpenAPI schemas fuzzed (schemathesis), valid and
invalid requests alike: no 5xx, every 4xx carries an error, every 422 names the field."""

from __future__ import annotations

import pytest
from fuzz_http import fuzz_openapi

pytestmark = [pytest.mark.docker, pytest.mark.fuzz]


@pytest.mark.timeout(900)
def test_envd_api_fuzzed(envd_server) -> None:
    problems = fuzz_openapi(envd_server.url, envd_server.token)
    assert not problems, "\n".join(problems[:20])


@pytest.mark.timeout(900)
def test_pool_api_fuzzed(pool_server) -> None:
    problems = fuzz_openapi(pool_server.url, pool_server.token)
    assert not problems, "\n".join(problems[:20])
