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


# safetensors' dtype names (its format: u64 little-endian header length, a JSON header naming each
# tensor's dtype, shape and byte range, then the tensors' bytes back to back)
_ST_DTYPES = {torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
              torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8",
              torch.uint8: "U8", torch.bool: "BOOL", torch.float8_e4m3fn: "F8_E4M3",
              torch.float8_e5m2: "F8_E5M2"}


def write_safetensors(path: Path, tensors: list[tuple[str, torch.Tensor]],
                      metadata: dict[str, str] | None = None) -> str:
    """Write CPU tensors as one safetensors file straight from their memory (no serialised copy
    of the file, unlike safetensors.torch.save, which holds two) and fsync it; its sha256."""
    header: dict[str, Any] = {"__metadata__": metadata} if metadata else {}
    start = 0
    for name, t in tensors:
        if t.dtype not in _ST_DTYPES:
            raise CheckpointError(f"tensor {name!r}: dtype {t.dtype} has no safetensors name")
        n = t.numel() * t.element_size()
        header[name] = {"dtype": _ST_DTYPES[t.dtype], "shape": list(t.shape), "data_offsets": [start, start + n]}
        start += n
    head = json.dumps(header, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)  # the data starts 8-byte aligned, as safetensors writes it
    h = hashlib.sha256()
    with open(path, "wb") as f:
        for chunk in (len(head).to_bytes(8, "little"), head):
            f.write(chunk)
            h.update(chunk)
        for _, t in tensors:
            raw = t.contiguous().reshape(-1).view(torch.uint8).numpy().data  # no copy
            f.write(raw)
            h.update(raw)
        f.flush()
        os.fsync(f.fileno())
    return h.hexdigest()


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
    all (temp dir + rename); a directory already at that version is replaced. The tensors are
    written as they arrive, a shard of at most `shard_mb` at a time (a larger tensor gets a
    shard alone): the shard being filled is all this holds of the model. `named_tensors` is
    consumed once; if it has a close() (a generator) it is closed whatever happens, in this
    thread (the learner's stream drains its collective there)."""
    t0 = time.monotonic()
    root = weights_root(run_dir)
    root.mkdir(parents=True, exist_ok=True)
    final = version_dir(run_dir, version)
    tmp = root / f".tmp-v{version:06d}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        shard_bytes = int(shard_mb * (1 << 20))
        parts: list[tuple[str, list[str]]] = []  # the hash and tensor names of each shard written
        shard: list[tuple[str, torch.Tensor]] = []
        seen: set[str] = set()
        size = total = 0

        def flush() -> None:
            # final names need the number of shards, known only at the end: renamed then
            sha = write_safetensors(tmp / f"part-{len(parts)}.tmp", shard, {"format": "pt"})
            parts.append((sha, [n for n, _ in shard]))
            shard.clear()

        it = iter(named_tensors)
        try:
            for name, t in it:
                if name in seen:
                    raise CheckpointError(f"tensor name {name!r} appears twice")
                seen.add(name)
                t = t.detach()
                if t.device.type != "cpu":
                    t = t.to("cpu")
                n = t.numel() * t.element_size()
                if shard and size + n > shard_bytes:
                    flush()
                    size = 0
                shard.append((name, t))
                size, total = size + n, total + n
                if size >= shard_bytes:  # full: written now, not held while the next is made
                    flush()
                    size = 0
            if shard:
                flush()
        finally:
            close = getattr(it, "close", None)
            if close is not None:
                close()
        if not parts:
            raise CheckpointError(f"version {version}: no tensors to write")
        files: dict[str, str] = {}
        weight_map: dict[str, str] = {}
        for i, (sha, names) in enumerate(parts):
            name = ("model.safetensors" if len(parts) == 1
                    else f"model-{i + 1:05d}-of-{len(parts):05d}.safetensors")
            (tmp / f"part-{i}.tmp").rename(tmp / name)
            files[name] = sha
            weight_map.update(dict.fromkeys(names, name))
        if len(parts) > 1:
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
            "tensors": len(seen),
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
