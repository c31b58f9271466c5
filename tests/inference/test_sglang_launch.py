"""`swarl inference launch-sglang`: the SGLang command line, and the supervisor that registers
the server it starts (exercised with the scripted server standing in for SGLang)."""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from broker.registry import PolicyRegistry, ServerMeta, ServerRegistry
from common.procs import terminate
from common.services import free_port
from inference.client import SGLangClient
from inference.sglang_launch import SGLangLaunch, build_command

REPO = Path(__file__).resolve().parents[2]


def test_command_has_the_flags_swarl_needs():
    cmd = build_command(SGLangLaunch(model="/models/qwen", port=31000, host="0.0.0.0", tp_size=4,
                                     weight_version="12", mem_fraction=0.7, api_key="k", base_gpu_id=4,
                                     python="python"))
    assert cmd[:3] == ["python", "-m", "sglang.launch_server"]
    pairs = dict(zip(cmd[3::2], cmd[4::2], strict=True))
    assert pairs == {"--model-path": "/models/qwen", "--host": "0.0.0.0", "--port": "31000",
                     "--tp-size": "4", "--weight-version": "12", "--mem-fraction-static": "0.7",
                     "--base-gpu-id": "4", "--api-key": "k"}
    minimal = build_command(SGLangLaunch(model="m", python="python"))
    assert "--mem-fraction-static" not in minimal and "--api-key" not in minimal
    with pytest.raises(ValueError, match="--tp-size"):
        build_command(SGLangLaunch(model="m", tp_size=0))
    with pytest.raises(ValueError, match="mem-fraction"):
        build_command(SGLangLaunch(model="m", mem_fraction=1.5))


@pytest.mark.parametrize(("extra", "named"), [
    (["--pp-size", "2"], "--pp-size 2"), (["--pipeline-parallel-size=4"], "--pipeline-parallel-size 4"),
    (["--dp-size", "2"], "--dp-size 2"), (["--data-parallel-size=2"], "--data-parallel-size 2"),
    (["--tp-size", "2"], "--tp-size"), (["--tensor-parallel-size=2"], "--tensor-parallel-size"),
    (["--weight-version", "3"], "--weight-version"), (["--model", "/other"], "--model"),
])
def test_extra_flags_the_weight_update_group_cannot_serve_are_refused_by_name(extra, named):
    with pytest.raises(ValueError, match=f"extra argument {named}"):
        build_command(SGLangLaunch(model="m", python="python", extra=["--log-level", "info", *extra]))
    # a size of 1 is what the group serves; other flags pass through untouched
    ok = build_command(SGLangLaunch(model="m", python="python",
                                    extra=["--pp-size", "1", "--dp-size=1", "--enable-metrics"]))
    assert ok[-4:] == ["--pp-size", "1", "--dp-size=1", "--enable-metrics"]


def test_cli_refuses_a_pipeline_parallel_extra_naming_the_flag():
    bad = subprocess.run([sys.executable, "-m", "swarl.cli", "inference", "launch-sglang", "--model", "/m",
                          "--extra=--pp-size", "--extra=2"], capture_output=True, text=True, cwd=REPO,
                         timeout=120, env={"PATH": "/usr/bin:/bin", "HOME": "/tmp"})
    assert bad.returncode == 2, bad.stdout
    assert "extra argument --pp-size 2: swarl's weight-update group cannot serve it" in bad.stderr


@pytest.mark.parametrize("flag", ["--tp-size", "--tp"])
def test_cli_prints_the_command_and_hides_the_key(flag):
    res = subprocess.run([sys.executable, "-m", "swarl.cli", "inference", "launch-sglang", "--model", "/m", "--port",
                          "30001", flag, "2", "--weight-version", "5", "--mem-fraction", "0.8",
                          "--api-key", "secret-key"], capture_output=True, text=True, cwd=REPO, timeout=120,
                         env={"PATH": "/usr/bin:/bin", "HOME": "/tmp"})
    assert res.returncode == 0, res.stderr
    out = res.stdout.strip()
    assert "-m sglang.launch_server --model-path /m --host 127.0.0.1 --port 30001 --tp-size 2" in out
    assert "--weight-version 5 --mem-fraction-static 0.8 --api-key '***'" in out
    assert "secret-key" not in out
    bad = subprocess.run([sys.executable, "-m", "swarl.cli", "inference", "launch-sglang", "--model", "/m",
                          flag, "0"], capture_output=True, text=True, cwd=REPO, timeout=120,
                         env={"PATH": "/usr/bin:/bin", "HOME": "/tmp"})
    assert bad.returncode == 2 and "--tp-size must be at least 1, got 0" in bad.stderr


