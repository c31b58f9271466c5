"""The GPU check (benchmarks/gpu_check.py) runs here on CPU with the tiny model, so it cannot rot
between the sessions that are lent a GPU.

It runs as it will meet the GPU machine: `python -S` (no site-packages) over a folder that holds
only what that machine's image was probed to have (gpu_check.DEVICE_IMAGE, with what those
require), plus the packages `make gpu-wheels` carries (gpu_check.WHEELS). An import the script
gains that is neither fails here. Without transformers (or PyYAML) the script prints one JSON line
naming what is missing, and no traceback; without a C compiler it turns torch.compile off and says so.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib.metadata import PackageNotFoundError, distribution
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "gpu_check.py"
sys.path.insert(0, str(ROOT / "benchmarks"))

import gpu_check  # noqa: E402


def _requirements(name: str, seen: set[str]) -> None:
    """`name` and everything it requires (extras left out), by distribution name."""
    key = name.lower().replace("_", "-")
    if key in seen:
        return
    try:
        dist = distribution(name)
    except PackageNotFoundError:
        return  # an optional requirement absent here is absent there too
    seen.add(key)
    for spec in dist.requires or []:
        req = Requirement(spec)
        if req.marker is None or req.marker.evaluate({"extra": ""}):
            _requirements(req.name, seen)


def bare_site(into: Path, without: tuple[str, ...] = ()) -> Path:
    """A folder of links to the files of DEVICE_IMAGE's closure and of gpu_check.WHEELS (not
    theirs), less the distributions `without`."""
    names: set[str] = set()
    for b in gpu_check.DEVICE_IMAGE:
        _requirements(b, names)
    names |= {w.lower() for w in gpu_check.WHEELS}
    names -= {w.lower() for w in without}
    into.mkdir()
    for name in sorted(names):
        dist = distribution(name)
        base = Path(str(dist.locate_file("")))
        tops = {Path(str(f)).parts[0] for f in dist.files or []}
        for top in tops - {"..", "__pycache__"}:
            src, dst = base / top, into / top
            if src.exists() and not dst.exists():
                dst.symlink_to(src)
    return into


def run_check(tmp_path: Path, *args: str, timeout: float = 150, without: tuple[str, ...] = (),
              env: dict[str, str] | None = None) -> tuple[subprocess.CompletedProcess[str], dict]:
    site = bare_site(tmp_path / "site", without)
    env = {**os.environ, "PYTHONPATH": str(site), "PYTHONUNBUFFERED": "1", **(env or {})}
    proc = subprocess.run([sys.executable, "-S", str(SCRIPT), "--device", "cpu", "--tiny", *args],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=timeout)
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 1, f"stdout is not one line:\n{proc.stdout}\nstderr:\n{proc.stderr[-4000:]}"
    return proc, json.loads(lines[0])


@pytest.mark.slow
def test_gpu_check_passes_on_cpu_with_the_tiny_model(tmp_path: Path) -> None:
    out = tmp_path / "check.json"
    proc, line = run_check(tmp_path, "--dtype", "bf16", "--threads", "1", "--out", str(out))
    assert proc.returncode == 0 and line["ok"], (json.dumps(line["checks"], indent=1), proc.stderr[-4000:])
    assert json.loads(out.read_text()) == line
    c = line["checks"]
    assert set(c) == set(gpu_check.CHECKS)
    assert c["weight_sync_nccl"] == {"ok": True, "skipped": "NCCL needs CUDA"}
    assert line["compiler"]["torch_compile"] == "on" and line["compiler"]["python_h"]
    assert line["device"] == "cpu" and line["dtype"] == "bf16" and line["megatron_core"]
    hf = c["hf_logprobs"]
    assert 0 < hf["max_abs_diff"] <= hf["tolerance"]["max"] and hf["hf_bf16_vs_fp32"]["tokens"] == hf["tokens"]
    assert len(c["train"]["loss"]) == gpu_check.SIZES["tiny"]["steps"] + 1
    mem = c["recompute_memory"]
    assert 0 < mem["full"]["peak_bytes"] < mem["none"]["peak_bytes"] and mem["full_over_none"] < 1
    pe = c["publish_engine"]
    assert pe["untrained_publish_equals_checkpoint"] and not pe["engine_unequal"] and pe["generated"] > 0
    assert c["throughput"]["tokens_per_s"] > 0 and c["throughput"]["mfu"] is None  # no peak on CPU
    assert line["wall_s"] < 120  # ~10 s on an idle 2-core machine; a loaded one is slower


def test_a_run_past_its_deadline_still_reports_and_fails(tmp_path: Path) -> None:
    proc, line = run_check(tmp_path, "--deadline-s", "1", timeout=60)
    assert proc.returncode == 1
    assert not line["ok"] and "deadline" in line["checks"]["hf_logprobs"]["error"]


def test_bad_arguments_exit_2(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, str(SCRIPT), "--device", "cpu", "--tiny", "--set", "packing"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "--set 'packing': expected key=value" in proc.stderr


@pytest.mark.slow
def test_a_failed_check_fails_the_run(tmp_path: Path) -> None:
    """lr 0: the steps run but no weight moves, so `train` fails and so does the run."""
    proc, line = run_check(tmp_path, "--threads", "1", "--set", "lr=0")
    assert proc.returncode == 1 and not line["ok"]
    assert not line["checks"]["train"]["ok"] and line["checks"]["train"]["matrices_changed"].startswith("0/")
    assert line["checks"]["hf_logprobs"]["ok"] and line["checks"]["publish_engine"]["ok"]


@pytest.mark.parametrize(("lacking", "module"), [("transformers", "transformers"), ("PyYAML", "yaml")])
def test_a_missing_import_is_one_json_line_naming_it(tmp_path: Path, lacking: str, module: str) -> None:
    # and no C compiler: torch.compile is turned off before torch is imported, and the line says so
    out = tmp_path / "check.json"
    proc, line = run_check(tmp_path, "--out", str(out), without=(lacking,), env={"CC": "/nonexistent/cc"},
                           timeout=120)
    assert proc.returncode == 1 and not line["ok"]
    assert module in line["missing"] and line["missing"][module].startswith(lacking)
    assert line["error"].startswith("missing imports: ") and module in line["error"]
    assert "Traceback" not in proc.stdout + proc.stderr
    assert set(line["checks"]) == set(gpu_check.CHECKS) and not any(c["ok"] for c in line["checks"].values())
    assert gpu_check.WHEELS_DIR in line["install"]
    assert line["compiler"]["cc"] is None and line["compiler"]["torch_compile"].startswith("off (TORCHDYNAMO_DISABLE=1)")
    assert json.loads(out.read_text()) == line


def test_what_the_check_imports_is_in_the_image_or_carried() -> None:
    """IMPORTS names a distribution the device image has or WHEELS carries, for every module."""
    known = {d.lower().replace("_", "-") for d in (*gpu_check.DEVICE_IMAGE, *gpu_check.WHEELS)}
    assert {d.lower().replace("_", "-") for d in gpu_check.IMPORTS.values()} <= known
