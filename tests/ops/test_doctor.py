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


def test_gpu_machines_are_judged_by_what_they_have():
    """check() on the report of machines this one is not: the reasons a GPU machine gives."""
    from swarl.config import load_config
    from swarl.doctor import check, machine

    cfg = load_config(GPU / "qwen3-8b.yaml", environ={})
    here = machine()

    def gpu_machine(n: int, name: str = "NVIDIA H100 80GB HBM3", gib: float = 79.6, bf16: bool = True,
                    nccl: bool = True, te: str | None = "2.11.0") -> dict:
        devices = [{"index": i, "name": name, "memory_gib": gib, "capability": "9.0", "bf16": bf16}
                   for i in range(n)]
        return {**here, "cuda": True, "torch_cuda": "13.0", "devices": devices,
                "nccl": {"available": nccl, "version": "2.28.3" if nccl else None},
                "transformer_engine": {**here["transformer_engine"], "version": te,
                                       "found": "importable" if te else "not installed"},
                "layer_spec": "transformer_engine" if te else "local"}

    assert check(cfg, gpu_machine(8), "learner") == ([], [])
    problems, warnings = check(cfg, gpu_machine(8, te=None), "learner")
    assert problems == [] and "no TransformerEngine" in warnings[0]  # runs, on the local spec
    problems, _ = check(cfg, gpu_machine(1, name="Tesla V100", gib=31.7, bf16=False, nccl=False), "learner")
    text = "\n".join(problems)
    assert "Tesla V100 cannot compute in bf16" in text
    assert "learner.tensor_parallel=2 needs that many GPUs on one node; 1 visible" in text
    assert "cluster.gpus_per_node=8" in text and "Tesla V100 has 31.7 GiB" in text
    assert "NCCL is not available" in text
    problems, _ = check(cfg, gpu_machine(8, te="2.12.0"), "learner")
    assert problems and "outside" in problems[0]
    sglang_there = {**gpu_machine(8), "sglang": {"version": "0.5.22", "pin": "==0.5.23"}}
    problems, _ = check(cfg, sglang_there, "inference")
    assert problems == ["sglang 0.5.22 is not swarl's pin sglang==0.5.23: the client's routes and "
                        "request bodies are checked against the pinned release"]
