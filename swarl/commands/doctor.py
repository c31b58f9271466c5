"""`swarl doctor`: what this machine gives the GPU path, and whether it can run a config."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from swarl.cliutil import SetOpt


def doctor(
    config: Annotated[str | None, typer.Option(
        "--config", "-c", help="Check that this machine can run this config's --role "
        "(without it: only the report).")] = None,
    sets: SetOpt = None,
    role: Annotated[str, typer.Option(
        "--role", help="learner: the megatron learner and its weight-sync group; inference: an "
        "SGLang server (launch-sglang) and its weight-sync group.")] = "learner",
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as one JSON object.")] = False,
) -> None:
    """Report the GPU features swarl will use here (CUDA devices, NCCL, TransformerEngine or the
    local layer spec, attention, apex, flash-attn, megatron-core and sglang against the pins).
    With --config: exit 1 when this machine cannot run the config's --role, each reason on
    stderr; exit 2 when the config does not load."""
    from swarl.cliutil import load
    from swarl.doctor import check, machine, render

    if role not in ("learner", "inference"):
        typer.echo(f"swarl doctor: --role is {role!r}: learner or inference", err=True)
        raise typer.Exit(2)
    cfg = load(config, sets) if config or sets else None
    m = machine()
    problems: list[str] = []
    warnings: list[str] = []
    if cfg is not None:
        problems, warnings = check(cfg, m, role)  # type: ignore[arg-type]
    if as_json:
        typer.echo(json.dumps({"machine": m, "config": config, "role": role if cfg else None,
                               "problems": problems, "warnings": warnings, "ok": not problems}))
    else:
        out = render(m)
        if cfg is not None:
            out += f"\n{config or 'the default config'}, {role}: " + ("can run here" if not problems
                                                                       else "CANNOT RUN here") + "\n"
            out += "".join(f"  note: {w}\n" for w in warnings)
        typer.echo(out, nl=False)
    for p in problems:
        typer.echo(f"swarl doctor: cannot run: {p}", err=True)
    if problems:
        raise typer.Exit(1)
