"""Start `swarl inference serve` (or `swarl scripted-policy serve`) as a subprocess on a free
loopback port and wait for it: used by the test fixtures and the benchmarks (nothing here runs
at import)."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from common.procs import Child
from common.services import free_port

REPO = Path(__file__).resolve().parent.parent
START_TIMEOUT_S = 180.0  # a loaded 2-core machine imports torch + transformers slowly


@dataclass
class CpuServerHandle(Child):
    """`swarl inference serve` on loopback; stop() is SIGTERM (it drains and deregisters)."""

    url: str = ""
    api_key: str = ""
    server_id: str = ""
    port: int = 0


def start_cpu_server(model_dir: str | os.PathLike, weight_version: str = "0", redis_url: str | None = None,
                     run_id: str = "test", api_key: str | None = None, threads: int = 1,
                     prefix: str = "swarl", tp_size: int = 1,
                     server_id: str | None = None, extra_args: list[str] | None = None,
                     log_dir: str | os.PathLike | None = None, drain_timeout_s: float = 5.0) -> CpuServerHandle:
    """Start `swarl inference serve` and wait until /health answers 200."""
    args = ["inference", "serve", "--model", str(model_dir), "--host", "127.0.0.1",
            "--weight-version", str(weight_version), "--threads", str(threads), "--tp-size", str(tp_size),
            # short drain so teardown is quick even when a test left a pin behind
            "--set", f"inference.drain_timeout_s={drain_timeout_s}"]
    return _start("CPU server", args, redis_url, run_id, prefix, api_key, server_id, extra_args, log_dir,
                  {"OMP_NUM_THREADS": str(threads)})


def start_scripted_server(tokenizer_dir: str | os.PathLike, rows: Sequence[dict[str, Any]], mode: str = "fix",
                          weight_version: str = "0", redis_url: str | None = None, run_id: str = "test",
                          api_key: str | None = None, prefix: str = "swarl", server_id: str | None = None,
                          extra_args: list[str] | None = None,
                          log_dir: str | os.PathLike | None = None) -> CpuServerHandle:
    """Start `swarl scripted-policy serve` answering for `rows` and wait until /health answers 200."""
    d = Path(log_dir or tempfile.mkdtemp(prefix="swarl-scripted-"))
    d.mkdir(parents=True, exist_ok=True)
    tasks = Path(tempfile.mkstemp(prefix="tasks-", suffix=".jsonl", dir=d)[1])
    tasks.write_text("".join(json.dumps(r) + "\n" for r in rows))
    args = ["scripted-policy", "serve", "--tokenizer", str(tokenizer_dir), "--mode", mode,
            "--weight-version", str(weight_version), "--tasks", str(tasks)]
    return _start("scripted server", args, redis_url, run_id, prefix, api_key, server_id, extra_args, d, {})


def _start(what: str, args: list[str], redis_url: str | None, run_id: str, prefix: str, api_key: str | None,
           server_id: str | None, extra_args: list[str] | None, log_dir: str | os.PathLike | None,
           env_extra: dict[str, str]) -> CpuServerHandle:
    port = free_port()
    key = api_key or secrets.token_hex(16)
    log_path = Path(log_dir or tempfile.mkdtemp(prefix="swarl-infer-")) / f"server-{port}.log"
    argv = [sys.executable, "-m", "swarl.cli", *args, "--port", str(port), "--run-id", run_id,
            "--set", f"redis.prefix={prefix}"]
    if redis_url:
        argv += ["--redis-url", redis_url]
    if server_id:
        argv += ["--server-id", server_id]
    argv += list(extra_args or [])
    env = {**os.environ, "SWARL_INFERENCE_API_KEY": key, "TOKENIZERS_PARALLELISM": "false", **env_extra}
    env.pop("SWARL_CONFIG", None)
    with open(log_path, "wb") as logf:
        proc = subprocess.Popen(argv, stdout=logf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=env, cwd=str(REPO), start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    handle = CpuServerHandle(proc, log_path, url=url, api_key=key,
                             server_id=server_id or f"127.0.0.1:{port}", port=port)
    deadline = time.monotonic() + START_TIMEOUT_S
    with httpx.Client(timeout=2.0) as http:
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"{what} exited with {proc.returncode}:\n{handle.log()[-4000:]}")
            try:
                if http.get(f"{url}/health").status_code == 200:  # open without the key, as SGLang's
                    return handle
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                handle.kill()
                raise TimeoutError(f"{what} not healthy after {START_TIMEOUT_S:.0f}s:\n{handle.log()[-4000:]}")
            time.sleep(0.1)
