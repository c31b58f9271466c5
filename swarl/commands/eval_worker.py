"""`swarl eval-worker`: evaluation during training (actors/eval_worker.py), wired to the eval set,
the checkpoint verifier (weight_sync) and the run's metrics.jsonl / TensorBoard (learner)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any

import typer

from swarl.cliutil import ConfigOpt, SetOpt


class EvalSetError(ValueError):
    """eval.rows names no readable eval set, or one with a bad row."""


def load_eval_rows(spec: str, max_instances: int | None = None) -> list[dict[str, Any]]:
    """The eval set: a prepared rows file (JSONL), or a bundled suite's split `<suite>:<split>`
    (bundled:heldout, generated:heldout_family); each row validated (image_name set). Raises
    EvalSetError naming the problem."""
    from swe.rows import RowError, read_rows, validate_row
    from swe.tasks import SUITES, load_tasks

    rows: list[dict[str, Any]] = []
    if Path(spec).is_file():
        try:
            rows = [r.instance for r in read_rows(spec)]
        except RowError as e:
            raise EvalSetError(f"eval.rows: {spec}: {e}") from None
    elif ":" in spec and spec.split(":", 1)[0] in SUITES:
        suite, split = spec.split(":", 1)
        try:
            rows = [validate_row(r, suite, where=f"{suite}[{split}] row {i}")
                    for i, r in enumerate(load_tasks(split, suite))]
        except ValueError as e:
            raise EvalSetError(f"eval.rows: {spec}: {e}") from None
    else:
        raise EvalSetError(f"eval.rows: {spec!r} is neither a file nor <suite>:<split> with suite one of "
                           f"{', '.join(SUITES)} (e.g. bundled:heldout)")
    rows = rows[:max_instances] if max_instances else rows
    if not rows:
        raise EvalSetError(f"eval.rows: {spec} holds no rows")
    return rows


def eval_worker(
    config: ConfigOpt = None,
    sets: SetOpt = None,
    every_versions: Annotated[int | None, typer.Option(
        "--every-versions", help="Evaluate every N-th published version (eval.every_versions).")] = None,
    rows: Annotated[str | None, typer.Option(
        "--rows", help="The eval set: a prepared rows file or <suite>:<split> (eval.rows).")] = None,
    pool_url: Annotated[str | None, typer.Option("--pool-url", help="Pool URL (pool.url).")] = None,
) -> None:
    """Evaluate the learner's versions while it trains: every eval.every_versions-th published
    version, on exactly that version (eval servers: `swarl inference serve --role eval`)."""
    import asyncio
    import signal

    from actors.eval_worker import EvalWorker
    from broker.connection import connect
    from common.services import redis_for_command
    from learner.metrics_log import EvalLog
    from swarl.cliutil import load
    from weight_sync.checkpoints import verify

    cfg = load(config, sets, extra={"eval.every_versions": every_versions, "eval.rows": rows,
                                     "pool.url": pool_url})
    ev = cfg.eval
    if ev.every_versions < 1 or not ev.rows:
        typer.echo("swarl eval-worker: eval.every_versions is 0 (evaluation during training is off); set it "
                   "and eval.rows (--every-versions N --rows FILE|<suite>:<split>)", err=True)
        raise typer.Exit(2)
    if not cfg.pool.url:
        typer.echo("swarl eval-worker: pool.url is not set (--pool-url, SWARL_POOL_URL or --set pool.url=...)",
                   err=True)
        raise typer.Exit(2)
    try:
        eval_rows = load_eval_rows(ev.rows, ev.max_instances)
    except (EvalSetError, FileNotFoundError) as e:
        typer.echo(f"swarl eval-worker: {e}", err=True)
        raise typer.Exit(2) from None
    pool_url_ = cfg.pool.url
    api_key = cfg.actor.inference_api_key or os.environ.get("SWARL_INFERENCE_API_KEY")

    async def main(url: str) -> None:
        redis = connect(url, cfg.redis)
        sink = EvalLog(cfg.run.dir, tensorboard=cfg.learner.tensorboard)
        worker = EvalWorker(ev, cfg.actor, redis, cfg.keys, eval_rows,
                            out_dir=ev.out_dir or Path(cfg.run.dir) / "evals", pool_url=pool_url_,
                            pool_token=cfg.envd.token, api_key=api_key, verify=verify,
                            tokenizer=cfg.actor.tokenizer or cfg.inference.model, sink=sink)
        task = asyncio.current_task()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            # stop now: a version being evaluated goes back (its finished episodes are kept)
            loop.add_signal_handler(sig, lambda: task.cancel() if task is not None else None)
        try:
            await worker.run()
        except asyncio.CancelledError:
            pass
        finally:
            sink.close()
            await redis.aclose()

    with redis_for_command(cfg.redis.url, cfg.run.dir) as url:
        asyncio.run(main(url))
