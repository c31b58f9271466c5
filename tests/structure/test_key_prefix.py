"""One owner per Redis key: envd, the pool and a CPU inference server run with a non-default
`redis.prefix`, do their work (a lease, a command in its container, a registration with
heartbeats), and no key of theirs lands outside `<prefix>:{<run>}:`."""

from __future__ import annotations

import asyncio

import httpx
import pytest
import redis as redis_sync

from broker.connection import connect
from broker.keys import Keys
from broker.registry import ServerRegistry

pytestmark = [pytest.mark.docker]
PREFIX = "zz-swarl"


async def test_every_key_lives_under_the_configured_prefix(redis_url, envd_factory, pool_factory,
                                                           cpu_server_factory, tiny_model_dir,
                                                           test_image) -> None:
    keys = Keys(PREFIX, "test")
    sets = [f"redis.prefix={PREFIX}"]
    envd = envd_factory(sets=sets, redis_url=redis_url)
    pool = pool_factory([envd.url], redis_url, sets=sets)
    server = cpu_server_factory.start(tiny_model_dir, redis_url=redis_url, run_id="test",
                                      prefix=PREFIX)
    headers = {"Authorization": f"Bearer {pool.token}"}
    async with httpx.AsyncClient(base_url=pool.url, headers=headers, timeout=120) as http:
        lease = (await http.post("/allocate", json={"image": test_image, "instance_id": "p-1"})).json()
        assert lease.get("ok"), lease
        ran = (await http.post("/exec", json={"lease_id": lease["lease_id"], "command": "echo hi"})).json()
        assert ran["output"].strip() == "hi"
        r = connect(redis_url)
        try:
            for _ in range(200):  # the server registers (and heartbeats) under the prefix
                if any(s.id == server.server_id for s in await ServerRegistry(r, keys).list()):
                    break
                await asyncio.sleep(0.1)
            else:
                raise AssertionError(f"server never registered under {keys.base}:\n{server.log()[-3000:]}")
        finally:
            await r.aclose()
        sync = redis_sync.Redis.from_url(redis_url)
        live = sorted(k.decode() for k in sync.scan_iter(count=1000))
        assert (await http.post("/close", json={"lease_id": lease["lease_id"]})).json()["ok"]
    assert any(k.startswith(f"{keys.base}:pool:") for k in live), live
    assert any(k.startswith(f"{keys.base}:envd:") for k in live), live
    assert any(k.startswith(f"{keys.base}:server") for k in live), live
    outside = [k for k in live if not k.startswith(f"{keys.base}:")]
    assert outside == [], f"keys outside {keys.base}: {outside}"
