"""Operator commands: `swarl config [show|docs|plan]`, `swarl data prepare`, `swarl systemd install`.
(`swarl demo` and `swarl eval` are mounted by the lead.)"""

from __future__ import annotations

import json
from typing import Annotated

import typer

from swarl.cliutil import ConfigOpt, SetOpt, load

config_app = typer.Typer(
    help="The effective config (no subcommand: print it) and its reference docs.",
    invoke_without_command=True,
)
data_app = typer.Typer(help="Dataset preparation (SWE-bench / SWE-Gym → swarl JSONL).",
                       no_args_is_help=True)
systemd_app = typer.Typer(help="systemd units for the swarl processes.", no_args_is_help=True)


def register(app: typer.Typer) -> None:
    app.add_typer(config_app, name="config")
    app.add_typer(data_app, name="data")
    app.add_typer(systemd_app, name="systemd")


@config_app.callback()
def config_main(ctx: typer.Context, config: ConfigOpt = None, sets: SetOpt = None) -> None:
    """Print the effective config (defaults < YAML < SWARL_* env < --set) as YAML."""
    if ctx.invoked_subcommand is None:
        show_config(config, sets)


@config_app.command("show")
def show_config(config: ConfigOpt = None, sets: SetOpt = None) -> None:
    """Print the effective config (defaults < YAML < SWARL_* env < --set) as YAML."""
    from swarl.config import dump_config

    typer.echo(dump_config(load(config, sets)))


@config_app.command("docs")
def config_docs(
    out: Annotated[str | None, typer.Option("--out", help="Write here (default: stdout).")] = None,
    check: Annotated[bool, typer.Option("--check", help="Exit 1 if --out differs from the generated text.")] = False,
) -> None:
    """Generate the configuration reference (every key, default, env var, meaning) as Markdown."""
    from pathlib import Path

    from swarl.config_docs import render

    text = render()
    if out is None:
        typer.echo(text, nl=False)
        return
    path = Path(out)
    if check:
        if not path.exists() or path.read_text() != text:
            typer.echo(f"swarl: {out} is out of date: run `swarl config docs --out {out}`", err=True)
            raise typer.Exit(1)
        typer.echo(f"{out} is up to date")
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    typer.echo(f"wrote {out}")


@config_app.command("plan")
def config_plan(
    config: ConfigOpt = None,
    sets: SetOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the plan as one JSON object.")] = False,
) -> None:
    """Per-GPU memory of a GPU recipe: the learner's weights, grads, optimizer state and
    activations, the inference servers' weights and KV room. Exit 1 when it does not fit its
    GPUs (each reason printed), 2 when it cannot be planned."""
    from swarl.plan import PlanError, make_plan, render

    cfg = load(config, sets)
    try:
        plan = make_plan(cfg.learner, cfg.actor, cfg.cluster, cfg.pool.max_concurrent,
                         inference_model=cfg.inference.model)
    except PlanError as e:
        typer.echo(f"swarl config plan: {e}", err=True)
        raise typer.Exit(2) from None
    if as_json:
        typer.echo(json.dumps({**plan.model_dump(mode="json"), "fits": plan.fits}))
    else:
        typer.echo(render(plan, cfg.cluster, cfg.learner), nl=False)
    for problem in plan.problems:
        typer.echo(f"swarl config plan: does not fit: {problem}", err=True)
    if not plan.fits:
        raise typer.Exit(1)


