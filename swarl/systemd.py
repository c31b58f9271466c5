"""Render the systemd unit templates in configs/systemd/ for one host (`swarl systemd install`)."""

from __future__ import annotations

import getpass
import os
import secrets
import shlex
import sys
from pathlib import Path

from swarl.config import CONFIG_DIR, REPO_ROOT

TEMPLATE_DIR = CONFIG_DIR / "systemd"
# unit file name -> template; templated units (name@) take the instance after the @.
UNITS = {
    "swarl-envd.service": "swarl-envd.service.j2",
    "swarl-pool.service": "swarl-pool.service.j2",
    "swarl-inference@.service": "swarl-inference@.service.j2",
    "swarl-actor@.service": "swarl-actor@.service.j2",
    "swarl-learner.service": "swarl-learner.service.j2",
    "swarl-inference-eval@.service": "swarl-inference-eval@.service.j2",
    "swarl-eval-worker.service": "swarl-eval-worker.service.j2",
    "swarl.target": "swarl.target.j2",
}
ENV_TEMPLATE = "swarl.env.j2"


def default_swarl_bin() -> str:
    """The `swarl` console script of the running interpreter's environment (the venv)."""
    return str(Path(sys.executable).parent / "swarl")


def default_user() -> str:
    return os.environ.get("SUDO_USER") or getpass.getuser()


def _env() -> object:
    import jinja2

    from actors.templates import strict_env

    return strict_env(loader=jinja2.FileSystemLoader(str(TEMPLATE_DIR)), keep_trailing_newline=True, trim_blocks=True)


def _check_value(name: str, value: str) -> str:
    # Values land unquoted in unit files: whitespace or newlines would split or inject lines.
    if not value or any(c.isspace() for c in value):
        raise ValueError(f"--{name}: must be non-empty and contain no whitespace, got {value!r}")
    return value


def render_units(
    user: str | None = None,
    workdir: str | None = None,
    env_file: str = "/etc/swarl/swarl.env",
    swarl_bin: str | None = None,
    config: str | None = None,
) -> dict[str, str]:
    """Return {unit file name: text} for this host."""
    ctx = {
        "user": _check_value("user", user or default_user()),
        "workdir": _check_value("workdir", str(Path(workdir or REPO_ROOT).resolve())),
        "env_file": _check_value("env-file", env_file),
        "swarl": _check_value("swarl", swarl_bin or default_swarl_bin()),
        "config": _check_value("config", config) if config else "",
    }
    env = _env()
    return {name: env.get_template(tpl).render(**ctx) for name, tpl in UNITS.items()}  # type: ignore[attr-defined]


def render_env_file(workdir: str | None = None, token: str | None = None) -> str:
    env = _env()
    return env.get_template(ENV_TEMPLATE).render(  # type: ignore[attr-defined]
        workdir=str(Path(workdir or REPO_ROOT).resolve()),
        token=token or secrets.token_urlsafe(32),
        inference_key=secrets.token_urlsafe(32),
    )


def install(units: dict[str, str], prefix: str, env_file: str, workdir: str | None = None) -> list[Path]:
    """Write the units under `prefix`, and an example env file (0600, fresh token) if absent."""
    out = Path(prefix)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in units.items():
        path = out / name
        path.write_text(text)
        path.chmod(0o644)
        written.append(path)
    env_path = Path(env_file)
    if not env_path.exists():
        env_path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(env_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(render_env_file(workdir))
        written.append(env_path)
    return written


def exec_start_commands(unit_text: str) -> list[list[str]]:
    """The swarl subcommand path of each ExecStart= line: `.../swarl inference serve --set x`
    → ["inference", "serve"] (words after the executable up to the first option)."""
    out = []
    for line in unit_text.splitlines():
        if not line.startswith("ExecStart="):
            continue
        argv = shlex.split(line[len("ExecStart="):].lstrip("-@:+!"))
        words = []
        for a in argv[1:]:
            if a.startswith("-"):
                break
            words.append(a)
        out.append(words)
    return out
