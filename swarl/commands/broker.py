"""`swarl enqueue`, `swarl status`."""

from __future__ import annotations

import asyncio
from typing import Annotated

import typer

from swarl.cliutil import ConfigOpt, SetOpt, load


def enqueue(
    data: Annotated[str, typer.Option("--data", help="JSONL: prepared records (swarl data prepare) or raw SWE rows; "
                                      "with actor.environment scored, rows with instance_id and prompt.")],
    n_samples: Annotated[int, typer.Option("--n-samples", help="Samples per instance (GRPO group size).")] = 8,
    epochs: Annotated[int, typer.Option("--epochs", help="Groups per instance (each a new group id).")] = 1,
    skip_bad: Annotated[bool, typer.Option("--skip-bad/--fail-on-bad", help="Skip malformed rows (reported) or stop.")] = True,
    shuffle: Annotated[bool, typer.Option("--shuffle/--in-order", help="Each epoch's rows in a seeded shuffle "
                                          "(arq serves oldest first) or in file order.")] = True,
    seed: Annotated[int | None, typer.Option("--seed", help="Shuffle seed (default run.seed).")] = None,
    config: ConfigOpt = None,
    sets: SetOpt = None,
) -> None:
    """Enqueue one job per (instance, group, sample index), epoch by epoch, each epoch shuffled;
    idempotent (deterministic job ids)."""
    from actors.scored import read_scored_rows
    from broker.tasks import arq_pool, enqueue_jobs, epoch_order, jobs_for
    from common.services import redis_for_command
    from swe.rows import RowError, read_rows

    cfg = load(config, sets)
    keys = cfg.keys
    errors: list[RowError] = []

    scored = cfg.actor.environment == "scored"

    async def run(url: str) -> tuple[int, int, int]:
        pool = await arq_pool(url)
        try:
            rows = list(read_scored_rows(data, errors if skip_bad else None) if scored
                        else read_rows(data, errors=errors if skip_bad else None))
            order = epoch_order(rows, range(epochs), seed=(cfg.run.seed if seed is None else seed) if shuffle else None)
            added, skipped = await enqueue_jobs(pool, keys, [
                j for row, epoch in order for j in jobs_for(keys, row.instance, row.data_source, n_samples, epoch)])
            return len(rows), added, skipped
        finally:
            await pool.aclose()

    try:
        with redis_for_command(cfg.redis.url, cfg.run.dir) as url:
            rows, added, skipped = asyncio.run(run(url))
    except RowError as e:
        typer.echo(f"swarl enqueue: {e.brief()}", err=True)
        raise typer.Exit(2) from None
    except FileNotFoundError as e:
        typer.echo(f"swarl enqueue: {e}", err=True)
        raise typer.Exit(2) from None
    for bad in errors:
        typer.echo(f"swarl enqueue: skipped {bad.brief()}", err=True)
    typer.echo(f"enqueued {added} jobs ({skipped} already queued or done) from {rows} rows; "
               f"{len(errors)} bad rows skipped; queue {keys.queue}")


def status(
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object, for machines.")] = False,
    watch: Annotated[float, typer.Option("--watch", help="Refresh every N seconds (0 = once).")] = 0.0,
    config: ConfigOpt = None,
    sets: SetOpt = None,
) -> None:
    """One screen: queue depth, running, stream length, pending and lag, versions, servers, actors."""
    from broker.connection import connect
    from broker.status import gather, render, to_json
    from common.services import redis_for_command

    cfg = load(config, sets)
    keys = cfg.keys

    async def run(url: str) -> None:
        from rich.console import Console
        from rich.live import Live

        redis = connect(url, cfg.redis)
        try:
            if as_json:
                typer.echo(to_json(await gather(redis, keys, cfg.replay, cfg.admission)))
                return
            st = await gather(redis, keys, cfg.replay, cfg.admission)
            if watch <= 0:
                Console().print(render(st))
                return
            with Live(render(st), refresh_per_second=2) as live:
                while True:
                    await asyncio.sleep(watch)
                    live.update(render(await gather(redis, keys, cfg.replay, cfg.admission)))
        finally:
            await redis.aclose()

    with redis_for_command(cfg.redis.url, cfg.run.dir) as url:
        try:
            asyncio.run(run(url))
        except KeyboardInterrupt:
            pass
