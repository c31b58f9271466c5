"""Start, supervise and stop swarl's own processes (the demo and tests orchestrate with this):
each child is a real `swarl ...` subcommand with its log in a file; stopping sends SIGTERM
(graceful, as systemd does), waits a bounded time, then SIGKILLs the whole process group. A
child started with a Restart policy is restarted when it fails, as systemd's Restart=on-failure
would: after a backoff that doubles, and only up to a start limit (a child that keeps failing
is a fault the group cannot survive)."""

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


def sigterm_interrupts() -> None:
    """SIGTERM raises KeyboardInterrupt, as Ctrl-C does, in a process that orchestrates a
    ProcessGroup: its `finally` then stops every child. Python's default for SIGTERM ends the
    process at once and leaves its children (Redis, envd and its containers, servers) running."""
    signal.signal(signal.SIGTERM, signal.default_int_handler)


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


@dataclass(frozen=True)
class Restart:
    """systemd's Restart=on-failure: a child that exits with a failure (a non-zero code or a
    signal other than SIGTERM) starts again after `backoff_s`, doubling per restart up to
    `backoff_max_s` (RestartSec); more than `burst` restarts within `interval_s`
    (StartLimitBurst / StartLimitIntervalSec) and the group gives up on it. `args`, when set,
    replace the command line on restarts (the learner continues with --resume)."""

    backoff_s: float = 1.0
    backoff_max_s: float = 30.0
    burst: int = 5
    interval_s: float = 300.0
    args: tuple[str, ...] | None = None


def _failed(code: int | None) -> bool:
    return code is not None and code not in (0, -signal.SIGTERM)


@dataclass
class Proc(Child):
    """One of a ProcessGroup's `swarl` subcommands (its own process group)."""

    name: str = ""
    args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    restart: Restart | None = None
    restarts: list[float] = field(default_factory=list)  # monotonic times of restarts
    restart_at: float | None = None  # a failed child waiting out its backoff
    last_failure: str = ""
    stopping: bool = False  # stopped on purpose: not restarted

    def signal(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, sig)

    def stop(self, timeout: float = 30.0) -> int | None:
        self.stopping = True
        return terminate(self.proc, timeout, group=True)

    def state(self) -> str:
        """One word for a live view: running, restarting (backoff), exited(<code>)."""
        if self.alive():
            return "running"
        if self.restart_at is not None:
            return "restarting"
        return f"exited({self.proc.returncode})"


@dataclass
class ProcessGroup:
    log_dir: Path
    env: dict[str, str] = field(default_factory=dict)
    procs: list[Proc] = field(default_factory=list)

    def _spawn(self, args: list[str], log_path: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
        full_env = {**os.environ, **self.env, **env}
        with open(log_path, "ab") as f:
            return subprocess.Popen(args, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    env=full_env, start_new_session=True)

    def start(self, name: str, args: list[str], env: dict[str, str] | None = None,
              restart: Restart | None = None) -> Proc:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log_path = self.log_dir / f"{name}.log"
        popen = self._spawn(args, log_path, env or {})
        p = Proc(popen, log_path, name, args, env=dict(env or {}), restart=restart)
        self.procs.append(p)
        log.info("started", name=name, pid=popen.pid, log=log_path)
        return p

    def supervise(self, now: float | None = None) -> list[str]:
        """Restart failed children that have a Restart policy (after their backoff); raise, with
        the end of its log, for a failed child without one or past its start limit. Returns a
        line per event (failure seen, restart done) for a live view. Call it every second or so."""
        now = time.monotonic() if now is None else now
        events = []
        for p in self.procs:
            if p.stopping or p.alive() or not _failed(p.proc.returncode):
                continue
            if p.restart is None:
                raise RuntimeError(f"{p.name} exited with {p.proc.returncode}; last log lines:\n{p.tail()}")
            pol = p.restart
            if p.restart_at is None:  # a failure just seen
                recent = [t for t in p.restarts if now - t < pol.interval_s]
                if len(recent) >= pol.burst:
                    raise RuntimeError(f"{p.name} failed {len(recent) + 1} times within {pol.interval_s:.0f}s "
                                       f"(exit {p.proc.returncode}); giving up. Last log lines:\n{p.tail()}")
                delay = min(pol.backoff_max_s, pol.backoff_s * 2 ** len(recent))
                p.restart_at, p.last_failure = now + delay, f"exit {p.proc.returncode}"
                log.warning("child_failed", name=p.name, code=p.proc.returncode, restart_in_s=delay,
                            restarts_recent=len(recent))
                events.append(f"{p.name} exited with {p.proc.returncode}; restarting in {delay:.0f}s")
            if now >= p.restart_at:
                args = list(pol.args) if pol.args is not None else p.args
                p.proc = self._spawn(args, p.log_path, p.env)
                p.restarts.append(now)
                p.restart_at = None
                log.warning("child_restarted", name=p.name, pid=p.proc.pid, restarts=len(p.restarts))
                events.append(f"{p.name} restarted (pid {p.proc.pid}, restart #{len(p.restarts)})")
        return events

    def stop(self, name: str, timeout: float = 30.0) -> None:
        for p in self.procs:
            if p.name == name:
                p.stop(timeout)

    def stop_all(self, timeout: float = 30.0) -> None:
        """Reverse start order: consumers before the services they use."""
        for p in reversed(self.procs):
            p.stop(timeout)

    def check(self) -> None:
        """Raise if any process without a Restart policy died (with the end of its log)."""
        for p in self.procs:
            if p.restart is None and not p.stopping and not p.alive() and _failed(p.proc.returncode):
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
