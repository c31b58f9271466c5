"""Blocking Docker operations for envd (run in worker threads by the daemon).

Commands run as `timeout -s KILL N bash -lc CMD` inside the container, so a timeout kills the
command where it runs (GNU timeout signals its whole process group); every exec also carries
SWARL_EXEC_ID in its environment, and after a timeout the process tree is swept by that marker
(catching children that left the group with setsid).
"""

from __future__ import annotations

import collections
import datetime
import io
import re
import secrets
import shlex
import tarfile
import threading
import time
from dataclasses import dataclass
from typing import Any

import docker
import docker.errors

from envd import shell
from envd.config import EnvdConfig

LABEL_OWNER = "swarl.owner"
LABEL_LEASE = "swarl.lease"
LABEL_CREATED = "swarl.created"
LABEL_EXPIRES = "swarl.expires"
LABEL_TTL = "swarl.ttl"
EXEC_MARKER = "SWARL_EXEC_ID"
EXEC_SOCKET_TIMEOUT_S = 7 * 24 * 3600  # bounded in practice by the in-container timeout + sweep
# Kill every process whose environment carries this exec's marker (no procps needed).
_SWEEP = ('for p in /proc/[0-9]*; do '
          'if grep -qz "^{var}={id}$" "$p/environ" 2>/dev/null; then kill -9 "${{p#/proc/}}" 2>/dev/null; fi; '
          'done; true')


# What Docker writes into /etc/hosts of a container on its `none` network. Created with
# NetworkDisabled (envd.network_disabled) no one writes it and the init layer's empty file shows
# ("localhost" would not resolve), so the container's first process writes it, by a rename that
# no reader sees half done; a command's first docker exec does too when the file is still empty
# (that process may not have run yet when the exec comes).
HOSTS = ("127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\nfe00::0\tip6-localnet\n"
         "ff00::0\tip6-mcastprefix\nff02::1\tip6-allnodes\nff02::2\tip6-allrouters\n")
WRITE_HOSTS = (f"{{ printf %s {shlex.quote(HOSTS)} > /etc/.hosts.$$ && mv -f /etc/.hosts.$$ /etc/hosts; }} "
               "2>/dev/null\n")
HOSTS_GUARD = f"[ -s /etc/hosts ] || {WRITE_HOSTS}"


class NotFound(LookupError):
    """An unknown container or image (-> 404 naming it)."""


@dataclass
class ExecOutcome:
    returncode: int
    output: str
    timed_out: bool
    truncated: bool
    duration_s: float
    via: str = "exec"  # "shell": through the container's shell server (envd/shell.py); "exec": docker exec


class _CappedBuffer:
    """Keep the first and last cap/2 bytes of a stream; count what was cut between them."""

    def __init__(self, cap: int) -> None:
        self.head_cap = cap // 2
        self.tail_cap = cap - self.head_cap
        self.head = bytearray()
        self.tail: collections.deque[bytes] = collections.deque()
        self.tail_len = 0
        self.cut = 0

    def add(self, chunk: bytes) -> None:
        room = self.head_cap - len(self.head)
        if room > 0:
            self.head += chunk[:room]
            chunk = chunk[room:]
        if not chunk:
            return
        self.tail.append(chunk)
        self.tail_len += len(chunk)
        while self.tail_len > self.tail_cap:
            first = self.tail[0]
            excess = self.tail_len - self.tail_cap
            if len(first) <= excess:
                self.tail.popleft()
                self.tail_len -= len(first)
                self.cut += len(first)
            else:
                self.tail[0] = first[excess:]
                self.tail_len -= excess
                self.cut += excess

    def text(self) -> str:
        head = bytes(self.head).decode("utf-8", errors="replace")
        tail = b"".join(self.tail).decode("utf-8", errors="replace")
        if self.cut:
            return f"{head}\n[... {self.cut} bytes of output cut by envd ...]\n{tail}"
        return head + tail


def exec_seconds(timeout: float) -> int:
    """The whole seconds `timeout` gets inside the container (at least 1)."""
    return max(1, round(timeout))


