"""`swarl inference ...`, `swarl model ...`."""

from __future__ import annotations

import os
from typing import Annotated, cast

import typer

from broker.registry import ROLES, Role
from swarl.cliutil import ConfigOpt, SetOpt, load

inference_app = typer.Typer(help="Inference servers: swarl's CPU server and real SGLang.", no_args_is_help=True)
model_app = typer.Typer(help="Models: tiny test models.", no_args_is_help=True)

API_KEY_ENV = "SWARL_INFERENCE_API_KEY"


def _api_key(flag: str | None, configured: str | None, no_auth: bool) -> str | None:
    key = flag or os.environ.get(API_KEY_ENV) or configured
    if key or no_auth:
        return key or None
    typer.echo(f"swarl: an API key is required: pass --api-key, set {API_KEY_ENV} or inference.api_key "
               "(or --no-auth to serve without one)", err=True)
    raise typer.Exit(2)


@inference_app.command("serve")
def serve(
    model: Annotated[str | None, typer.Option("--model", help="HF model directory (default inference.model).")] = None,
    port: Annotated[int | None, typer.Option("--port", help="Port (default inference.port).")] = None,
    host: Annotated[str | None, typer.Option("--host", help="Bind address (default inference.host).")] = None,
    weight_version: Annotated[str | None, typer.Option("--weight-version", help="Starting weight version.")] = None,
    api_key: Annotated[str | None, typer.Option("--api-key", help=f"Bearer token required (or {API_KEY_ENV}).")] = None,
    no_auth: Annotated[bool, typer.Option("--no-auth", help="Serve without an API key (not recommended).")] = False,
    redis_url: Annotated[str | None, typer.Option("--redis-url", help="Register in this Redis's server registry (default redis.url).")] = None,
    run_id: Annotated[str | None, typer.Option("--run-id", help="Run id of the registry keys (default run.id).")] = None,
    server_id: Annotated[str | None, typer.Option("--server-id", help="Registry id (default host:port of the URL).")] = None,
    advertise_url: Annotated[str | None, typer.Option("--advertise-url", help="URL others reach this server at.")] = None,
    threads: Annotated[int | None, typer.Option("--threads", help="torch threads (default inference.threads).")] = None,
    max_batch_size: Annotated[int | None, typer.Option("--max-batch-size", help="Most requests per decode batch.")] = None,
    tp_size: Annotated[int | None, typer.Option(
        "--tp-size", help="Tensor-parallel size to act as in weight-update groups (default inference.tp_size).")] = None,
    role: Annotated[str | None, typer.Option(
        "--role", help="policy | prm (a judge) | eval (an eval worker's server); prm and eval are "
        "never pinned nor updated by weight sync (default inference.role).")] = None,
    config: ConfigOpt = None,
    sets: SetOpt = None,
) -> None:
    """Serve a model on CPU with SGLang's native HTTP API."""
    cfg = load(config, sets, extra={
        "inference.model": model, "inference.port": port, "inference.host": host,
        "inference.weight_version": weight_version, "inference.threads": threads,
        "inference.max_batch_size": max_batch_size, "inference.tp_size": tp_size, "run.id": run_id,
        "inference.role": role,
    })
    ic = cfg.inference
    if not ic.model:
        typer.echo("swarl: --model (or inference.model) is required", err=True)
        raise typer.Exit(2)
    key = _api_key(api_key, ic.api_key, no_auth)
    # Busy-waiting OpenMP threads collapse throughput ~30x when the cores are shared with actors
    # and the learner (seen here: 375 ms vs 12 ms per decode step); must be set before torch loads.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

    import torch
    import uvicorn
    from transformers.utils import logging as hf_logging

    from inference.cpu_server import DrainingServer, ServerSettings, create_app

    torch.set_num_threads(ic.threads)
    hf_logging.disable_progress_bar()
    settings = ServerSettings(
        model_dir=ic.model, host=ic.host, port=ic.port, weight_version=ic.weight_version, api_key=key,
        max_batch_size=ic.max_batch_size, max_prefill_tokens=ic.max_prefill_tokens, seed=ic.seed,
        tp_size=ic.tp_size, role=ic.role, redis_url=redis_url or cfg.redis.url, redis_cfg=cfg.redis, keys=cfg.keys,
        server_id=server_id, advertise_url=advertise_url, heartbeat_s=ic.heartbeat_s,
    )
    app = create_app(settings)
    server = DrainingServer(uvicorn.Config(app, host=ic.host, port=ic.port, log_level="warning",
                                           timeout_graceful_shutdown=10),
                            drain_timeout_s=ic.drain_timeout_s)
    server.run()


