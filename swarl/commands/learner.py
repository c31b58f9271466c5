"""`swarl learner`, `swarl plot`."""

from __future__ import annotations

from typing import Annotated

import typer

from swarl.cliutil import ConfigOpt, SetOpt


def learner(
    config: ConfigOpt = None,
    sets: SetOpt = None,
    resume: Annotated[bool, typer.Option("--resume", help="Continue from the newest checkpoint "
                                         "in <run.dir>/learner/checkpoints.")] = False,
    max_steps: Annotated[int | None, typer.Option("--max-steps", help="Stop after this many "
                                                  "optimizer steps (learner.max_steps).")] = None,
) -> None:
    """Train on the replay stream (consumer group), publishing a new policy version every
    learner.update_every steps."""
    import asyncio

    from common.services import redis_for_command
    from learner.service import ResumeError, run_learner
    from swarl.cliutil import load
    from swarl.wiring import learner_runtime, publisher_factory

    cfg = load(config, sets, extra={"learner.max_steps": max_steps})
    try:
        with redis_for_command(cfg.redis.url, cfg.run.dir) as url:
            state = asyncio.run(run_learner(learner_runtime(cfg, url), resume,
                                            publisher_factory(cfg, url)))
    except ResumeError as e:
        typer.echo(f"swarl learner: {e}", err=True)
        raise typer.Exit(2) from None
    typer.echo(f"learner stopped at step {state.step}, version {state.version}")


def plot(
    run_dir: Annotated[str, typer.Argument(help="Run directory holding metrics.jsonl.")],
    out: Annotated[str | None, typer.Option("--out", help="Output directory (default RUN_DIR/plots).")] = None,
) -> None:
    """Render PNG curves of a run: reward, resolve rate, staleness, throughput."""
    from learner.plot import plot_run

    try:
        paths = plot_run(run_dir, out)
    except FileNotFoundError as e:
        typer.echo(f"swarl plot: {e}", err=True)
        raise typer.Exit(2) from None
    for p in paths:
        typer.echo(str(p))
