"""A long-lived shell per agent container (envd.exec_shell): commands without a `docker exec` each.

A `docker exec` costs the machine ~0.067 CPU s (dockerd, containerd, a runc process; benchmarks/
RESULTS.md `docker_op_cost`), a command through this shell ~0.016. An agent's container is
created with SERVER as its main process (under Docker's init, as `sleep infinity` was), stdin
open, no log driver; envd attaches to it once and writes one line per command:
`<token> <base64 of a sh script>`. The server (waiting in /) evals the script in a subshell with
stdin from /dev/null and its stdout and stderr through one pipe that a `cat` copies out, then
writes `<token> <exit code>`. The code comes when the command exits; children that keep its
output open get ~2 s more to write (as `docker exec` gives them), then the copy is cut; a timeout
is swept by SWARL_EXEC_ID as for `docker exec`. The script is what the exec would have run:
`cd`, then `env ... timeout -s KILL N bash -lc COMMAND`.

The token is random per command, so no output can end one early by accident. The shell is the
agent's own: a command that reads the server's stdin through /proc or kills it only spoils its
own answers (killing the main process ends the container, as killing `sleep infinity` did; a
command that leaves the server no pid to fork ends the server alone, and the container runs on
with `sleep infinity`). Every way the server ends is answered at once and sweeps the command. Grading
never uses it: the fresh container a patch is graded in runs `sleep infinity` and `docker exec`.
"""

from __future__ import annotations

import base64
import secrets
import shlex
import socket
import struct
import time
from typing import Any

# POSIX sh (dash in Debian). fd 4 is the attach stream; the command gets neither 3 nor 4. Its exit
# code comes back on fd 3 (the command substitution) as soon as it exits; its output (fd 5, the
# pipe) goes through a cat in the background to fd 4, which is given ~2 s to copy what the
# command's children still write (as long as `docker exec` waits for an exited command's output),
# then killed. The script is eval'd in a subshell that execs the command; the shell that waits for
# it writes nowhere (dash reports a command killed by a signal, `Killed`, where docker exec
# reports nothing). The loop runs in a subshell: dash exits when a fork fails (a command that
# took every pid the container may have), and then only that subshell ends; the container's main
# process says so on stderr, a stream no command's output reaches, and becomes `sleep infinity`,
# so the container lives on (as it did with `docker exec`) and envd goes on by docker exec.
SERVER = r"""(
exec 4>&1 2>/dev/null
wd=$(pwd)
cd /
while read -r tok b64; do
  s=$(printf '%s' "$b64" | base64 -d 2>/dev/null) || { printf '%s 126\n' "$tok"; continue; }
  out=$( { ( exec 5>&1 >/dev/null 2>&1; ( eval "$s" ) </dev/null >&5 2>&5 3>&- 4>&- 5>&-; echo "r$?" >&3
          ) | cat >&4 3>&- & echo "p$!"; } 3>&1 )
  rc=-1 cp=
  for x in $out; do case $x in p*) cp=${x#p} ;; r*) rc=${x#r} ;; esac; done
  n=0
  while [ -n "$cp" ] && kill -0 "$cp" 2>/dev/null; do
    if [ $n -ge 24 ]; then kill -9 "$cp" 2>/dev/null; break; fi
    if [ $n -lt 5 ]; then sleep 0.01; else sleep 0.1; fi
    n=$((n + 1))
  done
  printf '%s %s\n' "$tok" "$rc"
done
)
echo ended >&2
exec sleep infinity
"""
LABEL_SHELL = "swarl.shell"
HANDSHAKE_S = 5.0
# after the caller's sweep at timeout + grace, how long the answer may still take: the server
# gives cat ~2.4 s, and a loaded machine the rest
ANSWER_SLACK_S = 6.0
_ENV_KEY = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_")


def entrypoint(prologue: str = "") -> list[str]:
    """The server as a container's main process, after `prologue` (sh, run before the first command is read)."""
    return ["sh", "-c", prologue + SERVER]


class ShellEnded(RuntimeError):
    """The server's stream ended or stalled after a command was sent (its fate is unknown)."""