@inference_app.command("launch-sglang")
def launch_sglang(
    model: Annotated[str, typer.Option("--model", help="Model path (HF directory or hub id) for SGLang.")],
    port: Annotated[int, typer.Option("--port", help="Port SGLang listens on.")] = 30000,
    host: Annotated[str, typer.Option("--host", help="Bind address.")] = "127.0.0.1",
    tp_size: Annotated[int, typer.Option("--tp-size", "--tp", help="SGLang's --tp-size: GPUs per server; "
                                         "registered, so a weight-update group gets one rank per GPU.")] = 1,
    weight_version: Annotated[str, typer.Option("--weight-version", help="Starting weight version.")] = "0",
    mem_fraction: Annotated[float | None, typer.Option("--mem-fraction", help="--mem-fraction-static.")] = None,
    api_key: Annotated[str | None, typer.Option("--api-key", help=f"Bearer token (or {API_KEY_ENV}).")] = None,
    base_gpu_id: Annotated[int | None, typer.Option("--base-gpu-id", help="First GPU of this engine.")] = None,
    redis_url: Annotated[str | None, typer.Option("--redis-url", help="Register in this Redis's server registry.")] = None,
    advertise_url: Annotated[str | None, typer.Option("--advertise-url", help="URL others reach the server at.")] = None,
    server_id: Annotated[str | None, typer.Option("--server-id", help="Registry id (default host:port).")] = None,
    role: Annotated[str, typer.Option("--role", help="policy | prm | eval (registered: a prm server "
                                      "is a judge, an eval server an eval worker's; neither is pinned nor "
                                      "updated by weight sync).")] = "policy",
    run: Annotated[bool, typer.Option("--run", help="Start SGLang (and register it) instead of printing.")] = False,
    extra: Annotated[list[str] | None, typer.Option("--extra", help="Extra SGLang argument (repeatable).")] = None,
    config: ConfigOpt = None,
    sets: SetOpt = None,
) -> None:
    """Build (print, or with --run start) the `python -m sglang.launch_server` command swarl needs."""
    import shlex

    from inference.sglang_launch import SGLangLaunch, build_command, run_and_register

    cfg = load(config, sets)
    if role not in ROLES:
        typer.echo(f"swarl: --role: {role!r} not one of {ROLES}", err=True)
        raise typer.Exit(2)
    key = api_key or os.environ.get(API_KEY_ENV) or cfg.inference.api_key
    spec = SGLangLaunch(model=model, port=port, host=host, tp_size=tp_size, weight_version=weight_version,
                        mem_fraction=mem_fraction, api_key=key, base_gpu_id=base_gpu_id, extra=extra or [])
    try:
        cmd = build_command(spec)
    except ValueError as e:
        typer.echo(f"swarl: {e}", err=True)
        raise typer.Exit(2) from None
    shown = [("***" if i > 0 and cmd[i - 1] == "--api-key" else a) for i, a in enumerate(cmd)]
    typer.echo(shlex.join(shown))
    if run:
        raise typer.Exit(run_and_register(spec, cmd, redis_url or cfg.redis.url, cfg.keys,
                                          server_id=server_id, advertise_url=advertise_url,
                                          heartbeat_s=cfg.inference.heartbeat_s,
                                          role=cast("Role", role)))


@model_app.command("init-tiny")
def init_tiny_cmd(
    out_dir: Annotated[str, typer.Argument(help="Directory to write the model into.")],
    seed: Annotated[int, typer.Option("--seed", help="Seed of the random weights.")] = 0,
) -> None:
    """Write a tiny random Qwen3 model + BPE tokenizer (ChatML) in HF format."""
    from inference.tiny_model import init_tiny

    path = init_tiny(out_dir, seed=seed)
    typer.echo(str(path))


