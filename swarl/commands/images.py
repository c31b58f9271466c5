"""`swarl images ...`: SWE image naming, local building of the bundled tasks, pushing them to a
registry, and prefetching a run's images onto the envd nodes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from swarl.cliutil import ConfigOpt, SetOpt

images_app = typer.Typer(help="SWE images: naming, local building of the bundled tasks, registry push, node prefetch.",
                         no_args_is_help=True)


@images_app.command("build-tasks")
def build_tasks(
    only: Annotated[list[str] | None, typer.Option("--only", help="Build only this instance_id (repeatable).")] = None,
    split: Annotated[str, typer.Option("--split", help="all | train | heldout (| heldout_family: generated).")] = "all",
    suite: Annotated[str, typer.Option("--suite", help="bundled (hand-written) | generated (the demo's).")] = "bundled",
    force: Annotated[bool, typer.Option("--force", help="Rebuild even when the cached image's content hash matches.")] = False,
    rebuild_base: Annotated[bool, typer.Option("--rebuild-base", help="Re-run debootstrap for swarl/base:bookworm.")] = False,
    config: ConfigOpt = None,
    sets: SetOpt = None,
) -> None:
    """Build the bundled tasks' images from Debian packages (no registry): the base image once
    (debootstrap), then one image per task with its repository committed at /testbed."""
    import docker

    from common.services import ensure_docker
    from envd.images import build_task_images, ensure_base_image
    from swarl.cliutil import load

    load(config, sets)
    tasks = _bundled_tasks(split, only, suite)
    client = docker.DockerClient(base_url=ensure_docker(), timeout=600)
    try:
        ensure_base_image(client, force=rebuild_base)
        images = build_task_images(client, tasks, progress=True, force=force)
    finally:
        client.close()
    for image in images:
        typer.echo(image)


@images_app.command("name")
def name(
    instance_json: Annotated[str, typer.Argument(help="A SWE row as JSON, a path to a .json file, or - for stdin.")],
    data_source: Annotated[str | None, typer.Option("--data-source", help="Dataset family (swe-gym, ...) or dataset id (e.g. SWE-Gym/SWE-Gym) whose naming scheme to use; default: the row's dataset_family, else its shape.")] = None,
) -> None:
    """Print the Docker image a SWE row runs in (its dataset family's naming, swe/adapters)."""
    import sys

    from swe.harness import image_for
    from swe.rows import source_row

    text = sys.stdin.read() if instance_json == "-" else instance_json
    if instance_json != "-" and not instance_json.lstrip().startswith("{") and Path(instance_json).is_file():
        text = Path(instance_json).read_text()
    try:
        src = source_row("INSTANCE_JSON", json.loads(text))  # a raw row or a prepared record
        if not isinstance(src.row, dict):
            raise ValueError("instance: must be a JSON object")
        typer.echo(image_for(src.row, data_source=data_source or src.data_source))
    except ValueError as e:  # json.JSONDecodeError and RowError are ValueErrors
        typer.echo(f"swarl: {e}", err=True)
        raise typer.Exit(2) from None


@images_app.command("list-tasks")
def list_tasks(
    split: Annotated[str, typer.Option("--split", help="all | train | heldout (| heldout_family: generated).")] = "all",
    suite: Annotated[str, typer.Option("--suite", help="bundled (hand-written) | generated (the demo's).")] = "bundled",
) -> None:
    """List the bundled tasks: instance_id, split, bug family, image."""
    from swe.tasks import load_tasks

    for t in load_tasks(split):
        typer.echo(f"{t['instance_id']}\t{t['swarl_split']}\t{t['swarl_family']}\t{t['image_name']}")


NodesOpt = Annotated[str | None, typer.Option(
    "--nodes", help="envd URLs, comma-separated (default: pool.exec_urls, else the pool's nodes in Redis).")]
TokenFileOpt = Annotated[str | None, typer.Option("--token-file", help="Read the envd token from this file.")]


@images_app.command("prefetch")
def prefetch(
    data: Annotated[str, typer.Option("--data", help="Prepared JSONL (or raw SWE rows) the run will use.")],
    nodes: NodesOpt = None,
    copies: Annotated[int | None, typer.Option(
        "--copies", min=1, help="Nodes each image goes to (default: enough for --n-samples leases at "
                                "pool.max_per_node each, else 1).")] = None,
    n_samples: Annotated[int | None, typer.Option(
        "--n-samples", min=1, help="Samples per prompt of the run (leases of one image at once).")] = None,
    per_node: Annotated[int, typer.Option("--per-node", min=1, help="Pull requests in flight per node.")] = 2,
    data_source: Annotated[str | None, typer.Option("--data-source", help="Dataset id for image naming.")] = None,
    token_file: TokenFileOpt = None,
    config: ConfigOpt = None,
    sets: SetOpt = None,
) -> None:
    """Warm envd nodes ahead of a run: pull each image of the data onto as many nodes as the run
    needs (nodes already holding it count first, then the nodes with the fewest), with a progress
    bar and a summary. Exit 1 when a pull failed."""
    import asyncio
    import math

    from swarl.cliutil import load
    from swarl.commands.envd import _token
    from swarl.prefetch import run_prefetch
    from swe.rows import RowError, read_rows

    cfg = load(config, sets)
    errors: list[RowError] = []
    try:
        images = list(dict.fromkeys(r.instance["image_name"]
                                    for r in read_rows(data, data_source, errors=errors)))
    except OSError as e:
        typer.echo(f"swarl: --data: {e}", err=True)
        raise typer.Exit(2) from None
    for bad in errors:
        typer.echo(f"swarl: skipped {bad}", err=True)
    if not images:
        typer.echo(f"swarl: --data {data}: no valid row", err=True)
        raise typer.Exit(2)
    urls = [u.strip().rstrip("/") for u in nodes.split(",") if u.strip()] if nodes else None
    if copies is None:
        copies = math.ceil(n_samples / cfg.pool.max_per_node) if n_samples else 1
    token = _token(cfg.envd.token, token_file, False)
    try:
        summary = asyncio.run(run_prefetch(cfg, images, urls, copies, per_node, token))
    except ValueError as e:
        typer.echo(f"swarl: {e}", err=True)
        raise typer.Exit(2) from None
    raise typer.Exit(1 if summary["failed"] else 0)


@images_app.command("push")
def push(
    registry: Annotated[str | None, typer.Option(
        "--registry", help="host[:port][/namespace] to push to (default: envd.registry).")] = None,
    only: Annotated[list[str] | None, typer.Option("--only", help="Push only this instance_id (repeatable).")] = None,
    split: Annotated[str, typer.Option("--split", help="all | train | heldout (| heldout_family: generated).")] = "all",
    suite: Annotated[str, typer.Option("--suite", help="bundled (hand-written) | generated (the demo's).")] = "bundled",
    config: ConfigOpt = None,
    sets: SetOpt = None,
) -> None:
    """Put the bundled task images into a registry (built first when missing), under the names
    envd pulls them by (`<registry>/swarl/task.<name>-<n>:latest`), so the local suite runs the
    way SWE-Gym does: `--set envd.registry=<registry>` on the envd nodes."""
    import docker

    from common.services import ensure_docker
    from swarl.cliutil import load
    from swarl.prefetch import push_images

    cfg = load(config, sets)
    registry = registry or cfg.envd.registry
    if not registry:
        typer.echo("swarl: give --registry (or envd.registry)", err=True)
        raise typer.Exit(2)
    tasks = _bundled_tasks(split, only, suite)
    client = docker.DockerClient(base_url=ensure_docker(), timeout=600)
    try:
        failed = push_images(client, tasks, registry, cfg.envd.registry_username, cfg.envd.registry_password)
    finally:
        client.close()
    raise typer.Exit(1 if failed else 0)


def _bundled_tasks(split: str, only: list[str] | None, suite: str = "bundled") -> list[dict[str, Any]]:
    """The split's bundled tasks, or those named by --only (exit 2 naming any that is not there)."""
    from swe.tasks import load_tasks

    try:
        tasks = load_tasks(split, suite=suite)
    except ValueError as e:
        typer.echo(f"swarl: {e}", err=True)
        raise typer.Exit(2) from None
    if only:
        unknown = sorted(set(only) - {t["instance_id"] for t in tasks})
        if unknown:
            typer.echo(f"swarl: --only: no bundled task {', '.join(unknown)} in split {split!r}", err=True)
            raise typer.Exit(2)
        tasks = [t for t in tasks if t["instance_id"] in only]
    return tasks
