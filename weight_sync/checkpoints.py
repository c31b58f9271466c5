"""HF-format checkpoints on disk: write atomically with a sha256 per file, verify before use.

Layout: <run_dir>/weights/v{N:06d}/ holds model.safetensors (or model-0000i-of-0000n shards
plus model.safetensors.index.json), the base model's config/tokenizer/generation files, and
manifest.json (the same manifest that goes to the policy registry; not listed in itself).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

from common.files import fsync_dir

FORMAT = "hf-safetensors"
MANIFEST = "manifest.json"
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")
_WEIGHT_INDEXES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")
_HASH_CHUNK = 8 << 20


class CheckpointError(RuntimeError):
    """A checkpoint is missing, incomplete or corrupt; the message names the version and file."""


def weights_root(run_dir: str | os.PathLike[str]) -> Path:
    return Path(run_dir).resolve() / "weights"


def version_dir(run_dir: str | os.PathLike[str], version: int) -> Path:
    return weights_root(run_dir) / f"v{version:06d}"


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_HASH_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def _shards(tensors: dict[str, torch.Tensor], shard_bytes: int) -> list[dict[str, torch.Tensor]]:
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name, t in tensors.items():
        n = t.numel() * t.element_size()
        if shards[-1] and size + n > shard_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = t
        size += n
    return shards


def _snapshot(named_tensors: Iterable[tuple[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """CPU, contiguous, unshared tensors (safetensors refuses shared storage)."""
    out: dict[str, torch.Tensor] = {}
    for name, t in named_tensors:
        if name in out:
            raise CheckpointError(f"tensor name {name!r} appears twice")
        t = t.detach()
        if t.device.type != "cpu":
            t = t.to("cpu")
        out[name] = t.contiguous()
    seen: dict[int, str] = {}
    for name, t in out.items():  # tied weights arrive as one storage under two names
        ptr = t.untyped_storage().data_ptr()
        if ptr and ptr in seen:
            out[name] = t.clone()
        seen.setdefault(ptr, name)
    return out


def _write_bytes(path: Path, data: bytes) -> str:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    return hashlib.sha256(data).hexdigest()


def write_checkpoint(
    run_dir: str | os.PathLike[str],
    version: int,
    step: int,
    named_tensors: Iterable[tuple[str, torch.Tensor]],
    base_model_dir: str | os.PathLike[str] | None,
    shard_mb: float = 4096.0,
) -> dict[str, Any]:
    """Write version `version` and return its manifest. The directory appears whole or not at
    all (temp dir + rename); a directory already at that version is replaced."""
    from safetensors.torch import save

    t0 = time.monotonic()
    root = weights_root(run_dir)
    root.mkdir(parents=True, exist_ok=True)
    final = version_dir(run_dir, version)
    tmp = root / f".tmp-v{version:06d}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        files: dict[str, str] = {}
        tensors = _snapshot(named_tensors)
        if not tensors:
            raise CheckpointError(f"version {version}: no tensors to write")
        shards = _shards(tensors, int(shard_mb * (1 << 20)))
        weight_map: dict[str, str] = {}
        for i, shard in enumerate(shards):
            name = ("model.safetensors" if len(shards) == 1
                    else f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors")
            # Serialise to memory once: the same bytes are hashed and written (no re-read).
            files[name] = _write_bytes(tmp / name, save(shard, metadata={"format": "pt"}))
            weight_map.update(dict.fromkeys(shard, name))
        if len(shards) > 1:
            total = sum(t.numel() * t.element_size() for t in tensors.values())
            index = {"metadata": {"total_size": total}, "weight_map": weight_map}
            files[_WEIGHT_INDEXES[0]] = _write_bytes(
                tmp / _WEIGHT_INDEXES[0], json.dumps(index, indent=2).encode())
        if base_model_dir:
            for src in sorted(Path(base_model_dir).iterdir()):
                if (not src.is_file() or src.name.endswith(_WEIGHT_SUFFIXES)
                        or src.name in _WEIGHT_INDEXES or src.name == MANIFEST):
                    continue
                shutil.copyfile(src, tmp / src.name)
                files[src.name] = sha256_file(tmp / src.name)
        manifest = {
            "version": version,
            "step": step,
            "time": time.time(),
            "format": FORMAT,
            "path": str(final),
            "files": files,
            "bytes": sum((tmp / n).stat().st_size for n in files),
            "tensors": len(tensors),
            "write_s": round(time.monotonic() - t0, 4),
        }
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2))
        old = None
        if final.exists():
            old = root / f".old-v{version:06d}-{uuid.uuid4().hex[:8]}"
            final.rename(old)
        tmp.rename(final)
        fsync_dir(root)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
        return manifest
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def read_manifest(run_dir: str | os.PathLike[str], version: int) -> dict[str, Any] | None:
    p = version_dir(run_dir, version) / MANIFEST
    if not p.exists():
        return None
    return json.loads(p.read_text())


def verify(manifest: dict[str, Any] | None, version: int | None = None) -> Path:
    """Check every file of a checkpoint against its sha256; return its directory.
    Raises CheckpointError naming the version and the first bad file."""
    if not manifest:
        raise CheckpointError(f"version {version}: no manifest (never published, or deleted)")
    v = manifest.get("version", version)
    if manifest.get("format") != FORMAT:
        raise CheckpointError(f"version {v}: format {manifest.get('format')!r} is not {FORMAT!r}")
    path = Path(manifest.get("path", ""))
    if not path.is_dir():
        raise CheckpointError(f"version {v}: checkpoint directory {path} is missing")
    files = manifest.get("files") or {}
    if not any(n.endswith(".safetensors") for n in files):
        raise CheckpointError(f"version {v}: manifest lists no safetensors file")
    for name, want in files.items():
        f = path / name
        if not f.is_file():
            raise CheckpointError(f"version {v}: file {name} is missing from {path}")
        got = sha256_file(f)
        if got != want:
            raise CheckpointError(
                f"version {v}: file {name} is corrupt (sha256 {got[:12]}…, manifest {want[:12]}…)")
    return path


def on_disk_versions(run_dir: str | os.PathLike[str]) -> list[int]:
    root = weights_root(run_dir)
    if not root.is_dir():
        return []
    out = []
    for p in root.iterdir():
        if p.is_dir() and p.name.startswith("v") and p.name[1:].isdigit():
            out.append(int(p.name[1:]))
    return sorted(out)


def delete_version(run_dir: str | os.PathLike[str], version: int) -> None:
    """Remove a version's directory: renamed aside first so no reader sees half a checkpoint."""
    d = version_dir(run_dir, version)
    if not d.exists():
        return
    trash = d.parent / f".del-v{version:06d}-{uuid.uuid4().hex[:8]}"
    d.rename(trash)
    shutil.rmtree(trash, ignore_errors=True)