scripted_app = typer.Typer(help="Scripted policy server (tests, benchmarks, demo).",
                           no_args_is_help=True, add_completion=False)


@scripted_app.callback()
def _scripted() -> None:
    """Scripted policy server (keeps `serve` a subcommand)."""


@scripted_app.command("serve")
def scripted_serve(
    tokenizer: Annotated[str, typer.Option("--tokenizer", help="HF tokenizer directory.")],
    mode: Annotated[str, typer.Option("--mode", help="fix | wrong | noop | format | loop | sleep | flood | "
                                      "judge (a PRM stand-in answering known votes; registers as role prm)")] = "fix",
    host: Annotated[str, typer.Option("--host", help="Bind address.")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", help="Port.")] = 30100,
    api_key: Annotated[str | None, typer.Option("--api-key", help=f"Bearer token required (or {API_KEY_ENV}).")] = None,
    no_auth: Annotated[bool, typer.Option("--no-auth", help="Serve without an API key (warns).")] = False,
    weight_version: Annotated[str, typer.Option("--weight-version", help="Weight version it reports.")] = "0",
    tasks: Annotated[str | None, typer.Option("--tasks", help="JSONL of instance rows (default: "
                                              "the bundled suite).")] = None,
    redis_url: Annotated[str | None, typer.Option(
        "--redis-url", help="Register in this Redis's server registry, ready at any version (default redis.url).")] = None,
    run_id: Annotated[str | None, typer.Option("--run-id", help="Run id of the registry keys (default run.id).")] = None,
    server_id: Annotated[str | None, typer.Option("--server-id", help="Registry id (default host:port).")] = None,
    sleep_s: Annotated[int, typer.Option("--sleep-s", help="Seconds the `sleep` mode's command sleeps.")] = 30,
    judge_vote: Annotated[str, typer.Option("--judge-vote", help="judge mode: the vote of a row without "
                                            "swarl_prm_votes: +1 | -1 | bad | error.")] = "+1",
    judge_delay_s: Annotated[float, typer.Option("--judge-delay-s", help="judge mode: seconds each vote takes.")] = 0.0,
    latency: Annotated[str | None, typer.Option(
        "--latency-profile", help="JSON of an inference.latency.LatencyProfile: heavy-tailed "
        "episode durations (lognormal turns and per-token time); unset: answer at once.")] = None,
    fail_episodes: Annotated[int, typer.Option(
        "--fail-episodes", min=0, help="Fault injection: the first N episodes it sees get HTTP 500 on "
        "their first request (an infrastructure failure; the retry succeeds).")] = 0,
    config: ConfigOpt = None,
    sets: SetOpt = None,
) -> None:
    """Serve fixed answers per instance over SGLang's /generate API."""
    import asyncio
    import json
    from pathlib import Path

    from common.logs import get_logger
    from inference.latency import LatencyProfile
    from inference.scripted import serve

    cfg = load(config, sets, extra={"run.id": run_id})
    try:
        profile = LatencyProfile.model_validate_json(latency) if latency else None
    except ValueError as e:
        raise typer.BadParameter(f"--latency-profile: {e}") from e
    key = _api_key(api_key, cfg.inference.api_key, no_auth)
    if key is None:
        get_logger("inference.scripted").warning("serving_without_auth")
    if tasks:
        rows = [json.loads(line) for line in Path(tasks).read_text().splitlines() if line.strip()]
        rows = [r.get("metadata", {}).get("instance", r) for r in rows]  # prepared JSONL or raw rows
    else:
        from swe.tasks import load_tasks

        rows = load_tasks("all")
    asyncio.run(serve(tokenizer, mode, host, port, key, weight_version, rows,
                      redis_url or cfg.redis.url, cfg.keys, server_id=server_id,
                      heartbeat_s=cfg.inference.heartbeat_s, sleep_s=sleep_s, redis_cfg=cfg.redis,
                      judge_vote=judge_vote, judge_delay_s=judge_delay_s, latency=profile,
                      fail_episodes=fail_episodes))
