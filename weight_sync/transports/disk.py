"""The disk transport: a server loads the version's checkpoint from the run directory
(POST /update_weights_from_disk). Every server that joins or restarts is loaded this way."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from broker.registry import PolicyRegistry, ServerInfo
from weight_sync import checkpoints
from weight_sync.protocols import ServerClient, ServerRefused, VersionRefused


@dataclass(frozen=True)
class Checkpoint:
    """A verified checkpoint: its directory and size."""

    path: str
    bytes: int


class DiskTransport:
    """Checkpoints are verified (every file against the sha256 in its manifest) once per
    version, before any server is drained. A checkpoint this learner process has just written
    and hashed is trusted without a second read (`trust`)."""

    name = "disk"
    sets_version = True

    def __init__(self, policy: PolicyRegistry) -> None:
        self.policy = policy
        self.verified: dict[int, Checkpoint] = {}

    def trust(self, manifest: dict[str, Any]) -> None:
        """A checkpoint written and hashed by this process (its manifest as written)."""
        self.verified[int(manifest["version"])] = Checkpoint(str(manifest["path"]),
                                                             int(manifest.get("bytes", 0)))

    def drop(self, version: int) -> None:
        """The checkpoint was deleted (retention)."""
        self.verified.pop(version, None)

    async def newest(self) -> int:
        return await self.policy.current()

    async def prepare(self, version: int) -> Checkpoint:
        if (known := self.verified.get(version)) is not None:
            return known
        manifest = await self.policy.manifest(version)
        try:
            path = await asyncio.to_thread(checkpoints.verify, manifest, version)
        except checkpoints.CheckpointError as e:
            raise VersionRefused(str(e)) from e
        assert manifest is not None  # verify refuses a missing manifest
        ckpt = self.verified[version] = Checkpoint(str(path), int(manifest.get("bytes", 0)))
        return ckpt

    async def load(self, server: ServerInfo, client: ServerClient, version: int,
                   payload: Checkpoint) -> int:
        ans = await client.update_weights_from_disk(model_path=payload.path,
                                                    weight_version=str(version))
        if ans.get("success") is False:
            raise ServerRefused(f"update_weights_from_disk: {ans.get('message')}")
        return payload.bytes

    async def forget(self, server_id: str) -> None:
        """Nothing is kept per server."""

    async def aclose(self) -> None:
        """Nothing to release."""
