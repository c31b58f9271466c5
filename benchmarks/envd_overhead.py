"""What envd's HTTP layer costs over Docker: a trivial exec (`bash -lc true`) through envd vs
the docker SDK directly vs the docker CLI (p50/p95), container create p50 through envd, and
envd execs/s with 1, 8 and 32 requests in flight.

Starts its own `swarl envd serve` (token auth on, in-memory leases) and uses the base image
(envd.images.ensure_base_image: built once from Debian packages, then cached).
Last line: {"exec_overhead_ms_p50": envd p50 - SDK p50, "create_ms_p50": ..., ...}.
Usage: .venv/bin/python benchmarks/envd_overhead.py [--execs N] [--creates N]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import docker
import httpx

from _record import markdown_table, record
from common.services import ensure_docker, free_port, wait_port

REPO = Path(__file__).resolve().parent.parent


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(q * (len(xs) - 1)))]


def start_envd(docker_url: str, token: str) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    env = {**os.environ, "DOCKER_HOST": docker_url, "SWARL_ENVD_TOKEN": token, "SWARL_REDIS_URL": "",
           "SWARL_RUN_DIR": tempfile.mkdtemp(prefix="swarl-bench-")}
    log = open(Path(env["SWARL_RUN_DIR"]) / "envd.log", "wb")  # handed to the child
    proc = subprocess.Popen([str(REPO / ".venv/bin/swarl"), "envd", "serve", "--port", str(port),
                             "--node-id", f"bench-{secrets.token_hex(3)}"],
                            stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    log.close()
    wait_port("127.0.0.1", port, timeout=60)
    return proc, f"http://127.0.0.1:{port}"


SERVER_SIDE: list[float] = []  # envd's own duration_s: the Docker part of each envd exec


async def envd_exec(c: httpx.AsyncClient, cid: str) -> float:
    t0 = time.perf_counter()
    r = await c.post("/container/exec", json={"container_id": cid, "command": "true", "cwd": "/"})
    dt = time.perf_counter() - t0
    assert r.json()["returncode"] == 0, r.text
    SERVER_SIDE.append(r.json()["duration_s"])
    return dt


def sdk_exec(client: docker.DockerClient, cid: str) -> float:
    t0 = time.perf_counter()
    h = client.api.exec_create(cid, ["bash", "-lc", "true"], workdir="/")
    client.api.exec_start(h["Id"])
    code = client.api.exec_inspect(h["Id"])["ExitCode"]
    dt = time.perf_counter() - t0
    assert code == 0
    return dt


async def throughput(c: httpx.AsyncClient, cid: str, in_flight: int, total: int) -> float:
    sem = asyncio.Semaphore(in_flight)

    async def one() -> None:
        async with sem:
            r = await c.post("/container/exec", json={"container_id": cid, "command": "true", "cwd": "/"})
            assert r.status_code == 200, r.text

    t0 = time.perf_counter()
    await asyncio.gather(*(one() for _ in range(total)))
    return total / (time.perf_counter() - t0)


async def bench_envd(url: str, token: str, image: str, n_exec: int, n_create: int,
                     client: docker.DockerClient) -> dict[str, object]:
    headers = {"Authorization": f"Bearer {token}"}
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=120,
                                 limits=httpx.Limits(max_connections=64)) as c:
        for _ in range(100):  # wait for the app (the port opens slightly before lifespan ends)
            if (await c.get("/healthz")).status_code == 200:
                break
            await asyncio.sleep(0.1)
        creates = []
        for _ in range(n_create):
            t0 = time.perf_counter()
            r = await c.post("/container/create", json={"image": image})
            creates.append(time.perf_counter() - t0)
            await c.post("/container/destroy", json={"container_id": r.json()["container_id"]})
        cid = (await c.post("/container/create", json={"image": image})).json()["container_id"]
        for _ in range(5):  # warm up
            await envd_exec(c, cid)
            sdk_exec(client, cid)
        # Interleaved, so both see the same machine load (other work shares these 2 cores).
        lat, sdk = [], []
        SERVER_SIDE.clear()
        for _ in range(n_exec):
            lat.append(await envd_exec(c, cid))
            sdk.append(sdk_exec(client, cid))
        rates = {k: await throughput(c, cid, k, max(2 * k, 48)) for k in (1, 8, 32)}
        inside = list(SERVER_SIDE)
        return {"cid": cid, "creates": creates, "lat": lat, "sdk": sdk, "rates": rates, "inside": inside}


def bench_cli(docker_url: str, cid: str, n: int) -> list[float]:
    env = {**os.environ, "DOCKER_HOST": docker_url}
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        subprocess.run(["docker", "exec", cid, "bash", "-lc", "true"], env=env, check=True, timeout=60)
        out.append(time.perf_counter() - t0)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--execs", type=int, default=100)
    ap.add_argument("--creates", type=int, default=10)
    args = ap.parse_args()
    docker_url = ensure_docker()
    client = docker.DockerClient(base_url=docker_url, timeout=120)
    from envd.images import ensure_base_image

    image = ensure_base_image(client)
    token = secrets.token_hex(16)
    proc, url = start_envd(docker_url, token)
    try:
        res = asyncio.run(bench_envd(url, token, image, args.execs, args.creates, client))
        cid = str(res["cid"])
        cli = bench_cli(docker_url, cid, max(20, args.execs // 4))
        httpx.post(f"{url}/container/destroy", json={"container_id": cid},
                   headers={"Authorization": f"Bearer {token}"}, timeout=60)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
        client.close()
    lat, sdk, creates, rates = res["lat"], res["sdk"], res["creates"], res["rates"]
    assert isinstance(lat, list) and isinstance(sdk, list) and isinstance(creates, list)
    assert isinstance(rates, dict)
    paired = [a - b for a, b in zip(lat, sdk, strict=True)]
    inside = res["inside"]
    assert isinstance(inside, list)
    http_layer = [a - b for a, b in zip(lat, inside, strict=True)]
    ms = lambda xs, q: 1000 * pct(xs, q)  # noqa: E731
    rows = [
        ["envd HTTP (auth, timeout wrapper)", ms(lat, 0.5), ms(lat, 0.95), len(lat)],
        ["  of which inside envd's Docker call", ms(inside, 0.5), ms(inside, 0.95), len(inside)],
        ["  of which HTTP + envd request handling", ms(http_layer, 0.5), ms(http_layer, 0.95), len(http_layer)],
        ["docker SDK direct", ms(sdk, 0.5), ms(sdk, 0.95), len(sdk)],
        ["docker CLI", ms(cli, 0.5), ms(cli, 0.95), len(cli)],
        ["create+start via envd", ms(creates, 0.5), ms(creates, 0.95), len(creates)],
    ]
    table = markdown_table(["exec `bash -lc true`", "p50 ms", "p95 ms", "n"], rows)
    rate_table = markdown_table(["in flight", "envd execs/s"], [[k, float(v)] for k, v in rates.items()])
    summary = {
        "exec_overhead_ms_p50": round(ms(lat, 0.5) - ms(sdk, 0.5), 2),
        "exec_overhead_paired_ms_p50": round(ms(paired, 0.5), 2),
        "envd_http_layer_ms_p50": round(ms(http_layer, 0.5), 2),
        "create_ms_p50": round(ms(creates, 0.5), 1),
        "envd_exec_ms_p50": round(ms(lat, 0.5), 2), "envd_exec_ms_p95": round(ms(lat, 0.95), 2),
        "sdk_exec_ms_p50": round(ms(sdk, 0.5), 2), "sdk_exec_ms_p95": round(ms(sdk, 0.95), 2),
        "cli_exec_ms_p50": round(ms(cli, 0.5), 2), "cli_exec_ms_p95": round(ms(cli, 0.95), 2),
        "execs_per_s": {str(k): round(float(v), 1) for k, v in rates.items()},
        "exec_overhead_goal_met": ms(lat, 0.5) - ms(sdk, 0.5) < 10,
    }
    print(table)
    print()
    print(rate_table)
    record("envd_overhead", table + "\n\n" + rate_table, summary,
           notes=f"Overhead = envd p50 - docker SDK p50 (goal < 10 ms), envd and SDK calls "
                 f"interleaved; p50 of per-pair differences {ms(paired, 0.5):.1f} ms. Load average "
                 f"at the end {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores (shared machine). "
                 f"Image {image}; mean envd exec {1000 * statistics.mean(lat):.1f} ms.")
    print(json.dumps(summary))


if __name__ == "__main__":
    sys.exit(main())
