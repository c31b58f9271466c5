"""`swarl envd ...`, `swarl pool ...`."""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer

from swarl.cliutil import ConfigOpt, SetOpt, load

envd_app = typer.Typer(help="The Docker exec daemon (one per Docker node).", no_args_is_help=True)
pool_app = typer.Typer(help="The lease pool in front of the envd nodes.", no_args_is_help=True)

__all__ = ["envd_app", "pool_app"]

HostOpt = Annotated[str | None, typer.Option("--host", help="Bind address (default from config).")]
PortOpt = Annotated[int | None, typer.Option("--port", help="Port (default from config).")]
TokenFileOpt = Annotated[
    str | None, typer.Option("--token-file", help="Read the bearer token from this file.")]
NoAuthOpt = Annotated[
    bool, typer.Option("--no-auth", help="Serve without a token (trusted networks only; logs a warning).")]


def _token(configured: str | None, token_file: str | None, no_auth: bool) -> str | None:
    from common.http import resolve_token
    from common.logs import get_logger
    from envd.httputil import TOKEN_ENV

    try:
        token = resolve_token(configured, token_file, no_auth, TOKEN_ENV, "envd.token")
    except (ValueError, OSError) as e:
        typer.echo(f"swarl: {e}", err=True)
        raise typer.Exit(2) from None
    if token is None:
        get_logger("envd").warning("auth_disabled", note="--no-auth: anyone who reaches this port "
                                   "runs commands in containers")
    return token


@envd_app.command("serve")
def envd_serve(
    host: HostOpt = None,
    port: PortOpt = None,
    token_file: TokenFileOpt = None,
    no_auth: NoAuthOpt = False,
    node_id: Annotated[str | None, typer.Option("--node-id", help="This node's id (container owner label).")] = None,
    config: ConfigOpt = None,
    sets: SetOpt = None,
) -> None:
    """Serve the exec daemon: containers, exec, diff, evaluate, destroy."""
    cfg = load(config, sets, extra={"envd.host": host, "envd.port": port, "envd.node_id": node_id})
    token = _token(cfg.envd.token, token_file, no_auth)

    import uvicorn

    from common.services import ensure_docker
    from envd.daemon import create_app, default_node_id

    docker_url = cfg.envd.docker_url or ensure_docker()
    app = create_app(cfg.envd, token, cfg.envd.node_id or default_node_id(cfg.envd.port), docker_url,
                     cfg.keys, cfg.redis if cfg.redis.url else None)
    uvicorn.run(app, host=cfg.envd.host, port=cfg.envd.port, log_level="warning",
                timeout_graceful_shutdown=10)


@pool_app.command("serve")
def pool_serve(
    host: HostOpt = None,
    port: PortOpt = None,
    exec_urls: Annotated[str | None, typer.Option("--exec-urls", help="envd URLs, comma-separated.")] = None,
    token_file: TokenFileOpt = None,
    no_auth: NoAuthOpt = False,
    config: ConfigOpt = None,
    sets: SetOpt = None,
) -> None:
    """Serve the lease pool: allocate/exec/diff/evaluate/close over the envd nodes."""
    urls = [u.strip().rstrip("/") for u in exec_urls.split(",") if u.strip()] if exec_urls else None
    cfg = load(config, sets, extra={"pool.host": host, "pool.port": port, "pool.exec_urls": urls})
    token = _token(cfg.envd.token, token_file, no_auth)
    # The pool talks to nodes with the envd token even when its own port is open (--no-auth).
    from common.http import resolve_token
    from envd.httputil import TOKEN_ENV

    try:
        node_token: str | None = resolve_token(cfg.envd.token, token_file, False, TOKEN_ENV, "envd.token")
    except (ValueError, OSError):
        node_token = None

    import uvicorn

    from common.services import redis_for_command
    from envd.pool import create_app

    with redis_for_command(cfg.redis.url, cfg.run.dir) as redis_url:
        app = create_app(cfg.pool, cfg.envd, cfg.redis_at(redis_url), cfg.keys, token, node_token)
        uvicorn.run(app, host=cfg.pool.host, port=cfg.pool.port, log_level="warning",
                    timeout_graceful_shutdown=10)


def _node_cmd(url: str, action: str, pool_url: str | None, token_file: str | None,
              config: str | None, sets: list[str] | None) -> None:
    cfg = load(config, sets, extra={"pool.url": pool_url})
    url = url.rstrip("/")
    import asyncio

    if cfg.pool.url:
        from envd.client import EnvdClient, EnvError, EnvRequestError

        pool = EnvdClient.pool(cfg.pool.url, _token(cfg.envd.token, token_file, False), timeout_s=30)

        async def call() -> dict[str, Any]:
            try:
                return await (pool.add_node(url) if action == "add" else pool.remove_node(url))
            finally:
                await pool.aclose()

        try:
            typer.echo(json.dumps(asyncio.run(call())))
        except (EnvError, EnvRequestError) as e:
            typer.echo(f"swarl pool {action}-node: {e}", err=True)
            raise typer.Exit(1) from None
        return
    if not cfg.redis.url:
        typer.echo("swarl: give --pool-url (or pool.url) or redis.url to reach the pool", err=True)
        raise typer.Exit(2)
    from envd.pool_state import PoolState

    async def go() -> None:
        state = await PoolState.open(cfg.pool, cfg.redis, cfg.keys)
        try:
            if action == "add":
                await state.add_node(url)
            else:
                await state.drain_node(url)
        finally:
            await state.close()

    asyncio.run(go())
    typer.echo(f"{action} {url}: ok")


PoolUrlOpt = Annotated[str | None, typer.Option("--pool-url", help="Pool to ask (else Redis directly).")]


@pool_app.command("add-node")
def add_node(url: str, pool_url: PoolUrlOpt = None, token_file: TokenFileOpt = None,
             config: ConfigOpt = None, sets: SetOpt = None) -> None:
    """Add an envd node to a running pool (via its HTTP API, or Redis)."""
    _node_cmd(url, "add", pool_url, token_file, config, sets)


@pool_app.command("remove-node")
def remove_node(url: str, pool_url: PoolUrlOpt = None, token_file: TokenFileOpt = None,
                config: ConfigOpt = None, sets: SetOpt = None) -> None:
    """Drain an envd node: no new leases; it leaves once its leases are closed."""
    _node_cmd(url, "remove", pool_url, token_file, config, sets)
