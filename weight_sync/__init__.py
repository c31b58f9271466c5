"""swarl weight_sync: publish policy versions and roll them out to inference servers.

The learner's process makes a publisher with `make_publisher(...)`; its rolling-update
coordinator runs on its own thread in that process. Imports are lazy so `import weight_sync`
stays light (no torch at import time).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import redis.asyncio as aioredis

    from broker.config import RedisConfig
    from broker.keys import Keys
    from weight_sync.config import WeightSyncConfig
    from weight_sync.protocols import ClientFactory
    from weight_sync.publisher import Publisher

__all__ = ["make_publisher"]


def make_publisher(ws: WeightSyncConfig, redis: aioredis.Redis, keys: Keys,
                   run_dir: str | os.PathLike[str], base_model_dir: str | None,
                   api_key: str | None = None, redis_cfg: RedisConfig | None = None,
                   start_coordinator: bool = True,
                   client_factory: ClientFactory | None = None, eval_every: int = 0) -> Publisher:
    """See weight_sync.publisher.make_publisher."""
    from weight_sync.publisher import make_publisher as make

    return make(ws, redis, keys, run_dir, base_model_dir, api_key=api_key, redis_cfg=redis_cfg,
                start_coordinator=start_coordinator, client_factory=client_factory, eval_every=eval_every)
