"""No version published yet: a server keeps the base weights it started with."""

from __future__ import annotations

from broker.registry import ServerInfo
from weight_sync.protocols import ServerClient


class BaseWeights:
    """Moves nothing: a server that registered "starting" before any version was published is
    checked to answer and then marked ready at version 0. Its weight_version is whatever it
    started with (SGLang's is "default"), so it is not compared."""

    name = "base"
    sets_version = False

    async def newest(self) -> None:
        return None

    async def prepare(self, version: int) -> None:
        return None

    async def load(self, server: ServerInfo, client: ServerClient, version: int, payload: None) -> int:
        return 0

    async def forget(self, server_id: str) -> None:
        """Nothing is kept per server."""

    async def aclose(self) -> None:
        """Nothing to release."""
