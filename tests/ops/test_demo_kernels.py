"""The demo pins torch's and MKL's CPU kernels (swarl/demo/kernels.py): a process that pins them
before its first tensor op runs torch's AVX2 kernels on any CPU that has them, and the processes
it starts inherit the pin; an operator's own setting wins. The pin matters: other kernels round a
sum in another order."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from swarl.demo import kernels

HAS_AVX2 = "avx2" in Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else False

# pins (or not), then reports the kernels in force, its own child's, and a float32 sum's bits
PROBE = """
import json, subprocess, sys
from swarl.demo import kernels
if sys.argv[1] == "pin":
    kernels.pin()
import torch
torch.manual_seed(0)
torch.set_num_threads(1)
child = subprocess.run([sys.executable, "-c", "import json; from swarl.demo import kernels; "
                        "print(json.dumps(kernels.in_force()))"], capture_output=True, text=True, check=True)
print(json.dumps({"self": kernels.in_force(), "child": json.loads(child.stdout),
                  "sum": torch.randn(100003).sum().item()}))
"""


def probe(mode: str, **env: str) -> dict:
    clean = {k: v for k, v in os.environ.items() if k not in kernels.PINS}
    out = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, timeout=120,
                         env={**clean, **env}, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not HAS_AVX2, reason="the pin is AVX2: this CPU has no AVX2")
def test_pinned_kernels_are_avx2_here_and_in_children_and_change_the_floats() -> None:
    pinned = probe("pin")
    assert pinned["self"] == {"aten": "AVX2", "mkl_cbwr": "AVX2"}
    assert pinned["child"] == pinned["self"]  # the demo's servers and learner run the same kernels
    # an operator's own value wins over the pin, and other kernels give other floats
    scalar = probe("pin", ATEN_CPU_CAPABILITY="default")
    assert scalar["self"]["aten"] == "DEFAULT" and scalar["child"]["aten"] == "DEFAULT"
    assert scalar["sum"] != pinned["sum"]
    # the same pinned run again: the same bits
    assert probe("pin")["sum"] == pinned["sum"]


def test_unpinned_reports_mkl_auto() -> None:
    assert probe("none")["self"]["mkl_cbwr"] == "auto"
