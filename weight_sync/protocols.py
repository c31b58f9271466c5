"""The seams of weight_sync: the learner's publisher, the servers it updates, the transports.

The learner depends on `WeightPublisher` only. The coordinator (the rolling update) decides which
server gets which version and when; a `Transport` only moves one version into one drained
server, through a `ServerClient` (the SGLang weight-update API).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Protocol, TypeVar

import torch

from broker.registry import ServerInfo

NamedTensors = Callable[[], Iterable[tuple[str, torch.Tensor]]]
"""Yields (HF parameter name, tensor) pairs; called once per delivery (may be called again)."""


class WeightPublisher(Protocol):
    async def publish(self, version: int, step: int, named_tensors: NamedTensors) -> dict[str, Any]:
        """Make `version` the newest policy: persist/deliver it, record its manifest in the
        policy registry, and roll it out to the inference servers. Returns the manifest."""
        ...

    async def close(self, finish_rollout: bool = False) -> None:
        """Release everything; finish_rollout (a clean stop): first let the last version reach
        the servers, within a bound."""
        ...


class ServerClient(Protocol):
    """The calls weight_sync makes to one inference server (SGLang 0.5.23's weight-update API;
    the update calls answer {"success": bool, "message": str})."""

    url: str

    async def update_weights_from_disk(self, model_path: str, weight_version: str | None = None,
                                       abort_all_requests: bool = False) -> dict[str, Any]: ...

    async def init_weights_update_group(self, master_address: str, master_port: int, rank_offset: int,
                                        world_size: int, group_name: str = ...,
                                        backend: str = ...) -> dict[str, Any]: ...

    async def update_weights_from_distributed(self, names: list[str], dtypes: list[str],
                                              shapes: list[list[int]], group_name: str = ...,
                                              flush_cache: bool = True,
                                              weight_version: str | None = None) -> dict[str, Any]: ...

    async def destroy_weights_update_group(self, group_name: str = ...) -> dict[str, Any]: ...

    async def begin_weight_update(self, selector: str = ...) -> dict[str, Any]: ...

    async def end_weight_update(self) -> dict[str, Any]: ...

    async def pause_generation(self, mode: str = ...) -> dict[str, Any]: ...

    async def continue_generation(self) -> dict[str, Any]: ...

    async def get_weight_version(self) -> str:
        """The weight_version the server reports (SGLang: GET /model_info)."""
        ...

    async def aclose(self) -> None: ...


ClientFactory = Callable[[str], ServerClient]
"""Makes the client for a server's URL."""


class VersionRefused(Exception):
    """A transport cannot deliver this version (a corrupt or missing checkpoint, a version no
    longer held in memory); the message says why. No server has been touched."""


class ServerRefused(RuntimeError):
    """The server answered success=false and kept its old weights (it may serve them again)."""


P = TypeVar("P")


class Transport(Protocol[P]):
    """One way of moving a version's weights into a server.

    `prepare` runs before any server is drained, so a version that cannot be delivered touches
    no server; what it returns is what `load` needs (a checkpoint path, tensors held in memory).
    `load` moves the version into one drained server. `forget` drops whatever the transport keeps
    per server (a process group) when the server leaves, restarts or fails."""

    name: str
    sets_version: bool
    """True: after `load` the server reports the loaded version as its weight_version."""

    async def newest(self) -> int | None:
        """The newest version this transport could deliver now (None: no such notion)."""
        ...

    async def prepare(self, version: int) -> P:
        """Check that `version` can be delivered (raise VersionRefused if not)."""
        ...

    async def load(self, server: ServerInfo, client: ServerClient, version: int, payload: P) -> int:
        """Load `version` into one drained server; returns the bytes moved. Raises
        ServerRefused when the server kept its old weights, anything else on failure."""
        ...

    async def forget(self, server_id: str) -> None: ...

    async def aclose(self) -> None: ...
