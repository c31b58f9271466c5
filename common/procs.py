"""Start and stop swarl's own processes (the demo and tests orchestrate with this): each child
is a real `swarl ...` subcommand with its log in a file; stopping sends SIGTERM (graceful, as
systemd does), waits a bounded time, then SIGKILLs the whole process group."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from common.logs import get_logger

log = get_logger("procs")


def swarl_exe() -> list[str]:
    """The `swarl` console script of this interpreter's environment."""
    exe = Path(sys.executable).parent / "swarl"
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "swarl.cli"]


def terminate(popen: subprocess.Popen[bytes], timeout: float = 30.0, group: bool = False) -> int | None:
    """SIGTERM (the process, or its whole group), wait up to `timeout`, then SIGKILL."""
    def send(sig: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(popen.pid, sig) if group else popen.send_signal(sig)

    if popen.poll() is None:
        send(signal.SIGTERM)
        try:
            popen.wait(timeout)
        except subprocess.TimeoutExpired:
            log.warning("sigkill_after_timeout", pid=popen.pid, timeout_s=timeout)
            send(signal.SIGKILL)
            popen.wait(10)
    return popen.returncode


@dataclass
class Child:
    """A child process and its log file (services started by tests, benchmarks and the demo)."""

    proc: subprocess.Popen[bytes]
    log_path: Path

    @classmethod
    def spawn(cls, argv: list[str], log_path: Path, env: dict[str, str] | None = None,
              cwd: str | os.PathLike[str] | None = None) -> Child:
        """Start `argv` in a session of its own, stdout and stderr into `log_path`."""
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "ab") as f:
            proc = subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    env=env, cwd=cwd, start_new_session=True)
        return cls(proc, log_path)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def tail(self, n: int = 30) -> str:
        return "\n".join(self.log().splitlines()[-n:])

    def stop(self, timeout: float = 20.0) -> int | None:
        """SIGTERM (a graceful stop), then SIGKILL after `timeout`."""
        return terminate(self.proc, timeout)

    def kill(self) -> None:
        """SIGKILL at once (a crash, in fault tests)."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=5)


@dataclass
class Proc(Child):
    """One of a ProcessGroup's `swarl` subcommands (its own process group)."""

    name: str = ""
    args: list[str] = field(default_factory=list)

    def signal(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, sig)

    def stop(self, timeout: float = 30.0) -> int | None:
        return terminate(self.proc, timeout, group=True)


@dataclass
class ProcessGroup:
    log_dir: Path
    env: dict[str, str] = field(default_factory=dict)
    procs: list[Proc] = field(default_factory=list)

    def start(self, name: str, args: list[str], env: dict[str, str] | None = None) -> Proc:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log_path = self.log_dir / f"{name}.log"
        full_env = {**os.environ, **self.env, **(env or {})}
        with open(log_path, "ab") as f:
            popen = subprocess.Popen(args, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     env=full_env, start_new_session=True)
        p = Proc(popen, log_path, name, args)
        self.procs.append(p)
        log.info("started", name=name, pid=popen.pid, log=log_path)
        return p

    def stop(self, name: str, timeout: float = 30.0) -> None:
        for p in self.procs:
            if p.name == name:
                p.stop(timeout)

    def stop_all(self, timeout: float = 30.0) -> None:
        """Reverse start order: consumers before the services they use."""
        for p in reversed(self.procs):
            p.stop(timeout)

    def check(self) -> None:
        """Raise if any process died (with the end of its log)."""
        for p in self.procs:
            if not p.alive() and p.proc.returncode not in (0, -signal.SIGTERM):
                raise RuntimeError(f"{p.name} exited with {p.proc.returncode}; last log lines:\n{p.tail()}")

    def __enter__(self) -> ProcessGroup:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop_all()


def wait_http(url: str, proc: Proc | None = None, timeout: float = 120.0,
              headers: dict[str, str] | None = None, ok: Callable[[httpx.Response], bool] | None = None) -> None:
    """Poll `url` until it answers 2xx (or `ok`), failing fast if `proc` dies."""
    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline:
        if proc is not None and not proc.alive():
            raise RuntimeError(f"{proc.name} exited with {proc.proc.returncode} while starting:\n{proc.tail()}")
        try:
            r = httpx.get(url, headers=headers, timeout=2.0)
            if (ok(r) if ok else r.is_success):
                return
            last = f"HTTP {r.status_code}"
        except httpx.HTTPError as e:
            last = type(e).__name__
        time.sleep(0.3)
    raise TimeoutError(f"{url} did not answer within {timeout:.0f}s ({last})")
