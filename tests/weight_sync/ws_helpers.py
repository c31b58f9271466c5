"""Helpers for weight_sync tests: learner-side tensors, checksums, polling."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import torch

API_KEY = "ws-test-key"


def learner_tensors(model_dir: Path, seed: int) -> list[tuple[str, torch.Tensor]]:
    """The base model's tensors (HF names) moved by a seed-dependent step: a stand-in for
    what the learner's named_tensors() yields after training."""
    from safetensors.torch import load_file

    files = sorted(Path(model_dir).glob("*.safetensors"))
    base: dict[str, torch.Tensor] = {}
    for f in files:
        base.update(load_file(f))
    g = torch.Generator().manual_seed(1000 + seed)
    return [(n, (t.float() + 0.01 * torch.randn(t.shape, generator=g)).to(t.dtype))
            for n, t in sorted(base.items())]


def expected_checksum(tensors: list[tuple[str, torch.Tensor]]) -> str:
    from inference.weights import checksum

    return checksum(dict(tensors))


async def server_checksum(url: str) -> str:
    async with httpx.AsyncClient(timeout=60) as c:
        r = await c.get(f"{url}/swarl/weights_checksum",
                        headers={"Authorization": f"Bearer {API_KEY}"})
        r.raise_for_status()
        body = r.json()
        return body["sha256"]


async def all_at(servers: Any, n: int, version: int) -> bool:
    """Exactly n live servers, every one ready at `version` (servers: a ServerRegistry)."""
    infos = await servers.list(alive_only=True)
    return len(infos) == n and all(s.state == "ready" and s.version == version for s in infos)


