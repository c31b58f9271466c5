"""A learner's rank 0 that dies mid-update, run as a script by test_update_failures.py: it opens
a weight-update session on a server, makes its weight-update group there (recorded in Redis as
the distributed transport records it) and SIGKILLs itself before it sends anything, leaving the
session open and the group behind on the server.

usage: killed_learner.py SERVER_URL API_KEY SERVER_ID REDIS_URL RUN_ID"""

from __future__ import annotations

import asyncio
import os
import signal
import sys


async def main(url: str, api_key: str, server_id: str, redis_url: str, run_id: str) -> None:
    import redis.asyncio as aioredis

    from broker.keys import Keys
    from broker.registry import ServerRegistry
    from inference.client import SGLangClient
    from weight_sync.config import WeightSyncConfig
    from weight_sync.transports.distributed import DistributedTransport
    from weight_sync.update_group import session

    keys = Keys(prefix="swarl", run=run_id)
    redis = aioredis.Redis.from_url(redis_url)
    server = await ServerRegistry(redis, keys).get(server_id)
    assert server is not None and server.meta is not None, server
    transport = DistributedTransport(WeightSyncConfig(backend="gloo", group_timeout_s=30), run_id, redis,
                                     keys.weight_groups)
    client = SGLangClient(url, api_key=api_key, timeout_s=30, retries=0)
    async with session(client, server_id, 30):
        group = await transport._connect(server, client)
        print(f"joined {group.name}", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:6]))
