"""benchmarks/demo_cpu_split.py: each long-lived process of a demo is counted under its role, the
Docker engine's under the engine, and nothing else (container processes are the containers'
cgroup's; an unknown process is the rest's)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from demo_cpu_split import role


def test_roles() -> None:
    venv = "/work/main/.venv/bin/python3 /work/main/.venv/bin/swarl"
    assert role(f"{venv} learner -c runs/x/config.yaml") == "learner"
    assert role(f"{venv} inference serve --model m --port 1") == "inference servers"
    assert role(f"{venv} actor -c c --concurrency 3") == "actors"
    assert role(f"{venv} envd serve --port 2") == "envd"
    assert role(f"{venv} pool serve --port 3") == "pool"
    assert role(".venv/bin/swarl demo --seed 1") == "demo (supervisor)"
    assert role("/usr/sbin/dockerd --storage-driver=overlay2") == "docker engine"
    assert role("/usr/bin/containerd-shim-runc-v2 -namespace moby -id 5c06") == "docker engine"
    assert role("containerd --config x.toml") == "docker engine"
    # inside a container (the referee, the tests it runs) or unknown: not a role
    assert role("/usr/bin/python3 -I -S /tmp/swarl-7e16/referee.py /tmp/swarl-7e16") is None
    assert role("runc --root /var/lib/swarl-docker/exec/runtime-runc/moby") is None
    assert role("") is None
