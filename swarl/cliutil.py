"""Options every subcommand shares (--config, --set) and the one place config is loaded."""

from __future__ import annotations

from typing import Annotated

import typer

from common.logs import setup_logging
from swarl.config import ConfigError, SwarlConfig, load_config

ConfigOpt = Annotated[
    str | None, typer.Option("--config", "-c", help="YAML config (default configs/local.yaml).")
]
SetOpt = Annotated[
    list[str] | None,
    typer.Option("--set", help="Override a key: --set learner.lr=1e-5 (repeatable)."),
]


def load(config: str | None, sets: list[str] | None, extra: dict[str, object] | None = None) -> SwarlConfig:
    """Load config with CLI overrides; explicit flags (`extra`, dotted keys) win over --set."""
    items = list(sets or [])
    for key, value in (extra or {}).items():
        if value is not None:
            items.append(f"{key}={_yaml_scalar(value)}")
    try:
        cfg = load_config(config, items)
    except ConfigError as e:
        typer.echo(f"swarl: {e}", err=True)
        raise typer.Exit(2) from None
    setup_logging(cfg.run.log_level, cfg.run.log_format)
    return cfg


def _yaml_scalar(value: object) -> str:
    import json

    if isinstance(value, str):
        return json.dumps(value)
    return json.dumps(value)
