"""Real SGLang servers on GPUs: the `python -m sglang.launch_server` command swarl needs
(flag names as in SGLang's server_args.py), and a supervisor that starts it, registers it in
the broker's server registry (inference.membership) and heartbeats the weight version SGLang
reports on /model_info (0.5.21+ serve no /get_weight_version) while it lives."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field

from broker.keys import Keys
from broker.registry import Role, ServerMeta
from common.logs import get_logger
from inference.client import SGLangClient
from inference.membership import Membership

log = get_logger("inference")


@dataclass
class SGLangLaunch:
    model: str
    port: int = 30000
    host: str = "127.0.0.1"
    tp_size: int = 1
    weight_version: str = "0"
    mem_fraction: float | None = None
    api_key: str | None = None
    base_gpu_id: int | None = None
    python: str = field(default_factory=lambda: sys.executable)
    extra: list[str] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"


# Flags (SGLang 0.5.23's names and aliases, arg_groups/fields/parallel.py) whose values other
# than 1 leave a server that swarl's weight-update group cannot serve: its workers join at
# rank_offset + tp_rank (model_runner weight_updater), which every pipeline stage shares, and
# init_weights_update_group asserts dp_size == 1 (tokenizer_control_mixin).
GROUP_BREAKING = {
    "--pp-size": "pipeline stages would join the weight-update group at the same ranks "
                 "(rank_offset + tp_rank)",
    "--pipeline-parallel-size": "pipeline stages would join the weight-update group at the same "
                                "ranks (rank_offset + tp_rank)",
    "--dp-size": "SGLang refuses distributed weight updates with data-parallel replicas "
                 "(init_weights_update_group asserts dp_size == 1)",
    "--data-parallel-size": "SGLang refuses distributed weight updates with data-parallel replicas "
                            "(init_weights_update_group asserts dp_size == 1)",
}
# set by build_command from SGLangLaunch's fields, which the registry entry is made from
OWN_FLAGS = {"--model-path": "model", "--model": "model", "--host": "host", "--port": "port",
             "--tp-size": "tp_size", "--tensor-parallel-size": "tp_size",
             "--weight-version": "weight_version", "--api-key": "api_key",
             "--base-gpu-id": "base_gpu_id", "--mem-fraction-static": "mem_fraction"}


def check_extra(extra: list[str]) -> None:
    """ValueError naming the flag when an extra SGLang argument breaks the weight-update group or
    repeats a flag that swarl sets itself (the registered tp_size is the group's world size)."""
    for i, arg in enumerate(extra):
        flag, eq, value = arg.partition("=")
        if not flag.startswith("--"):
            continue
        if flag in OWN_FLAGS:
            raise ValueError(f"extra argument {flag}: set it with SGLangLaunch.{OWN_FLAGS[flag]} (the "
                             "swarl inference sglang option of that name), not as an extra argument")
        if flag in GROUP_BREAKING:
            if not eq:
                value = extra[i + 1] if i + 1 < len(extra) else ""
            if value.strip() != "1":
                raise ValueError(f"extra argument {flag} {value}: swarl's weight-update group cannot "
                                 f"serve it: {GROUP_BREAKING[flag]}; run one server per replica "
                                 "(each registers and gets a group of its own)")


def build_command(spec: SGLangLaunch) -> list[str]:
    """The argv of the SGLang server (token-in/token-out RL use: swarl sends input_ids). Extra
    arguments that break the weight-update group, or repeat swarl's own flags, are refused
    (check_extra)."""
    check_extra(list(spec.extra))
    if spec.tp_size < 1:
        raise ValueError(f"--tp-size must be at least 1, got {spec.tp_size}")
    if spec.mem_fraction is not None and not 0.0 < spec.mem_fraction <= 1.0:
        raise ValueError(f"--mem-fraction must be in (0, 1], got {spec.mem_fraction}")
    cmd = [spec.python, "-m", "sglang.launch_server",
           "--model-path", spec.model,
           "--host", spec.host,
           "--port", str(spec.port),
           "--tp-size", str(spec.tp_size),
           "--weight-version", str(spec.weight_version)]
    if spec.mem_fraction is not None:
        cmd += ["--mem-fraction-static", f"{spec.mem_fraction:g}"]
    if spec.base_gpu_id is not None:
        cmd += ["--base-gpu-id", str(spec.base_gpu_id)]
    if spec.api_key:
        cmd += ["--api-key", spec.api_key]
    return cmd + list(spec.extra)


def run_and_register(spec: SGLangLaunch, cmd: list[str], redis_url: str | None, keys: Keys,
                     server_id: str | None = None, advertise_url: str | None = None,
                     heartbeat_s: float = 3.0, start_timeout_s: float = 1800.0,
                     role: Role = "policy") -> int:
    """Start SGLang, wait for /health, register it, heartbeat until it exits; its exit code."""
    proc = subprocess.Popen(cmd)
    url = advertise_url or spec.url
    sid = server_id or url.split("://", 1)[-1].rstrip("/")

    def forward(signum, _frame):
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signum)

    for s in (signal.SIGTERM, signal.SIGINT):
        signal.signal(s, forward)
    if not redis_url:
        return proc.wait()
    try:
        asyncio.run(_supervise(proc, spec, redis_url, keys, sid, url, heartbeat_s, start_timeout_s, role))
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
    return proc.wait()


async def _supervise(proc: subprocess.Popen, spec: SGLangLaunch, redis_url: str, keys: Keys, sid: str,
                     url: str, heartbeat_s: float, start_timeout_s: float, role: Role = "policy") -> None:
    """Wait (bounded) until SGLang answers /health, then keep its registry entry while it runs."""
    async with SGLangClient(spec.url, api_key=spec.api_key, timeout_s=10, retries=0) as client:
        deadline = time.monotonic() + start_timeout_s
        while proc.poll() is None and not await client.health():
            if time.monotonic() > deadline:
                raise TimeoutError(f"SGLang at {spec.url} not healthy after {start_timeout_s:.0f}s")
            await asyncio.sleep(2)
        if proc.poll() is not None:
            return
        async with Membership(redis_url, keys, sid, url,
                              ServerMeta(kind="sglang", model=spec.model, tp_size=spec.tp_size, role=role),
                              version=client.get_weight_version, heartbeat_s=heartbeat_s):
            await asyncio.to_thread(proc.wait)  # SIGTERM/SIGINT are forwarded to SGLang: it exits
