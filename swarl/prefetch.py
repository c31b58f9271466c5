"""Task images ahead of a run: `swarl images prefetch` (warm the envd nodes) and `swarl images
push` (put the bundled task images into a registry). The roof: it knows the config, envd's
client and the pool's Redis state."""

from __future__ import annotations

import asyncio
import json
import time
from collections import defaultdict
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from envd.client import EnvdClient, EnvError, EnvRequestError
from envd.image_cache import split_name
from swarl.config import SwarlConfig

if TYPE_CHECKING:
    import docker


def plan(images: list[str], holders: dict[str, set[str]], copies: int) -> list[tuple[str, str]]:
    """The (image, node) pulls that put each image on `copies` nodes (at most every node):
    nodes already holding it count first; the others go to the nodes given the fewest images
    so far (ties: the order of `holders`)."""
    nodes = list(holders)
    want = min(copies, len(nodes))
    load = {n: len(holders[n] & set(images)) for n in nodes}
    out: list[tuple[str, str]] = []
    for image in images:
        have = [n for n in nodes if image in holders[n]]
        free = sorted((n for n in nodes if n not in have), key=lambda n: (load[n], nodes.index(n)))
        for n in free[:max(0, want - len(have))]:
            out.append((image, n))
            load[n] += 1
    return out


async def _node_urls(cfg: SwarlConfig, urls: list[str] | None) -> list[str]:
    if urls:
        return urls
    if cfg.pool.exec_urls:
        return [u.rstrip("/") for u in cfg.pool.exec_urls]
    if cfg.redis.url:
        from envd.pool_state import PoolState

        state = await PoolState.open(cfg.pool, cfg.redis, cfg.keys)
        try:
            return [u for u, info in (await state.nodes()).items() if info.get("state") == "active"]
        finally:
            await state.close()
    raise ValueError("no envd nodes: give --nodes URL,URL (or pool.exec_urls, or redis.url of a run's pool)")


async def run_prefetch(cfg: SwarlConfig, images: list[str], urls: list[str] | None, copies: int,
                       per_node: int, token: str | None, console: Console | None = None) -> dict[str, Any]:
    """Pull `images` onto the nodes; print progress, a table and one JSON line; the summary."""
    console = console or Console()
    nodes = await _node_urls(cfg, urls)
    if not nodes:
        raise ValueError("no active envd node to prefetch onto")
    clients = {u: EnvdClient.node(u, token, timeout_s=30) for u in nodes}
    t0 = time.monotonic()
    stats: dict[str, dict[str, float]] = defaultdict(lambda: {"pulled": 0, "present": 0, "failed": 0, "bytes": 0})
    failures: list[dict[str, str]] = []
    try:
        holders: dict[str, set[str]] = {}
        for url, client in clients.items():
            try:
                holders[url] = set((await client.images()).get("images", []))
            except (EnvError, EnvRequestError) as e:
                console.print(f"[yellow]skipping node {url}: {e}[/]")
        if not holders:
            raise ValueError(f"no envd node answers: {', '.join(nodes)}")
        todo = plan(images, holders, copies)
        present = sum(min(copies, len(holders)) for _ in images) - len(todo)
        slots = {u: asyncio.Semaphore(per_node) for u in holders}
        http_timeout = cfg.envd.pull_timeout_s + 60
        with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                      TimeElapsedColumn(), console=console, transient=False) as prog:
            bar = prog.add_task(f"prefetch {len(images)} images onto {len(holders)} nodes", total=len(todo))

            async def one(image: str, url: str) -> None:
                async with slots[url]:
                    try:
                        got = await clients[url].pull(image, http_timeout_s=http_timeout)
                    except (EnvError, EnvRequestError) as e:
                        stats[url]["failed"] += 1
                        failures.append({"image": image, "node": url, "error": str(e)})
                        prog.update(bar, advance=1, description=f"[red]failed[/] {image} on {url}")
                        return
                key = "pulled" if got.get("pulled") else "present"
                stats[url][key] += 1
                stats[url]["bytes"] += int(got.get("bytes") or 0)
                prog.update(bar, advance=1, description=f"{key} {image} on {url} ({got.get('pull_s', 0)} s)")

            await asyncio.gather(*(one(image, url) for image, url in todo))
    finally:
        for client in clients.values():
            await client.aclose()
    table = Table(title="prefetch")
    for col in ("node", "pulled", "already there", "failed", "MB pulled"):
        table.add_column(col)
    for url in holders:
        s = stats[url]
        table.add_row(url, str(int(s["pulled"])), str(int(s["present"])), str(int(s["failed"])),
                      f"{s['bytes'] / 1e6:.1f}")
    console.print(table)
    for f in failures:
        console.print(f"[red]failed[/] {f['image']} on {f['node']}: {f['error']}")
    summary = {"images": len(images), "nodes": len(holders), "copies": min(copies, len(holders)),
               "pulled": int(sum(s["pulled"] for s in stats.values())),
               "present": present + int(sum(s["present"] for s in stats.values())),
               "failed": len(failures), "bytes": int(sum(s["bytes"] for s in stats.values())),
               "seconds": round(time.monotonic() - t0, 2)}
    print(json.dumps(summary, sort_keys=True))
    return summary


def push_images(client: docker.DockerClient, tasks: list[dict[str, Any]], registry: str,
                username: str | None = None, password: str | None = None,
                console: Console | None = None) -> int:
    """Build (cached) and push the tasks' images to `registry`; the number that failed."""
    from envd.images import build_task_images

    console = console or Console()
    images = build_task_images(client, tasks, progress=True)
    auth = {"username": username, "password": password or ""} if username else None
    failed: list[tuple[str, str]] = []
    t0 = time.monotonic()
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=console, transient=False) as prog:
        bar = prog.add_task(f"push {len(images)} images to {registry}", total=len(images))
        for image in images:
            _, rest = split_name(image)
            repo, _, tag = rest.rpartition(":")
            remote = f"{registry.rstrip('/')}/{repo}"
            client.api.tag(image, remote, tag)
            try:
                for ev in client.api.push(remote, tag=tag, stream=True, decode=True, auth_config=auth):
                    if ev.get("error"):
                        raise RuntimeError(ev["error"])
                prog.update(bar, advance=1, description=f"pushed {remote}:{tag}")
            except Exception as e:  # name the image; go on with the others
                failed.append((image, str(e)))
                prog.update(bar, advance=1, description=f"[red]failed[/] {remote}:{tag}")
            finally:
                client.api.remove_image(f"{remote}:{tag}")  # the tag only: the image keeps its name
    for image, err in failed:
        console.print(f"[red]failed[/] {image}: {err}")
    summary = {"images": len(images), "pushed": len(images) - len(failed), "failed": len(failed),
               "registry": registry, "seconds": round(time.monotonic() - t0, 2)}
    print(json.dumps(summary, sort_keys=True))
    return len(failed)