def script_for(command: str, cwd: str | None, env: dict[str, str], secs: int, stderr: bool) -> str | None:
    """The sh script one command is (what `docker exec` would run), or None when an env key is
    not a plain name (`docker exec` takes those; they go that way)."""
    if any(not k or not set(k) <= _ENV_KEY or k[0].isdigit() for k in env):
        return None
    lines = [] if stderr else ["exec 2>/dev/null"]
    # the server waits in / (a reset replaces the repository it started in); $wd is the image's
    # working directory, where `docker exec` runs a command given none
    where = shlex.quote(cwd) if cwd else '"$wd"'
    lines.append(f"cd -- {where} || exit 126")
    assigns = " ".join(shlex.quote(f"{k}={v}") for k, v in env.items())
    lines.append(f"exec env {assigns} timeout -s KILL {secs}s bash -lc {shlex.quote(command)}")
    return "\n".join(lines) + "\n"


class ContainerShell:
    """One attach to one container's SERVER; the caller runs one command at a time (its slot's lock)."""

    def __init__(self, attached: Any) -> None:
        self._attached = attached  # docker-py's socket object: kept so nothing closes the stream
        self.sock: socket.socket = getattr(attached, "_sock", attached)
        self.dead = False
        self._buf = bytearray()  # bytes of the stream read but not yet taken

    def close(self) -> None:
        self.dead = True
        for s in (self.sock, self._attached):
            try:
                s.close()
            except OSError:
                pass

    def _fill(self, deadline: float) -> None:
        """Read one frame's payload into _buf (Docker's 8-byte header per frame: stream, size)."""
        head = self._exact(8, deadline)
        stream, size = struct.unpack(">BxxxL", head)
        payload = self._exact(size, deadline) if size else b""
        if stream == 2:  # only the main process writes there, when the server's loop has ended
            raise ShellEnded("the container's shell ended")
        self._buf += payload

    def _exact(self, n: int, deadline: float) -> bytes:
        out = bytearray()
        while len(out) < n:
            left = deadline - time.monotonic()
            if left <= 0:
                raise ShellEnded("no answer from the container's shell in time")
            self.sock.settimeout(left)
            try:
                chunk = self.sock.recv(min(n - len(out), 1 << 20))
            except TimeoutError:
                raise ShellEnded("no answer from the container's shell in time") from None
            except OSError as e:
                raise ShellEnded(f"the container's shell stream failed: {e}") from None
            if not chunk:
                raise ShellEnded("the container's shell ended")
            out += chunk
        return bytes(out)

    def run(self, script: str, sink: Any, deadline: float) -> int:
        """Send one script; pass its output to `sink.add(bytes)`; answer its exit code. Raises
        ShellEnded (and the shell is dead) when the answer does not come whole by `deadline`."""
        tok = secrets.token_hex(16).encode()
        line = tok + b" " + base64.b64encode(script.encode()) + b"\n"
        try:
            try:
                self.sock.settimeout(max(0.1, deadline - time.monotonic()))
                self.sock.sendall(line)
            except OSError as e:
                raise ShellEnded(f"the container's shell did not take the command: {e}") from None
            keep = len(tok) + 1
            while True:
                at = self._buf.find(tok)
                if at >= 0:
                    if at:
                        sink.add(bytes(self._buf[:at]))
                    end = self._buf.find(b"\n", at)
                    if end >= 0:
                        code = self._buf[at + len(tok):end].strip()
                        del self._buf[:end + 1]
                        return int(code) if code.lstrip(b"-").isdigit() else -1
                    del self._buf[:at]  # keep the token; the code is still coming
                elif len(self._buf) > keep:  # all but what could be the token's first bytes
                    sink.add(bytes(self._buf[:-keep]))
                    del self._buf[:-keep]
                self._fill(deadline)
        except BaseException:
            self.close()
            raise

    def ping(self) -> bool:
        class _Nothing:
            def add(self, _: bytes) -> None:
                pass

        try:
            return self.run("exit 0\n", _Nothing(), time.monotonic() + HANDSHAKE_S) == 0
        except ShellEnded:
            return False
