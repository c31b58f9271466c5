#!/usr/bin/env bash
# Idempotent set-up for a fresh Debian machine: system packages, the .venv, swarl itself.
# Called by `make demo` and `make test`; safe to run again (each step checks first).
set -euo pipefail
cd "$(dirname "$0")/.."

need_pkgs=()
command -v redis-server >/dev/null || need_pkgs+=(redis-server)
command -v dockerd >/dev/null || need_pkgs+=(docker.io)
command -v debootstrap >/dev/null || need_pkgs+=(debootstrap)
command -v git >/dev/null || need_pkgs+=(git)
command -v docker-registry >/dev/null || need_pkgs+=(docker-registry)  # the image tests' registry
if [ ${#need_pkgs[@]} -gt 0 ]; then
  echo "[setup] apt-get install ${need_pkgs[*]}"
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_pkgs[@]}" >/dev/null
fi

PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  echo "[setup] creating .venv"
  "$PY" -m venv .venv
fi
stamp=.venv/.swarl-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  echo "[setup] installing swarl into .venv (torch 2.13.0 CPU build first)"
  .venv/bin/pip install -q --upgrade pip
  # The local CPU build; installed first so no dependency drags in a CUDA build.
  .venv/bin/pip install -q "torch==2.13.0"
  .venv/bin/pip install -q -e ".[dev]"
  touch "$stamp"
fi
echo "[setup] ready: .venv/bin/swarl"
