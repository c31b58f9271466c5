"""Checkpoints on disk: atomic write, sha256 manifest, verification, the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from weight_sync import checkpoints


def _tensors(seed: int = 0) -> list[tuple[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    emb = torch.randn(64, 16, generator=g)
    return [("model.embed_tokens.weight", emb),
            ("model.layers.0.mlp.up_proj.weight", torch.randn(32, 16, generator=g).to(torch.bfloat16)),
            ("model.norm.weight", torch.ones(16)),
            ("lm_head.weight", emb)]  # tied: same storage under two names


@pytest.fixture
def base_dir(tmp_path: Path) -> Path:
    d = tmp_path / "base"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"model_type": "qwen3"}))
    (d / "tokenizer.json").write_text("{}")
    (d / "generation_config.json").write_text("{}")
    (d / "model.safetensors").write_bytes(b"old weights, not copied")
    return d


def test_write_verify_and_layout(tmp_path: Path, base_dir: Path) -> None:
    from safetensors.torch import load_file

    run = tmp_path / "run"
    m = checkpoints.write_checkpoint(run, 3, 30, _tensors(), base_dir)
    d = checkpoints.version_dir(run, 3)
    assert d.name == "v000003" and m["path"] == str(d)
    assert m["format"] == "hf-safetensors" and m["version"] == 3 and m["step"] == 30
    assert set(m["files"]) == {"model.safetensors", "config.json", "tokenizer.json", "generation_config.json"}
    assert m["bytes"] == sum((d / f).stat().st_size for f in m["files"])
    assert checkpoints.verify(m) == d
    assert json.loads((d / "manifest.json").read_text()) == m
    loaded = load_file(d / "model.safetensors")
    for name, t in _tensors():
        assert torch.equal(loaded[name], t), name
    assert [p.name for p in checkpoints.weights_root(run).iterdir()] == ["v000003"]  # no temp dirs left


def test_sharded_checkpoint_has_index(tmp_path: Path) -> None:
    m = checkpoints.write_checkpoint(tmp_path, 1, 1, _tensors(), None, shard_mb=0.003)
    shards = [f for f in m["files"] if f.endswith(".safetensors")]
    assert len(shards) > 1 and "model.safetensors.index.json" in m["files"]
    index = json.loads((Path(m["path"]) / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"]) == {n for n, _ in _tensors()}
    checkpoints.verify(m)


def test_corrupt_and_missing_are_refused_with_the_reason(tmp_path: Path, base_dir: Path) -> None:
    m = checkpoints.write_checkpoint(tmp_path, 2, 2, _tensors(), base_dir)
    f = Path(m["path"]) / "model.safetensors"
    data = bytearray(f.read_bytes())
    data[-1] ^= 0xFF
    f.write_bytes(bytes(data))
    with pytest.raises(checkpoints.CheckpointError, match=r"version 2: file model.safetensors is corrupt"):
        checkpoints.verify(m)
    m3 = checkpoints.write_checkpoint(tmp_path, 3, 3, _tensors(), base_dir)
    (Path(m3["path"]) / "config.json").unlink()
    with pytest.raises(checkpoints.CheckpointError, match=r"version 3: file config\.json is missing"):
        checkpoints.verify(m3)
    with pytest.raises(checkpoints.CheckpointError, match="no manifest"):
        checkpoints.verify(None, 9)
    with pytest.raises(checkpoints.CheckpointError, match=r"directory .* is missing"):
        checkpoints.verify({**m, "path": str(tmp_path / "nope")})


def test_failed_write_leaves_nothing_and_rewrite_replaces(tmp_path: Path) -> None:
    def boom():
        yield "a", torch.ones(2)
        raise RuntimeError("learner died mid-iteration")

    with pytest.raises(RuntimeError):
        checkpoints.write_checkpoint(tmp_path, 1, 1, boom(), None)
    assert not checkpoints.weights_root(tmp_path).exists() or not any(checkpoints.weights_root(tmp_path).iterdir())
    checkpoints.write_checkpoint(tmp_path, 1, 1, [("a", torch.ones(2))], None)
    m2 = checkpoints.write_checkpoint(tmp_path, 1, 5, [("a", torch.zeros(2))], None)
    assert checkpoints.read_manifest(tmp_path, 1)["step"] == 5
    checkpoints.verify(m2)
    assert checkpoints.on_disk_versions(tmp_path) == [1]
    checkpoints.delete_version(tmp_path, 1)
    assert checkpoints.on_disk_versions(tmp_path) == []


def _swarl(*args: str, run_dir: Path):
    """`swarl weights ...` in-process (the same typer app `swarl weights` mounts)."""
    from typer.testing import CliRunner

    from swarl.commands.weights import app

    return CliRunner().invoke(app, [*args, "--set", f"run.dir={run_dir}", "--set", "redis.url=null"])


def test_cli_list_and_verify_from_the_run_dir(tmp_path: Path, base_dir: Path) -> None:
    checkpoints.write_checkpoint(tmp_path, 1, 10, _tensors(), base_dir)
    m = checkpoints.write_checkpoint(tmp_path, 2, 20, _tensors(1), base_dir)
    out = _swarl("list", run_dir=tmp_path)
    assert out.exit_code == 0, out.output
    assert "v000001" in out.stdout and "v000002" in out.stdout
    ok = _swarl("verify", "2", run_dir=tmp_path)
    assert ok.exit_code == 0 and "version 2: ok" in ok.stdout, ok.output
    (Path(m["path"]) / "tokenizer.json").write_text("tampered")
    bad = _swarl("verify", "2", run_dir=tmp_path)
    assert bad.exit_code == 1 and "tokenizer.json is corrupt" in bad.stderr
    missing = _swarl("verify", "7", run_dir=tmp_path)
    assert missing.exit_code == 1 and "version 7: no manifest" in missing.stderr


def test_cli_reads_the_policy_registry(tmp_path: Path, base_dir: Path, redis_url: str) -> None:
    import asyncio

    from typer.testing import CliRunner

    from broker.connection import connect
    from broker.keys import Keys
    from broker.registry import PolicyRegistry
    from swarl.commands.weights import app

    m = checkpoints.write_checkpoint(tmp_path, 4, 40, _tensors(), base_dir)

    async def publish() -> None:
        r = connect(redis_url)
        await PolicyRegistry(r, Keys("swarl", "cli")).publish(4, m)
        await r.aclose()

    asyncio.run(publish())  # the CLI runs its own event loop: this test has none
    args = ["--set", f"run.dir={tmp_path}", "--set", f"redis.url={redis_url}", "--set", "run.id=cli"]
    out = CliRunner().invoke(app, ["list", *args])
    assert out.exit_code == 0, out.output
    assert "current version: 4" in out.stdout and "registry+disk" in out.stdout
    checkpoints.delete_version(tmp_path, 4)  # registry still lists it; verify says the files are gone
    bad = CliRunner().invoke(app, ["verify", "4", *args])
    assert bad.exit_code == 1 and "checkpoint directory" in bad.stderr and "is missing" in bad.stderr
