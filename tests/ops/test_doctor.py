"""`swarl doctor` as an operator runs it (a real subprocess of the CLI) on this machine, which
has no CUDA, no NCCL, no TransformerEngine and no sglang: the report says so, and a GPU recipe is
refused with every reason, a CPU config is not."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
GPU = ROOT / "configs" / "gpu"


def doctor(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "swarl.cli", "doctor", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)


def test_report_names_what_this_machine_gives():
    res = doctor("--json")
    assert res.returncode == 0, res.stderr
    m = json.loads(res.stdout)["machine"]
    assert m["cuda"] is False and m["devices"] == []
    assert m["nccl"] == {"available": False, "version": None}
    assert m["transformer_engine"]["version"] is None and m["transformer_engine"]["found"] == "not installed"
    assert m["layer_spec"] == "local" and "apply_rope_fusion" in m["fusions_off"]
    assert m["megatron_core"] == {"version": "0.16.1", "pin": "==0.16.1", "floor": "0.15.0", "problem": None}
    assert m["sglang"]["version"] is None and m["sglang"]["pin"] == "==0.5.23"


def test_gpu_recipe_is_refused_with_each_reason():
    res = doctor("--config", str(GPU / "qwen3-8b.yaml"))
    assert res.returncode == 1
    assert "CANNOT RUN here" in res.stdout
    for word in ("NCCL", "not available", "TransformerEngine", "layer spec", "local", "attention",
                 "megatron-core", "0.16.1", "sglang", "==0.5.23"):  # the report comes first
        assert word in res.stdout
    reasons = [line for line in res.stderr.splitlines() if line.startswith("swarl doctor: cannot run: ")]
    text = "\n".join(reasons)
    assert "learner.dtype=bf16 is a GPU recipe" in text and "without CUDA" in text
    assert "learner.tensor_parallel=2 needs that many GPUs on one node; 0 visible" in text
    assert "cluster.gpus_per_node=8" in text
    assert "weight_sync.backend=nccl" in text and "NCCL is not available" in text
    assert len(reasons) == 4
    data = json.loads(doctor("--config", str(GPU / "qwen3-8b.yaml"), "--json").stdout)
    assert not data["ok"] and [f"swarl doctor: cannot run: {p}" for p in data["problems"]] == reasons


def test_inference_role_needs_sglang_and_cuda():
    res = doctor("--config", str(GPU / "qwen3-32b.yaml"), "--role", "inference")
    assert res.returncode == 1
    assert "sglang is not installed" in res.stderr and "sglang==0.5.23" in res.stderr
    assert "SGLang serves on CUDA GPUs" in res.stderr


def test_cpu_config_can_run():
    """The local config with its learner on the megatron backend in fp32, as the tests run it."""
    res = doctor("--config", str(ROOT / "configs" / "local.yaml"), "--set", "learner.backend=megatron")
    assert res.returncode == 0, res.stderr
    assert "can run here" in res.stdout and res.stderr.count("cannot run") == 0


def test_bad_role_is_exit_2():
    res = doctor("--config", str(ROOT / "configs" / "local.yaml"), "--role", "actor")
    assert res.returncode == 2 and "learner or inference" in res.stderr
