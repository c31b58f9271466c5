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


# -- weight_sync_nccl: the probe's process, as the check meets it --------------------------------
def _fake_probe(body: str) -> list[str]:
    return [sys.executable, "-c", f"import json, sys, time\n{body}"]


def test_a_probe_that_hangs_is_killed_and_says_which_stage_it_reached() -> None:
    partial = {"ok": False, "stage": "absent_peer_teardown", "thread_ended": True}
    found = gpu_check.run_nccl_probe(2, _fake_probe(
        f"print('[nccl_probe 1.0s] absent_peer_teardown ' + json.dumps({partial!r}), file=sys.stderr, flush=True)\n"
        "time.sleep(60)"))
    assert found["ok"] is False and found["exit"] is None and found["thread_ended"] is True
    assert found["stage"] == "absent_peer_teardown" and "killed at 2 s in stage 'absent_peer_teardown'" in found["error"]
    assert "absent_peer_teardown" in found["stderr_tail"]


def test_a_probe_that_crashes_reports_its_stderr_and_one_that_passes_does_not() -> None:
    found = gpu_check.run_nccl_probe(20, _fake_probe("raise SystemExit('no CUDA here')"))
    assert found == {"exit": 1, "ok": False, "error": "probe exit 1 in stage 'start'", "stderr_tail": "no CUDA here\n"}
    found = gpu_check.run_nccl_probe(20, _fake_probe("print(json.dumps({'ok': True, 'stage': 'done'}))"))
    assert found == {"ok": True, "stage": "done", "exit": 0}


def test_a_stuck_probe_prints_its_stage_and_every_thread_stack() -> None:
    cmd = [sys.executable, "-c", f"import sys, time; sys.path.insert(0, {str(ROOT / 'benchmarks')!r}); "
           "import gpu_check; gpu_check._probe_watchdog({'ok': False, 'stage': 'absent_peer_break'}, 0.5); "
           "time.sleep(60)"]
    found = gpu_check.run_nccl_probe(30, cmd)
    assert found["exit"] == 3 and found["ok"] is False and found["stage"] == "absent_peer_break"
    assert found["error"] == "stuck in stage 'absent_peer_break' at 0.5 s"
    assert "every thread's stack" in found["stderr_tail"] and "time.sleep" not in found["error"]
    assert 'File "<string>"' in found["stderr_tail"]  # the main thread's frame, where it sat


def test_the_probe_runs_its_stages_on_cpu_stand_ins(monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    """The probe's own logic, without NCCL: a stand-in group whose set-up holds a lock until its
    own timeout (bound + 1 s) as torch's does, and whose abort() needs that lock."""
    import threading
    import time

    import torch

    from weight_sync import update_group

    class StandIn:
        def __init__(self, world: int) -> None:
            self.world, self.lock, self.aborted = world, threading.Lock(), False

        def broadcast(self) -> None:
            if self.world > 1:  # the peer never joins
                with self.lock:
                    time.sleep(2.0)
                raise RuntimeError("NCCL timeout in: NCCLUtils.cpp (stand-in)")

        def abort(self) -> None:
            with self.lock:
                self.aborted = True

    made: list[StandIn] = []
    destroyed: list[StandIn] = []

    def make(_backend: str, _init: str, world: int, *_a: object) -> StandIn:
        made.append(StandIn(world))
        return made[-1]

    monkeypatch.setenv(update_group.NONBLOCKING_TIMEOUT_ENV, "1")
    monkeypatch.delenv(update_group.NONBLOCKING_TIMEOUT_ENV)
    monkeypatch.setattr(update_group, "init_custom_process_group", make)
    monkeypatch.setattr(update_group, "destroy_process_group", destroyed.append)
    monkeypatch.setattr(update_group.UpdateGroup, "_broadcast", lambda self, _t: self.pg.broadcast())
    monkeypatch.setattr(torch.cuda.nccl, "version", lambda: (2, 28, 9))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *_a: "stand-in")
    out = gpu_check.nccl_probe(bound_s=1.0, deadline_s=60, device="cpu")
    assert out["ok"], out
    assert out["nonblocking_timeout"] == 1 and out["nonblocking_timeout_env_before"] is None
    assert out["waits_for_the_absent_peer"] and out["break_returned_s"] < 0.5
    assert out["thread_ended"] and "NCCL timeout" in out["thread_error"] and out["teardown_done"]
    assert [g.world for g in made] == [1, 2, 1] and destroyed == made and made[1].aborted
    assert out["one_rank_bucket_completed"] and out["next_group_bucket_completed"]
    stages = [line.split()[2] for line in capsys.readouterr().err.splitlines() if line.startswith("[nccl_probe")]
    assert stages == ["imports", "nccl_setup_bound", "cuda", "one_rank_group", "one_rank_bucket", "one_rank_close",
                      "absent_peer_group", "absent_peer_setup_waits", "absent_peer_break", "absent_peer_thread_ends",
                      "absent_peer_teardown", "next_group_group", "next_group_bucket", "next_group_close", "done"]
