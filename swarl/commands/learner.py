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
    nproc_per_node: Annotated[int, typer.Option(
        "--nproc-per-node", min=1, help="Start this many ranks on this node under torchrun (rank 0 "
        "reads Redis, checkpoints and publishes; every rank trains). For several nodes run "
        "`torchrun ... -m swarl.cli learner ...` on each.")] = 1,
) -> None:
    """Train on the replay stream (consumer group), publishing a new policy version every
    learner.update_every steps."""
    import asyncio
    import os

    from common.services import redis_for_command
    from learner.service import ResumeError, run_learner
    from swarl.cliutil import load
    from swarl.config import rollout_temperature_error
    from swarl.wiring import learner_runtime, publisher_factory

    cfg = load(config, sets, extra={"learner.max_steps": max_steps})
    if (why := rollout_temperature_error(cfg)) is not None:
        typer.echo(f"swarl learner: {why}", err=True)
        raise typer.Exit(2)
    under_torchrun = "LOCAL_RANK" in os.environ
    if nproc_per_node > 1 and not under_torchrun:
        args = [*(["-c", config] if config else []), *(a for s in sets or () for a in ("--set", s)),
                *(["--resume"] if resume else []),
                *(["--max-steps", str(max_steps)] if max_steps is not None else [])]
        with redis_for_command(cfg.redis.url, cfg.run.dir) as url:
            code = _torchrun(nproc_per_node, args, url)
        if code != 0:
            typer.echo(f"swarl learner: torchrun exited with {code} (the failed rank is named above); "
                       "continue the run with --resume", err=True)
        raise typer.Exit(code)
    ws = cfg.weight_sync
    if ws.transport == "distributed" and ws.backend != "gloo" and cfg.learner.publish == "weight_sync":
        from weight_sync.update_group import nccl_setup_bound

        # before the process's first NCCL operation (training's included): torch reads the bound
        # of rank 0's non-blocking update-group set-up once, at the first one
        nccl_setup_bound(ws.group_timeout_s)
    try:
        if under_torchrun:  # the ranks share the configured Redis; none starts its own
            state = asyncio.run(run_learner(learner_runtime(cfg), resume, publisher_factory(cfg)))
        else:
            with redis_for_command(cfg.redis.url, cfg.run.dir) as url:
                state = asyncio.run(run_learner(learner_runtime(cfg, url), resume,
                                                publisher_factory(cfg, url)))
    except ResumeError as e:
        typer.echo(f"swarl learner: {e}", err=True)
        raise typer.Exit(2) from None
    if state is not None:  # rank 0 (or the only rank)
        typer.echo(f"learner stopped at step {state.step}, version {state.version}")


def _torchrun(nproc: int, args: list[str], redis_url: str) -> int:
    """Run `swarl learner ARGS` on `nproc` local ranks under torchrun; its exit code.
    SIGTERM/SIGINT go to the ranks themselves, which stop together after their current step and
    exit 0 (torchrun, signalled, would kill them and fail)."""
    import contextlib
    import os
    import signal
    import subprocess
    import sys

    import psutil

    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           f"--nproc-per-node={nproc}", "-m", "swarl.cli", "learner", *args]
    proc = subprocess.Popen(cmd, env={**os.environ, "SWARL_REDIS_URL": redis_url})

    def forward(signum: int, _frame: object) -> None:
        try:
            ranks = psutil.Process(proc.pid).children()
        except psutil.NoSuchProcess:
            return
        for rank in ranks or [psutil.Process(proc.pid)]:
            with contextlib.suppress(psutil.NoSuchProcess):
                rank.send_signal(signum)

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, forward)
    return proc.wait()


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
