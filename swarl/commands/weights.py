"""`swarl weights ...`: list published versions, verify a checkpoint."""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer

from swarl.cliutil import ConfigOpt, SetOpt, load
from swarl.config import SwarlConfig

Manifest = dict[str, Any]

app = typer.Typer(help="Policy versions and weight delivery.", no_args_is_help=True)


def _manifests(cfg: SwarlConfig) -> tuple[int | None, dict[int, Manifest]]:
    """(current, manifests) from the policy registry, merged with what is on disk (so the
    commands also work on a run directory without its Redis)."""
    import asyncio

    from broker.connection import connect
    from broker.registry import PolicyRegistry
    from weight_sync import checkpoints

    found: dict[int, Manifest] = {}
    for v in checkpoints.on_disk_versions(cfg.run.dir):
        m = checkpoints.read_manifest(cfg.run.dir, v)
        if m:
            found[v] = {**m, "source": "disk"}
    current = None
    url = cfg.redis.url
    if url:
        async def read(url: str) -> tuple[int, dict[int, Manifest]]:
            r = connect(url, cfg.redis)
            try:
                policy = PolicyRegistry(r, cfg.keys)
                return await policy.current(), await policy.manifests()
            finally:
                await r.aclose()

        registered: dict[int, Manifest] = {}
        try:
            current, registered = asyncio.run(read(url))
        except Exception as e:
            typer.echo(f"swarl: policy registry at {url} not readable ({e}); "
                       "showing the run directory only", err=True)
        for v, m in registered.items():
            found[v] = {**found.get(v, {}), **m, "source": "registry" + ("+disk" if v in found else "")}
    return current, dict(sorted(found.items()))


@app.command("list")
def list_versions(
    config: ConfigOpt = None,
    sets: SetOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per version.")] = False,
) -> None:
    """Published policy versions: step, time, size, path (registry of --config's Redis + run dir)."""
    import time

    cfg = load(config, sets)
    current, found = _manifests(cfg)
    if as_json:
        for m in found.values():
            typer.echo(json.dumps(m, sort_keys=True))
        return
    typer.echo(f"current version: {current if current is not None else '? (no redis.url)'}")
    typer.echo(f"{'version':>8} {'step':>8} {'MB':>9} {'files':>5}  {'published (UTC)':<19}  source  path")
    for v, m in found.items():
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(m.get("time", 0)))
        typer.echo(f"{v:>8} {m.get('step', ''):>8} {m.get('bytes', 0) / 1e6:>9.2f} "
                   f"{len(m.get('files', {})):>5}  {when:<19}  {m.get('source', '')}  {m.get('path', '')}")


@app.command("verify")
def verify_version(
    version: Annotated[int, typer.Argument(help="Policy version to check.")],
    config: ConfigOpt = None,
    sets: SetOpt = None,
) -> None:
    """Check every file of VERSION against the sha256 in its manifest (exit 1 if bad)."""
    from weight_sync import checkpoints

    cfg = load(config, sets)
    _, found = _manifests(cfg)
    try:
        path = checkpoints.verify(found.get(version), version)
    except checkpoints.CheckpointError as e:
        typer.echo(f"swarl: {e}", err=True)
        raise typer.Exit(1) from None
    m = found[version]
    typer.echo(f"version {version}: ok ({len(m['files'])} files, {m.get('bytes', 0) / 1e6:.2f} MB) at {path}")
