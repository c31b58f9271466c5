"""Start `swarl inference serve` as a subprocess on a free loopback port and wait for it:
used by the test fixtures and the benchmarks (nothing here runs at import)."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from common.services import free_port

REPO = Path(__file__).resolve().parent.parent
START_TIMEOUT_S = 180.0  # a loaded 2-core machine imports torch + transformers slowly


@dataclass
class CpuServerHandle:
    url: str
    api_key: str
    server_id: str
    port: int
    proc: subprocess.Popen
    log_path: Path
    extra: dict = field(default_factory=dict)

    def stop(self, timeout: float = 15.0) -> None:
        """SIGTERM (deregisters, releases groups), then SIGKILL if it does not exit in time."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=5)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


def start_cpu_server(model_dir: str | os.PathLike, weight_version: str = "0", redis_url: str | None = None,
                     run_id: str = "test", api_key: str | None = None, threads: int = 1,
                     prefix: str = "swarl",
                     server_id: str | None = None, extra_args: list[str] | None = None,
                     log_dir: str | os.PathLike | None = None, drain_timeout_s: float = 5.0) -> CpuServerHandle:
    """Start `swarl inference serve` and wait until /health answers 200."""
    port = free_port()
    key = api_key or secrets.token_hex(16)
    log_path = Path(log_dir or tempfile.mkdtemp(prefix="swarl-infer-")) / f"server-{port}.log"
    # the same command as `swarl inference serve`, without importing every other component's CLI
    args = [sys.executable, "-m", "swarl.cli", "inference", "serve", "--model", str(model_dir),
            "--port", str(port), "--host", "127.0.0.1", "--weight-version", str(weight_version),
            "--threads", str(threads), "--run-id", run_id, "--set", f"redis.prefix={prefix}",
            # short drain so teardown is quick even when a test left a pin behind
            "--set", f"inference.drain_timeout_s={drain_timeout_s}"]
    if redis_url:
        args += ["--redis-url", redis_url]
    if server_id:
        args += ["--server-id", server_id]
    args += list(extra_args or [])
    env = {**os.environ, "SWARL_INFERENCE_API_KEY": key, "OMP_NUM_THREADS": str(threads),
           "TOKENIZERS_PARALLELISM": "false"}
    env.pop("SWARL_CONFIG", None)
    with open(log_path, "wb") as logf:
        proc = subprocess.Popen(args, stdout=logf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=env, cwd=str(REPO), start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    handle = CpuServerHandle(url, key, server_id or f"127.0.0.1:{port}", port, proc, log_path)
    deadline = time.monotonic() + START_TIMEOUT_S
    with httpx.Client(timeout=2.0, headers={"Authorization": f"Bearer {key}"}) as http:
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"swarl inference serve exited with {proc.returncode}:\n{handle.log()[-4000:]}")
            try:
                if http.get(f"{url}/health").status_code == 200:
                    return handle
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                handle.kill()
                raise TimeoutError(f"CPU server not healthy after {START_TIMEOUT_S:.0f}s:\n{handle.log()[-4000:]}")
            time.sleep(0.1)
