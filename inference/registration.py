"""A server's entry in the broker's server registry: register at start (ready when its weights
are at least the newest published version, else starting), heartbeat with its version, and
remove the entry at shutdown."""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING

from common.logs import get_logger

if TYPE_CHECKING:
    from inference.cpu_server import CpuServer, ServerSettings

log = get_logger("inference")


def version_int(version: str) -> int | None:
    """swarl's policy versions are ints sent as str(int); anything else has no number."""
    try:
        return int(str(version).strip())
    except ValueError:
        return None


async def registration_loop(srv: CpuServer, settings: ServerSettings) -> None:
    from broker.connection import connect
    from broker.registry import PolicyRegistry, ServerMeta, ServerRegistry

    assert settings.redis_url and settings.keys is not None, "registration needs redis_url and keys"
    redis = connect(settings.redis_url)
    keys = settings.keys
    servers, policy = ServerRegistry(redis, keys), PolicyRegistry(redis, keys)
    registered = False
    try:
        while True:
            version = version_int(srv.engine.weight_version)
            try:
                if not registered:
                    current = await policy.current()
                    state = "ready" if version is not None and version >= current else "starting"
                    await servers.register(settings.id, settings.url, version, state=state,
                                           meta=ServerMeta(kind="swarl-cpu", model=settings.model_dir))
                    registered = True
                    srv.registry = servers
                    log.info("server_registered", server_id=settings.id, url=settings.url,
                             version=version, state=state, policy_current=current)
                else:
                    await servers.heartbeat(settings.id, version=version)
            except Exception as e:  # Redis away: keep serving, try again next beat
                log.warning("registry_heartbeat_failed", server_id=settings.id, error=str(e))
            srv.version_changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(srv.version_changed.wait(), timeout=settings.heartbeat_s)
    finally:
        srv.registry = None
        if registered:
            try:
                await asyncio.wait_for(servers.remove(settings.id), timeout=5)
                log.info("server_deregistered", server_id=settings.id)
            except Exception as e:
                log.warning("server_deregister_failed", server_id=settings.id, error=str(e))
        await redis.aclose()