@data_app.command("prepare")
def data_prepare(
    source: Annotated[str, typer.Option("--source", help="Hugging Face dataset id (SWE-Gym/SWE-Gym, "
                                        "princeton-nlp/SWE-bench_Verified, SWE-bench/SWE-smith, "
                                        "R2E-Gym/R2E-Gym-Lite, ...), a dataset family (swe-bench, swe-gym, "
                                        "swe-smith, r2e-gym: its usual hub dataset), a local "
                                        ".json/.jsonl/.parquet file, or swarl-tasks (the bundled tasks; "
                                        "--split all|train|heldout).")],
    split: Annotated[str | None, typer.Option("--split", help="Dataset split (default: train for "
                                              "SWE-Gym and local files, test for SWE-bench, all for swarl-tasks).")] = None,
    out: Annotated[str, typer.Option("--out", help="Output directory.")] = "data/prepared",
    max_samples: Annotated[int | None, typer.Option("--max-samples", help="Keep at most N rows "
                                                    "(after validation and filters).")] = None,
    repos: Annotated[list[str] | None, typer.Option("--repo", help="Keep only this repo "
                                                    "(owner/name or name; repeatable).")] = None,
    on_error: Annotated[str, typer.Option("--on-error", help="fail: any invalid row aborts and "
                                          "nothing is written; skip: write the valid rows, list "
                                          "the rest in errors.jsonl.")] = "fail",
    data_source: Annotated[str | None, typer.Option("--data-source", help="metadata.data_source "
                                                    "(default: the dataset id, or the file's stem).")] = None,
    family: Annotated[str | None, typer.Option("--family", help="Dataset family the rows are read as "
                                               "(swe-bench, swe-gym, swe-smith, r2e-gym, swarl, or one "
                                               "added in swe/adapters/). Default: the family that lists "
                                               "the --source dataset id, else each row's dataset_family "
                                               "or shape.")] = None,
) -> None:
    """Validate SWE rows and write <split>.jsonl (prepared JSONL: text + metadata), eval.jsonl,
    instance_ids.txt and docker_images.txt. Last line: a JSON summary."""
    from common.logs import setup_logging
    from swarl.data_prepare import DataError, prepare

    setup_logging("info", "text")
    try:
        res = prepare(source, out, split=split, max_samples=max_samples, repos=repos or (),
                      on_error=on_error, data_source=data_source, family=family)
    except DataError as e:
        typer.echo(f"swarl data prepare: {e}", err=True)
        raise typer.Exit(2) from None
    except OSError as e:
        typer.echo(f"swarl data prepare: {e.strerror}: {e.filename}", err=True)
        raise typer.Exit(2) from None
    for name, path in res.files.items():
        typer.echo(f"{name:<20} {path}")
    typer.echo(json.dumps({"rows_read": res.rows_read, "rows_written": res.rows_written,
                           "filtered_out": res.filtered_out, "errors": res.errors,
                           "split": res.split, "family": res.family, "out": res.out_dir}))


@systemd_app.command("install")
def systemd_install(
    prefix: Annotated[str, typer.Option("--prefix", help="Where unit files go.")] = "/etc/systemd/system",
    user: Annotated[str | None, typer.Option("--user", help="User= of the units (default: the "
                                             "invoking user, $SUDO_USER under sudo).")] = None,
    workdir: Annotated[str | None, typer.Option("--workdir", help="WorkingDirectory= (default: "
                                                "the swarl checkout).")] = None,
    env_file: Annotated[str, typer.Option("--env-file", help="EnvironmentFile= (an example is "
                                          "written there when it does not exist).")] = "/etc/swarl/swarl.env",
    swarl_bin: Annotated[str | None, typer.Option("--swarl", help="The swarl executable (default: "
                                                  "the one next to this Python).")] = None,
    swarl_config: Annotated[str | None, typer.Option("--config", help="SWARL_CONFIG of every unit "
                                                     "(default: SWARL_CONFIG from the env file, "
                                                     "else configs/local.yaml).")] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print the units; write nothing.")] = False,
) -> None:
    """Render the unit templates in configs/systemd/ for this host."""
    from swarl.systemd import install, render_units

    try:
        units = render_units(user=user, workdir=workdir, env_file=env_file, swarl_bin=swarl_bin,
                             config=swarl_config)
    except ValueError as e:
        typer.echo(f"swarl systemd install: {e}", err=True)
        raise typer.Exit(2) from None
    if dry_run:
        for name, text in units.items():
            typer.echo(f"# ---- {name}\n{text}")
        return
    try:
        written = install(units, prefix=prefix, env_file=env_file, workdir=workdir)
    except OSError as e:  # typically: not root for /etc/systemd/system
        typer.echo(f"swarl systemd install: {e.strerror}: {e.filename} (run as root, or pass "
                   "--prefix / --env-file somewhere writable)", err=True)
        raise typer.Exit(2) from None
    for path in written:
        typer.echo(f"wrote {path}")
    typer.echo("next: systemctl daemon-reload && systemctl enable --now swarl-envd swarl-pool "
               "swarl-inference@30000 swarl-actor@0 swarl-learner")
