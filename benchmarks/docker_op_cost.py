"""What one Docker operation of an episode costs the machine, in CPU seconds: a `docker exec` of
envd's form (`timeout ... bash -lc true`) and of a bare `true`, the same command run inside one
exec that stays open (what a long-lived shell would pay per command), a command through envd's
own paths (DockerBackend.exec by docker exec, and through the agent container's shell server,
envd.exec_shell), and a container's create + start + remove (bare; a grading one as envd makes it, with and without
Docker's network stack, envd.network_disabled; an agent's with the shell server as its main process).

CPU is the whole machine's busy time over the operations (psutil.cpu_times: dockerd, containerd,
the shims, runc and the container's processes, which no per-process count catches: runc lives
for milliseconds), so run it on an idle machine; the load average before and after is recorded.

Usage: .venv/bin/python benchmarks/docker_op_cost.py [--image swarl/base:bookworm] [--n 40]
Records benchmarks/RESULTS.md section docker_op_cost. Last line: the figures as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Callable

import docker
import psutil

from _record import markdown_table, record
from common.services import ensure_docker
from envd.config import EnvdConfig
from envd.docker_backend import DockerBackend


def busy() -> float:
    t = psutil.cpu_times()
    return sum(t) - t.idle - getattr(t, "iowait", 0.0)


def cost(n: int, op: Callable[[], None]) -> tuple[float, float]:
    """(CPU s, wall s) per operation, over n of them after one warm-up."""
    op()
    b0, t0 = busy(), time.monotonic()
    for _ in range(n):
        op()
    return (busy() - b0) / n, (time.monotonic() - t0) / n


def _check(out: object, via: bool) -> None:
    assert getattr(out, "returncode", None) == 0 and getattr(out, "via", "") == ("shell" if via else "exec"), out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--image", default="swarl/base:bookworm")
    ap.add_argument("--n", type=int, default=40)
    ap.add_argument("--no-record", action="store_true")
    a = ap.parse_args()
    client = docker.DockerClient(base_url=ensure_docker())
    api = client.api
    load0 = os.getloadavg()
    box = client.containers.run(a.image, ["sleep", "900"], detach=True, network_mode="none")
    try:
        def run_exec(cmd: list[str]) -> Callable[[], None]:
            def op() -> None:
                h = api.exec_create(box.id, cmd, stdout=True, stderr=True)
                for _ in api.exec_start(h["Id"], stream=True):
                    pass
                api.exec_inspect(h["Id"])
            return op

        envd_form = ["timeout", "-s", "KILL", "30s", "bash", "-lc", "true"]
        rows = {"docker exec, envd's form (timeout, bash -lc true)": cost(a.n, run_exec(envd_form)),
                "docker exec of `true`": cost(a.n, run_exec(["true"]))}
        loop = f"for i in $(seq {a.n}); do timeout -s KILL 30s bash -lc true; done"
        per_batch = cost(1, run_exec(["bash", "-c", loop]))
        rows["the same command inside one open exec"] = (per_batch[0] / a.n, per_batch[1] / a.n)

        def lifecycle() -> None:
            c = client.containers.create(a.image, ["sleep", "60"], network_mode="none")
            c.start()
            c.remove(force=True)

        rows["container create + start + remove (Docker's none network)"] = cost(max(5, a.n // 4), lifecycle)
        for label, disabled in (("grading container: create + start + remove, envd, Docker's none network", False),
                                ("grading container: create + start + remove, envd, no network stack "
                                 "(envd.network_disabled)", True)):
            plain = DockerBackend(EnvdConfig(network_disabled=disabled), "docker-op-cost", ensure_docker())
            try:
                rows[label] = cost(max(5, a.n // 4), lambda b=plain: b.destroy(b.create(a.image, "bench", 900, None)[0]))
            finally:
                plain.close()
        backend = DockerBackend(EnvdConfig(), "docker-op-cost", ensure_docker())
        agent = backend.create(a.image, "bench", 900, None, with_shell=True)[0]
        try:
            for label, via in (("envd exec by docker exec (`true`)", False),
                               ("envd exec through the container's shell (envd.exec_shell, `true`)", True)):
                rows[label] = cost(a.n, lambda via=via: _check(backend.exec(agent, "true", "/", {}, 30, 4096,
                                                                            via_shell=via), via))

            def lifecycle_shell() -> None:
                backend.destroy(backend.create(a.image, "bench", 900, None, with_shell=True)[0])

            rows["agent container with the shell: create + start + remove (no network stack)"] = \
                cost(max(5, a.n // 4), lifecycle_shell)
        finally:
            backend.destroy(agent)
            backend.close()
    finally:
        box.remove(force=True)
    load1 = os.getloadavg()
    table = markdown_table(["operation", "CPU s", "wall s"],
                           [[k, round(c, 4), round(w, 4)] for k, (c, w) in rows.items()])
    out = {k: {"cpu_s": round(c, 4), "wall_s": round(w, 4)} for k, (c, w) in rows.items()}
    out["load_avg"] = {"start": round(load0[0], 2), "end": round(load1[0], 2)}
    notes = (f"`benchmarks/docker_op_cost.py --image {a.image} --n {a.n}`: the machine's busy CPU seconds per "
             f"operation (every process: dockerd, containerd, shims, runc, the container's), load average "
             f"{load0[0]:.2f} before, {load1[0]:.2f} after. An episode of the demo makes one agent container, "
             f"four execs (three commands, the diff) and, when graded afresh, a grading container and its exec.")
    if not a.no_record:
        record("docker_op_cost", table, out, notes)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
