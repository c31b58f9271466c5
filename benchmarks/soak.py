"""Soak: one envd node, N containers (32) doing mixed exec for a long time (10 minutes), to find
leaks — containers, envd's file descriptors, envd's memory — and report exec latency.

Each of the N workers holds a container and loops over a mix of commands: trivial (`true`),
a listing, a little Python, a file write then `/container/diff`, 1 MB of output (cut by the
output cap), a command past its timeout (killed with its process tree), a background process
left behind; every 25 commands it destroys its container and creates a new one. envd's RSS and
open fds are sampled every few seconds; the growth is counted from the end of the first 10% of
the run (warm-up: thread pools, connection pools, allocator arenas) to the end.

Starts its own `swarl envd serve` (token auth on, in-memory leases, its own node id) on the base
image (envd.images.ensure_base_image: built once from Debian packages, then cached).
Last line: {"leaked_containers": 0, "errors": e, "exec_p95_ms": p, "envd_rss_growth_mb": m, ...}.
Usage: .venv/bin/python benchmarks/soak.py [--duration-s 600] [--containers 32] [--no-record]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import docker
import httpx

from _record import markdown_table, record
from common.services import ensure_docker, free_port, wait_port

REPO = Path(__file__).resolve().parent.parent
RECYCLE_EVERY = 25
WORKDIR = "/soak"   # a git repository made in each new container (the base image has none)
INIT = (f"git init -q {WORKDIR} && cd {WORKDIR} && git -c user.email=soak@swarl -c user.name=soak "
        "commit -q --allow-empty -m init")
# (kind, command, timeout s, weight)
MIX = [
    ("true", "true", 30, 30),
    ("ls", "ls -la / /usr/bin | head -c 20000", 30, 20),
    ("python", "python3 -c 'print(sum(i * i for i in range(200000)))'", 30, 15),
    ("write+diff", "echo $RANDOM >> soak.txt", 30, 15),
    ("1MB output", "head -c 750000 /dev/urandom | base64", 30, 8),
    ("timeout", "sleep 30", 1, 4),
    ("background", "(sleep 600 &) ; echo started", 30, 8),
]


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(q * (len(xs) - 1)))] if xs else 0.0


def start_envd(docker_url: str, token: str, node_id: str, threads: int) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    env = {**os.environ, "DOCKER_HOST": docker_url, "SWARL_ENVD_TOKEN": token, "SWARL_REDIS_URL": "",
           "SWARL_RUN_DIR": tempfile.mkdtemp(prefix="swarl-soak-")}
    log = open(Path(env["SWARL_RUN_DIR"]) / "envd.log", "wb")  # handed to the child
    proc = subprocess.Popen([str(REPO / ".venv/bin/swarl"), "envd", "serve", "--port", str(port),
                             "--node-id", node_id, "--set", f"envd.exec_threads={threads}"],
                            stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    log.close()
    wait_port("127.0.0.1", port, timeout=60)
    return proc, f"http://127.0.0.1:{port}"


def proc_usage(pid: int) -> tuple[float, int]:
    """(RSS in MB, open fds) of a process, from /proc."""
    rss_kb = 0
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                rss_kb = int(line.split()[1])
    return rss_kb / 1024, len(os.listdir(f"/proc/{pid}/fd"))


class Soak:
    def __init__(self, c: httpx.AsyncClient, image: str, deadline: float) -> None:
        self.c, self.image, self.deadline = c, image, deadline
        self.lat: dict[str, list[float]] = defaultdict(list)
        self.errors: dict[str, int] = defaultdict(int)
        self.examples: list[str] = []

    def error(self, kind: str, what: str) -> None:
        self.errors[kind] += 1
        if len(self.examples) < 5:
            self.examples.append(f"{kind}: {what[:200]}")

    async def create(self) -> str | None:
        t0 = time.perf_counter()
        r = await self.c.post("/container/create", json={"image": self.image})
        if r.status_code != 200:
            self.error("create", r.text)
            return None
        cid = str(r.json()["container_id"])
        init = await self.c.post("/container/exec", json={"container_id": cid, "cwd": "/", "command": INIT})
        if init.status_code != 200 or init.json()["returncode"] != 0:
            self.error("create", init.text)
        self.lat["create"].append(time.perf_counter() - t0)
        return cid

    async def destroy(self, cid: str) -> None:
        t0 = time.perf_counter()
        r = await self.c.post("/container/destroy", json={"container_id": cid})
        if r.status_code != 200:
            self.error("destroy", r.text)
        self.lat["destroy"].append(time.perf_counter() - t0)

    async def one(self, cid: str, rng: random.Random) -> None:
        kind, cmd, timeout, _ = rng.choices(MIX, weights=[m[3] for m in MIX])[0]
        t0 = time.perf_counter()
        r = await self.c.post("/container/exec", json={"container_id": cid, "command": cmd, "timeout": timeout,
                                                  "cwd": WORKDIR})
        body = r.json() if r.status_code == 200 else {}
        if r.status_code != 200:
            return self.error(kind, r.text)
        expect_timeout = kind == "timeout"
        if bool(body.get("timed_out")) != expect_timeout or (not expect_timeout and body["returncode"] != 0):
            return self.error(kind, json.dumps(body)[:300])
        if kind == "write+diff":
            d = await self.c.post("/container/diff", json={"container_id": cid, "cwd": WORKDIR})
            if d.status_code != 200 or "soak.txt" not in d.json().get("patch", ""):
                return self.error(kind, d.text)
        self.lat[kind].append(time.perf_counter() - t0)

    async def worker(self, i: int) -> None:
        rng = random.Random(i)
        cid = await self.create()
        n = 0
        while time.monotonic() < self.deadline:
            if cid is None:
                await asyncio.sleep(1)
                cid = await self.create()
                continue
            try:
                await self.one(cid, rng)
            except httpx.HTTPError as e:
                self.error("http", f"{type(e).__name__}: {e}")
            n += 1
            if n % RECYCLE_EVERY == 0:
                await self.destroy(cid)
                cid = await self.create()
        if cid is not None:
            await self.destroy(cid)


async def run(url: str, token: str, image: str, pid: int, duration: float, n: int) -> dict[str, object]:
    headers = {"Authorization": f"Bearer {token}"}
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=180,
                                 limits=httpx.Limits(max_connections=n + 8)) as c:
        for _ in range(100):  # the port opens slightly before the app's lifespan ends
            if (await c.get("/healthz")).status_code == 200:
                break
            await asyncio.sleep(0.1)
        t_start = time.monotonic()
        soak = Soak(c, image, t_start + duration)
        samples: list[tuple[float, float, int]] = []
        health: list[float] = []

        async def sample() -> None:
            while time.monotonic() < soak.deadline:
                rss, fds = proc_usage(pid)
                samples.append((time.monotonic() - t_start, rss, fds))
                t0 = time.perf_counter()
                await c.get("/healthz")
                health.append(time.perf_counter() - t0)
                await asyncio.sleep(max(1.0, duration / 200))

        await asyncio.gather(sample(), *(soak.worker(i) for i in range(n)))
        await asyncio.sleep(2)  # destroys answered; let envd settle before the last sample
        rss, fds = proc_usage(pid)
        samples.append((time.monotonic() - t_start, rss, fds))
        running = (await c.get("/healthz")).json()["running_containers"]
    return {"soak": soak, "samples": samples, "health": health, "envd_running": running}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--duration-s", type=float, default=600.0)
    ap.add_argument("--containers", type=int, default=32)
    ap.add_argument("--no-record", action="store_true", help="do not write benchmarks/RESULTS.md")
    args = ap.parse_args()
    docker_url = ensure_docker()
    client = docker.DockerClient(base_url=docker_url, timeout=120)
    from envd.images import ensure_base_image

    image = ensure_base_image(client)
    token, node_id = secrets.token_hex(16), f"soak-{secrets.token_hex(3)}"
    proc, url = start_envd(docker_url, token, node_id, threads=max(64, 2 * args.containers + 8))
    load0 = os.getloadavg()[0]
    try:
        res = asyncio.run(run(url, token, image, proc.pid, args.duration_s, args.containers))
        labelled = client.containers.list(all=True, filters={"label": f"swarl.owner={node_id}"}, ignore_removed=True)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
    leftover = client.containers.list(all=True, filters={"label": f"swarl.owner={node_id}"}, ignore_removed=True)
    for c in leftover:  # a leak is counted above; do not leave it on the machine
        c.remove(force=True)
    client.close()

    soak, samples, health = res["soak"], res["samples"], res["health"]
    assert isinstance(soak, Soak) and isinstance(samples, list) and isinstance(health, list)
    warm = [s for s in samples if s[0] >= 0.1 * args.duration_s] or samples
    rss_growth = samples[-1][1] - warm[0][1]
    fd_growth = samples[-1][2] - warm[0][2]
    execs = [x for k, xs in soak.lat.items() if k not in ("create", "destroy") for x in xs]
    ms = lambda xs, q: round(1000 * pct(xs, q), 1)  # noqa: E731
    rows = [[k, len(xs), ms(xs, 0.5), ms(xs, 0.95), ms(xs, 1.0), soak.errors.get(k, 0)]
            for k, xs in sorted(soak.lat.items())]
    rows.append(["all execs", len(execs), ms(execs, 0.5), ms(execs, 0.95), ms(execs, 1.0),
                 sum(v for k, v in soak.errors.items() if k not in ("create", "destroy"))])
    rows.append(["/healthz (sampler)", len(health), ms(health, 0.5), ms(health, 0.95), ms(health, 1.0), 0])
    table = markdown_table(["operation", "n", "p50 ms", "p95 ms", "max ms", "errors"], rows)
    res_rows = [
        ["envd RSS MB", round(samples[0][1], 1), round(warm[0][1], 1), round(samples[-1][1], 1),
         round(max(s[1] for s in samples), 1)],
        ["envd open fds", samples[0][2], warm[0][2], samples[-1][2], max(s[2] for s in samples)],
    ]
    res_table = markdown_table(["resource", "start", "after warm-up", "end", "max"], res_rows)
    summary = {
        "leaked_containers": len(labelled),
        "envd_containers_at_end": res["envd_running"],
        "errors": sum(soak.errors.values()),
        "exec_p50_ms": ms(execs, 0.5), "exec_p95_ms": ms(execs, 0.95),
        "execs": len(execs), "execs_per_s": round(len(execs) / args.duration_s, 1),
        "containers_created": len(soak.lat["create"]),
        "envd_rss_growth_mb": round(rss_growth, 1), "envd_fd_growth": fd_growth,
        "healthz_p95_ms": ms(health, 0.95),
        "duration_s": args.duration_s, "containers": args.containers,
    }
    print(table)
    print()
    print(res_table)
    for e in soak.examples:
        print("error:", e)
    if not args.no_record:
        record("soak", table + "\n\n" + res_table, summary,
               notes=f"One envd node, {args.containers} containers doing mixed exec for "
                     f"{args.duration_s:.0f} s (each container recycled every {RECYCLE_EVERY} "
                     f"commands); growth counted from the end of the first 10% of the run. Load "
                     f"average {load0:.1f} at the start, {os.getloadavg()[0]:.1f} at the end, on "
                     f"{os.cpu_count()} cores (shared machine). Image {image}.")
    print(json.dumps(summary))


if __name__ == "__main__":
    sys.exit(main())