def test_serve_refuses_to_start_without_an_api_key(tiny_model_dir):
    res = subprocess.run([sys.executable, "-m", "swarl.cli", "inference", "serve", "--model", str(tiny_model_dir)],
                         capture_output=True, text=True, cwd=REPO, timeout=120,
                         env={"PATH": "/usr/bin:/bin", "HOME": "/tmp"})
    assert res.returncode == 2 and "API key is required" in res.stderr


# run_and_register with a scripted server in SGLang's place (same /health, /model_info)
SUPERVISOR = """
import os, sys
from broker.keys import Keys
from common.logs import setup_logging
from inference.sglang_launch import SGLangLaunch, run_and_register
setup_logging()
port, redis_url, prefix, run, tokenizer, tasks = sys.argv[1:7]
spec = SGLangLaunch(model="/models/stand-in", port=int(port), api_key=os.environ["SWARL_INFERENCE_API_KEY"],
                    tp_size=2)
cmd = [sys.executable, "-m", "swarl.cli", "scripted-policy", "serve", "--tokenizer", tokenizer,
       "--port", port, "--tasks", tasks, "--weight-version", "3"]
sys.exit(run_and_register(spec, cmd, redis_url, Keys(prefix=prefix, run=run), server_id="sgl-a",
                          heartbeat_s=0.5, start_timeout_s=150))
"""


async def test_supervisor_registers_the_server_with_its_tp_size_and_leaves(tiny_model_dir, redis_url, aredis,
                                                                           keys, tmp_path):
    servers, policy = ServerRegistry(aredis, keys), PolicyRegistry(aredis, keys)
    await policy.publish(3, {"path": "/nowhere", "format": "hf"})
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps({"instance_id": "sgl__t-1", "problem_statement": "[sgl] nothing"}) + "\n")
    port, key = free_port(), secrets.token_hex(8)
    log = tmp_path / "supervisor.log"
    proc = _start_supervisor([str(port), redis_url, keys.prefix, keys.run, str(tiny_model_dir), str(tasks)],
                             key, log)
    try:
        deadline = time.monotonic() + 150
        while (s := await servers.get("sgl-a")) is None:
            assert proc.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            await asyncio.sleep(0.2)
        assert (s.url, s.state, s.version) == (f"http://127.0.0.1:{port}", "ready", 3)
        assert s.meta == ServerMeta(kind="sglang", model="/models/stand-in", tp_size=2)
        async with SGLangClient(s.url, api_key=key) as c:  # the version SGLang reports is heartbeated
            await c.update_weight_version("4")
        for _ in range(100):
            if (await servers.get("sgl-a")).version == 4:
                break
            await asyncio.sleep(0.1)
        assert (await servers.get("sgl-a")).version == 4
        proc.send_signal(signal.SIGTERM)  # forwarded to the server; the entry goes when it exits
        await asyncio.to_thread(proc.wait, 30)
        assert await servers.get("sgl-a") is None, log.read_text()
    finally:
        await asyncio.to_thread(terminate, proc, 10, True)


def _start_supervisor(args: list[str], key: str, log: Path) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SWARL_")}
    env |= {"SWARL_INFERENCE_API_KEY": key, "TOKENIZERS_PARALLELISM": "false"}
    with open(log, "wb") as logf:
        return subprocess.Popen([sys.executable, "-c", SUPERVISOR, *args], cwd=REPO, env=env, stdout=logf,
                                stderr=subprocess.STDOUT, start_new_session=True)
