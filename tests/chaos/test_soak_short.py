"""The short version of benchmarks/soak.py (the 10-minute run is recorded in
benchmarks/RESULTS.md): a few containers doing mixed exec, then nothing leaked."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.docker, pytest.mark.slow]
REPO = Path(__file__).resolve().parents[2]


def test_soak_short_leaks_nothing(docker_url):
    env = {**os.environ, "DOCKER_HOST": docker_url,
           "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "benchmarks"), os.environ.get("PYTHONPATH", "")])}
    p = subprocess.run([sys.executable, str(REPO / "benchmarks" / "soak.py"), "--duration-s", "20",
                        "--containers", "4", "--no-record"], env=env, capture_output=True, text=True,
                       timeout=240)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    summary = json.loads(p.stdout.strip().splitlines()[-1])
    assert summary["leaked_containers"] == 0 and summary["envd_containers_at_end"] == 0, summary
    assert summary["errors"] == 0, p.stdout[-3000:]
    assert summary["execs"] > 0 and summary["containers_created"] >= 4, summary
    assert {"exec_p95_ms", "envd_rss_growth_mb"} <= set(summary)
