"""`swarl actor`: the rollout worker."""

from __future__ import annotations

from typing import Annotated

import typer

from swarl.cliutil import ConfigOpt, SetOpt


def actor(
    config: ConfigOpt = None,
    sets: SetOpt = None,
    concurrency: Annotated[int | None, typer.Option("--concurrency", "-k",
                                                    help="Episodes at once (actor.concurrency).")] = None,
    pool_url: Annotated[str | None, typer.Option("--pool-url", help="Pool URL (pool.url).")] = None,
) -> None:
    """Run a rollout worker (arq) with K concurrent episodes."""
    import asyncio

    from actors.worker import run_actor
    from common.services import redis_for_command
    from swarl.cliutil import load
    from swarl.wiring import actor_runtime

    cfg = load(config, sets, extra={"actor.concurrency": concurrency, "pool.url": pool_url})
    if not cfg.pool.url and cfg.actor.environment == "envd":
        typer.echo("swarl actor: pool.url is not set (--pool-url, SWARL_POOL_URL or --set pool.url=...)",
                   err=True)
        raise typer.Exit(2)
    if cfg.actor.environment == "scored":
        from actors.scored import load_scorer

        try:
            load_scorer(cfg.actor.scorer)  # refused before the worker starts, not per episode
        except ValueError as e:
            typer.echo(f"swarl actor: {e}", err=True)
            raise typer.Exit(2) from None
    with redis_for_command(cfg.redis.url, cfg.run.dir) as url:
        asyncio.run(run_actor(actor_runtime(cfg, url), cfg.actor.concurrency))
