"""`swarl images ...`: SWE image naming and local building of the bundled tasks."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from swarl.cliutil import ConfigOpt, SetOpt

images_app = typer.Typer(help="SWE images: naming and local building of the bundled tasks.", no_args_is_help=True)


@images_app.command("build-tasks")
def build_tasks(
    only: Annotated[list[str] | None, typer.Option("--only", help="Build only this instance_id (repeatable).")] = None,
    split: Annotated[str, typer.Option("--split", help="all | train | heldout.")] = "all",
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
    from envd.tasks import load_tasks
    from swarl.cliutil import load

    load(config, sets)
    try:
        tasks = load_tasks(split)
    except ValueError as e:
        typer.echo(f"swarl: {e}", err=True)
        raise typer.Exit(2) from None
    if only:
        known = {t["instance_id"] for t in tasks}
        unknown = [i for i in only if i not in known]
        if unknown:
            typer.echo(f"swarl: --only: no bundled task {', '.join(unknown)} in split {split!r}", err=True)
            raise typer.Exit(2)
        tasks = [t for t in tasks if t["instance_id"] in only]
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
    data_source: Annotated[str | None, typer.Option("--data-source", help="Dataset id (e.g. SWE-Gym/SWE-Gym) to pick the naming scheme.")] = None,
) -> None:
    """Print the Docker image a SWE-bench / SWE-Gym / bundled row runs in."""
    import sys

    from envd.images import image_for
    from envd.rows import source_row

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
    split: Annotated[str, typer.Option("--split", help="all | train | heldout.")] = "all",
) -> None:
    """List the bundled tasks: instance_id, split, bug family, image."""
    from envd.tasks import load_tasks

    for t in load_tasks(split):
        typer.echo(f"{t['instance_id']}\t{t['swarl_split']}\t{t['swarl_family']}\t{t['image_name']}")