def _docker_time(stamp: str) -> float:
    """Docker's RFC 3339 time (nanoseconds, Z) as a Unix time; 0.0 for none (its zero time is year 1)."""
    try:
        t = datetime.datetime.fromisoformat(stamp)  # 3.11 reads Z and nanoseconds (to microseconds)
    except ValueError:
        return 0.0
    return 0.0 if t.year == 1 else t.timestamp()


def _safe_name(s: str) -> str:
    return re.sub(r"[^a-zA-Z0-9_.-]", "-", s)[:60]


class _ShellSlot:
    """A container made with the shell server: its attach (made on first use), one user at a time."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.shell: shell.ContainerShell | None = None
        self.broken = False  # the server failed a handshake or a command: docker exec from now on


class DockerBackend:
    def __init__(self, cfg: EnvdConfig, node_id: str, docker_url: str) -> None:
        self.cfg = cfg
        self.node_id = node_id
        self.client = docker.DockerClient(base_url=docker_url, timeout=int(cfg.create_timeout_s),
                                          max_pool_size=cfg.exec_threads + 8)
        # Exec streams stay silent as long as the command is (up to its own timeout, which
        # the container enforces); the socket read timeout must not cut them short.
        self.exec_api = docker.APIClient(base_url=docker_url, timeout=EXEC_SOCKET_TIMEOUT_S,
                                         max_pool_size=cfg.exec_threads + 8)
        # containers created with the shell server (envd.exec_shell) -> their attach, once made
        self._shells: dict[str, _ShellSlot] = {}
        self._shells_lock = threading.Lock()
        # containers without Docker's network stack whose /etc/hosts no exec has made sure of yet
        self._hosts_pending: set[str] = set()

    def close(self) -> None:
        with self._shells_lock:
            shells, self._shells = list(self._shells.values()), {}
        for slot in shells:
            if slot.shell is not None:
                slot.shell.close()
        self.client.close()
        self.exec_api.close()

    # -- images / health -----------------------------------------------------------
    def ping(self) -> bool:
        return bool(self.client.ping())

    def images(self) -> list[str]:
        # the low-level list: the SDK's images.list() inspects each image after listing it, and one
        # removed in between (the image budget, another engine user) would fail the whole call
        return sorted(t for img in self.client.api.images() for t in (img.get("RepoTags") or [])
                      if t != "<none>:<none>")

    def image_id(self, image: str) -> str | None:
        """The id `image` (a name) resolves to on this node, or None."""
        try:
            return str(self.client.api.inspect_image(image)["Id"])
        except docker.errors.ImageNotFound:
            return None

    def image_of(self, container_id: str) -> str:
        """The image id a container runs (grading uses the same image as the agent)."""
        try:
            return self.client.api.inspect_container(container_id)["Image"]
        except docker.errors.NotFound:
            raise NotFound(f"unknown container {container_id}") from None

    # -- containers ----------------------------------------------------------------
    def create(self, image: str, lease: str, ttl_s: float, extra_labels: dict[str, str] | None = None,
               with_shell: bool = False) -> tuple[str, str, dict[str, str]]:
        """Create and start a container; answer (id, name, labels). Unknown image -> NotFound.
        `with_shell`: its main process is envd/shell.py's server (an agent's container)."""
        try:
            user = str((self.client.api.inspect_image(image).get("Config") or {}).get("User") or "")
        except docker.errors.ImageNotFound:
            raise NotFound(f"unknown image {image} (not on this node)") from None
        now = time.time()
        labels = {
            **(extra_labels or {}),
            LABEL_OWNER: self.node_id,
            LABEL_LEASE: lease,
            LABEL_CREATED: f"{now:.3f}",
            LABEL_EXPIRES: f"{now + ttl_s:.3f}",
            LABEL_TTL: f"{ttl_s:g}",
            **({shell.LABEL_SHELL: "1"} if with_shell else {}),
        }
        name = f"swarl-{_safe_name(self.node_id)}-{secrets.token_hex(4)}"
        # an image that runs as another user than root could not write /etc/hosts: Docker's stack then
        no_stack = self.network_disabled and user.split(":")[0] in ("", "root", "0")
        if with_shell:
            entrypoint = shell.entrypoint(WRITE_HOSTS if no_stack else "")
        else:
            entrypoint = ["sh", "-c", f"{WRITE_HOSTS}exec sleep infinity"] if no_stack else ["sleep", "infinity"]
        c = self.client.containers.create(
            image,
            entrypoint=entrypoint,
            command=[],
            # the server reads commands on stdin; what it writes goes to envd alone, no log file
            stdin_open=with_shell,
            log_config=docker.types.LogConfig(type="none") if with_shell else None,
            name=name,
            labels=labels,
            detach=True,
            init=True,  # tini as PID 1 reaps the processes timeouts kill
            network_mode=self.cfg.network,
            network_disabled=no_stack,
            mem_limit=self.cfg.memory,
            pids_limit=self.cfg.pids_limit,
            nano_cpus=int(self.cfg.cpus * 1e9),
            privileged=False,
            # Only the capabilities a repository's tests need; Docker's default seccomp profile
            # stays (no seccomp= option), setuid binaries cannot gain privileges.
            cap_drop=["ALL"],
            cap_add=list(self.cfg.cap_add),
            security_opt=["no-new-privileges"],
        )
        try:
            c.start()
        except Exception:
            c.remove(force=True)
            raise
        with self._shells_lock:
            if with_shell:
                self._shells[c.id] = _ShellSlot()  # attached on its first command
            if no_stack:  # until a docker exec has made sure of it (a shell's command goes after its prologue)
                self._hosts_pending.add(c.id)
        return c.id, name, labels

    @property
    def network_disabled(self) -> bool:
        """Containers are made without Docker's network stack (envd.network_disabled, network none)."""
        return self.cfg.network == "none" and self.cfg.network_disabled

    def forget_shell(self, container_id: str) -> None:
        """Close the attach to a container's shell (it is going away or restarting)."""
        with self._shells_lock:
            slot = self._shells.pop(container_id, None)
        if slot is not None and slot.shell is not None:
            slot.shell.close()

    def destroy(self, container_id: str) -> bool:
        """Remove a container (killing it); False when it was already gone."""
        self.forget_shell(container_id)
        with self._shells_lock:
            self._hosts_pending.discard(container_id)
        try:
            self.client.api.remove_container(container_id, force=True, v=True)
            return True
        except docker.errors.NotFound:
            return False
        except docker.errors.APIError as e:
            # another remover is at it (a previous envd of this node id still shutting down, whose
            # port this one got): the container is going away either way, and startup must not fail
            if e.status_code == 409 and "already in progress" in str(e.explanation or e):
                return True
            raise

    def owned(self) -> list[dict[str, Any]]:
        """This node's labelled containers (running or not): id, name, image, labels."""
        out = []
        for c in self.client.api.containers(all=True, filters={"label": f"{LABEL_OWNER}={self.node_id}"}):
            out.append({"id": c["Id"], "name": (c.get("Names") or ["/"])[0].lstrip("/"),
                        "image": c.get("Image", ""), "labels": c.get("Labels") or {}})
        return out

    def put_file(self, container_id: str, path: str, data: bytes, mode: int = 0o644) -> None:
        directory, _, name = path.rpartition("/")
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tf:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = mode
            info.mtime = int(time.time())
            tf.addfile(info, io.BytesIO(data))
        try:
            self.client.api.put_archive(container_id, directory or "/", buf.getvalue())
        except docker.errors.NotFound:
            raise NotFound(f"unknown container {container_id}") from None

    # -- reuse (envd.reuse): the steps of a reset ------------------------------------
    def inspect(self, container_id: str) -> dict[str, Any]:
        try:
            return dict(self.client.api.inspect_container(container_id))
        except docker.errors.NotFound:
            raise NotFound(f"unknown container {container_id}") from None

    def stopped(self, container_id: str) -> tuple[float, int] | None:
        """(when, exit code) its main process ended, or None while it runs (or is gone)."""
        try:
            state = self.client.api.inspect_container(container_id)["State"]
        except docker.errors.NotFound:
            return None
        if state.get("Running") or state.get("Restarting"):
            return None
        return _docker_time(str(state.get("FinishedAt") or "")), int(state.get("ExitCode") or 0)

    def engine_stopped(self, container_id: str, since: float, until: float) -> bool:
        """Whether the engine itself signalled the container in [since, until] (docker stop, kill or
        restart, the daemon's own shutdown): its events say so; a process inside leaves only `die`."""
        # read to the end (the engine ends the stream at `until`, a second or so ahead at most), so
        # the connection goes back to the pool whole
        events = list(self.client.api.events(since=int(since), until=int(until) + 1, decode=True,
                                             filters={"type": "container", "container": container_id}))
        return any(e.get("Action", e.get("status")) in ("kill", "stop", "restart") for e in events)

    def changes(self, container_id: str) -> list[tuple[int, str]]:
        """Docker's view of the writable layer (docker diff): (kind 0 changed, 1 added, 2 deleted, path)."""
        return [(int(c["Kind"]), str(c["Path"])) for c in self.client.api.diff(container_id) or []]

    def snapshot(self, container_id: str, path: str, max_bytes: int) -> bytes | None:
        """A tar of `path` in the container (docker cp), or None when it exceeds max_bytes."""
        stream, _ = self.client.api.get_archive(container_id, path)
        buf = bytearray()
        for chunk in stream:
            buf += chunk
            if len(buf) > max_bytes:
                return None
        return bytes(buf)

    def restart(self, container_id: str) -> None:
        """Kill the container's init (the kernel ends every process it holds) and start it again."""
        had_shell = container_id in self._shells
        self.forget_shell(container_id)
        self.client.api.restart(container_id, timeout=0)
        if had_shell:  # a new server: attach to it afresh
            with self._shells_lock:
                self._shells[container_id] = _ShellSlot()

    def settle(self, container_id: str) -> None:
        """Make sure a container without Docker's network stack has its /etc/hosts (its first process
        may not have written it yet), before its files are compared (envd.reuse)."""
        if self.network_disabled:
            with self._shells_lock:
                self._hosts_pending.discard(container_id)
            self.run(container_id, ["sh", "-c", HOSTS_GUARD])

    def restore(self, container_id: str, path: str, archive: bytes) -> None:
        parent = path.rstrip("/").rpartition("/")[0] or "/"
        if not self.client.api.put_archive(container_id, parent, archive):
            raise RuntimeError(f"docker refused to extract the archive into {parent}")

    def run(self, container_id: str, argv: list[str], timeout_s: int = 120) -> tuple[int, str]:
        """`argv` in the container from /, no shell or login profile of ours: (exit code, output)."""
        handle = self.exec_api.exec_create(container_id, ["timeout", "-s", "KILL", f"{timeout_s}s", *argv],
                                           stdout=True, stderr=True, workdir="/")
        out = self.exec_api.exec_start(handle["Id"])
        code = self.exec_api.exec_inspect(handle["Id"]).get("ExitCode")
        return (-1 if code is None else int(code)), out.decode("utf-8", errors="replace")

    # -- exec ----------------------------------------------------------------------
    def exec(self, container_id: str, command: str, cwd: str | None, env: dict[str, str] | None,
             timeout: float, cap: int, exec_id: str | None = None, stderr: bool = True,
             via_shell: bool = False) -> ExecOutcome:
        """Run `bash -lc command` with a timeout enforced inside the container.

        The caller arms a watchdog: if output stays open past timeout + grace (a child escaped
        the process group holding stdout), it calls kill_exec(container_id, exec_id) so the
        stream ends and nobody waits unbounded. `stderr=False`: the command's stderr is not
        attached (discarded), for output parsed by position. `via_shell`: through the
        container's shell server when it has one that is free (envd/shell.py), else docker exec.
        """
        exec_id = exec_id or secrets.token_hex(8)
        secs = exec_seconds(timeout)
        environment = {**(env or {}), EXEC_MARKER: exec_id}
        if via_shell:
            out = self._exec_in_shell(container_id, command, cwd, environment, secs, cap, stderr)
            if out is not None:
                return out
        with self._shells_lock:
            first = container_id in self._hosts_pending
            self._hosts_pending.discard(container_id)
        cmd = ["timeout", "-s", "KILL", f"{secs}s", "bash", "-lc", command]
        if first:  # the guard runs first, in a bash that becomes the command (its text, lines and env stay its own)
            cmd = ["bash", "-c", f'{HOSTS_GUARD}exec "$@"', "bash", *cmd]
        t0 = time.monotonic()
        try:
            handle = self.exec_api.exec_create(container_id, cmd, stdout=True, stderr=stderr,
                                                 workdir=cwd or None, environment=environment)
        except docker.errors.NotFound:
            raise NotFound(f"unknown container {container_id}") from None
        except docker.errors.APIError as e:
            if e.status_code == 409:  # not running
                raise NotFound(f"container {container_id} is not running") from None
            raise
        buf = _CappedBuffer(cap)
        for chunk in self.exec_api.exec_start(handle["Id"], stream=True, demux=False):
            buf.add(chunk)
        code = self.exec_api.exec_inspect(handle["Id"]).get("ExitCode")
        return self._outcome(container_id, exec_id, code, buf, "", time.monotonic() - t0, secs, "exec")

    def _outcome(self, container_id: str, exec_id: str, code: int | None, buf: _CappedBuffer, note: str,
                 duration: float, secs: int, via: str) -> ExecOutcome:
        """One exec's answer, either way it ran: killed at its time bound (GNU timeout's 124 or
        137, or no code) is a timeout, and what left the process group is swept."""
        timed_out = duration >= secs - 0.05 and code in (124, 137, None, -1)
        if timed_out:
            self.kill_exec(container_id, exec_id)  # background children that left the group
            code = -1
        return ExecOutcome(returncode=-1 if code is None else int(code), output=buf.text() + note,
                           timed_out=timed_out, truncated=buf.cut > 0, duration_s=duration, via=via)

    def _exec_in_shell(self, container_id: str, command: str, cwd: str | None, env: dict[str, str],
                       secs: int, cap: int, stderr: bool) -> ExecOutcome | None:
        """The command through the container's shell; None (nothing was run) when it has none,
        it is busy, the env has a key sh cannot pass, or the server does not answer."""
        slot = self._shells.get(container_id)
        script = shell.script_for(command, cwd, env, secs, stderr)
        if slot is None or script is None or slot.broken or not slot.lock.acquire(blocking=False):
            return None
        try:
            if slot.shell is None or slot.shell.dead:
                slot.shell = None
                try:
                    attached = self.exec_api.attach_socket(
                        container_id, params={"stdin": 1, "stdout": 1, "stderr": 1, "stream": 1})
                except Exception:  # gone, stopped, or the engine refused: docker exec says which
                    slot.broken = True
                    return None
                sh = shell.ContainerShell(attached)
                if not sh.ping():
                    sh.close()
                    slot.broken = True
                    return None
                slot.shell = sh
            buf = _CappedBuffer(cap)
            t0, wall0 = time.monotonic(), time.time()
            try:
                code = slot.shell.run(script, buf, t0 + secs + self.cfg.kill_grace_s + shell.ANSWER_SLACK_S)
                note = ""
            except shell.ShellEnded as e:  # killed or robbed: docker exec for the rest of its life
                slot.broken = True
                if self._down_before_or_by_engine(container_id, wall0):
                    raise NotFound(f"container {container_id} is not running") from None
                code, note = -1, f"\n[envd: {e} before the command's exit code came back]\n"
                # nobody waits for what the command left running: sweep it, as a timeout would be
                self.kill_exec(container_id, env[EXEC_MARKER])
            return self._outcome(container_id, env[EXEC_MARKER], code, buf, note, time.monotonic() - t0, secs,
                                 "shell")
        finally:
            slot.lock.release()

    def _down_before_or_by_engine(self, container_id: str, since: float) -> bool:
        """Whether a container whose shell ended was down before `since` (the command's start) or
        stopped by the engine since: then the command did not end it. An engine that cannot say
        leaves the command's answer as it is."""
        try:
            stopped = self.stopped(container_id)
            return stopped is not None and (stopped[0] < since or
                                            self.engine_stopped(container_id, since, time.time()))
        except docker.errors.APIError:
            return False

    def kill_exec(self, container_id: str, exec_id: str) -> None:
        """Kill every process of one exec inside the container (marker in its environment)."""
        script = _SWEEP.format(var=EXEC_MARKER, id=exec_id)
        try:
            self.client.containers.get(container_id).exec_run(["sh", "-c", script])
        except docker.errors.APIError:
            pass  # container gone: nothing left to kill
