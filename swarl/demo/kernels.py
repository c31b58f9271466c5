"""The demo's CPU float kernels, pinned so that a warm start is the same model on every x86
machine with AVX2.

torch picks its vectorised kernels by the CPU (AVX-512, AVX2 or none) and MKL its code path
likewise; a sum over other vector widths rounds in another order. Twenty warm-start steps already
differ in the weights (by ~1e-5), and the 1,200 steps of the warm start grow that into another
policy: the same seed and code gave a different warm start on another machine (docs/demo.md
"Same seed, another machine"). Pinned, the warm start and every evaluation of it depend on the
code, the seed and the thread counts (set by the config, not by the machine's cores) alone. On a
machine with AVX-512 this costs that machine's wider kernels.
"""

from __future__ import annotations

import os
import platform

# torch's ATen kernels (its own dispatch, read at the process's first tensor op) and MKL's
# Conditional Numerical Reproducibility branch (read at its first call)
PINS = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "AVX2"}


def pin() -> None:
    """Set each pin the environment does not set already (an operator's own value wins), in this
    process before its first tensor op and, through the environment, in every process it starts.
    Not on other architectures (no AVX2 there, nor MKL); in_force() says what is in force."""
    if platform.machine().lower() in ("x86_64", "amd64"):
        for key, value in PINS.items():
            os.environ.setdefault(key, value)


def in_force() -> dict[str, str]:
    """The kernels this process uses: torch's capability as it resolved it (a CPU without AVX2
    falls back to what it has) and MKL's branch as set (`auto`: not pinned)."""
    import torch

    return {"aten": torch.backends.cpu.get_cpu_capability(), "mkl_cbwr": os.environ.get("MKL_CBWR", "auto")}
