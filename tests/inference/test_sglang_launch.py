from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from inference.sglang_launch import SGLangLaunch, build_command

REPO = Path(__file__).resolve().parents[2]


def test_command_has_the_flags_swarl_needs():
    cmd = build_command(SGLangLaunch(model="/models/qwen", port=31000, host="0.0.0.0", tp=4,
                                     weight_version="12", mem_fraction=0.7, api_key="k", base_gpu_id=4,
                                     python="python"))
    assert cmd[:3] == ["python", "-m", "sglang.launch_server"]
    pairs = dict(zip(cmd[3::2], cmd[4::2], strict=True))
    assert pairs == {"--model-path": "/models/qwen", "--host": "0.0.0.0", "--port": "31000",
                     "--tp-size": "4", "--weight-version": "12", "--mem-fraction-static": "0.7",
                     "--base-gpu-id": "4", "--api-key": "k"}
    minimal = build_command(SGLangLaunch(model="m", python="python"))
    assert "--mem-fraction-static" not in minimal and "--api-key" not in minimal
    with pytest.raises(ValueError, match="tp"):
        build_command(SGLangLaunch(model="m", tp=0))
    with pytest.raises(ValueError, match="mem-fraction"):
        build_command(SGLangLaunch(model="m", mem_fraction=1.5))


def test_cli_prints_the_command_and_hides_the_key():
    res = subprocess.run([sys.executable, "-m", "swarl.cli", "inference", "launch-sglang", "--model", "/m", "--port",
                          "30001", "--tp", "2", "--weight-version", "5", "--mem-fraction", "0.8",
                          "--api-key", "secret-key"], capture_output=True, text=True, cwd=REPO, timeout=120,
                         env={"PATH": "/usr/bin:/bin", "HOME": "/tmp"})
    assert res.returncode == 0, res.stderr
    out = res.stdout.strip()
    assert "-m sglang.launch_server --model-path /m --host 127.0.0.1 --port 30001 --tp-size 2" in out
    assert "--weight-version 5 --mem-fraction-static 0.8 --api-key '***'" in out
    assert "secret-key" not in out


def test_serve_refuses_to_start_without_an_api_key(tiny_model_dir):
    res = subprocess.run([sys.executable, "-m", "swarl.cli", "inference", "serve", "--model", str(tiny_model_dir)],
                         capture_output=True, text=True, cwd=REPO, timeout=120,
                         env={"PATH": "/usr/bin:/bin", "HOME": "/tmp"})
    assert res.returncode == 2 and "API key is required" in res.stderr
