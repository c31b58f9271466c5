"""Grading time per episode: /container/evaluate on the bundled tasks, the gold patch and a wrong
fix of each, through envd's grader as it is (the referee, canaries, FAIL_TO_PASS re-run alone)
and, given --old, through the grader of another checkout (e.g. the code before the referee).

Both envds run side by side (`swarl envd serve` from each checkout's code, same venv, same
dockerd, same cached task images) and grade task by task in turns, one request at a time, so
that drift on the machine falls on both alike. Per-episode time is the evaluate request's wall
time (a fresh container, the patch, the test infrastructure restored, the eval script, the
verdict).

`--concurrency 1,16` measures each grader idle (one episode at a time) and under load (16
episodes graded at once, as the actors' 16 slots do on a 2-core machine): at each level every
episode is graded once per grader, the graders in turns (the order alternates per repeat). The
machine's load average before and after each level is in the JSON. Usage:
  git worktree add /tmp/old30 <commit before>
  .venv/bin/python benchmarks/grading_time.py --old /tmp/old30 --concurrency 1,16 [--tasks 32]
Last line: {"after_c1_s_mean": ..., "after_c16_s_mean": ..., "before_c1_s_mean": ..., ...}.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import docker
import httpx

from _record import markdown_table, record
from common.services import ensure_docker, free_port, wait_port

REPO = Path(__file__).resolve().parent.parent


def start_envd(code: Path, docker_url: str, token: str) -> tuple[subprocess.Popen[bytes], str]:
    """`swarl envd serve` importing its code from `code` (first on PYTHONPATH)."""
    port = free_port()
    run_dir = tempfile.mkdtemp(prefix="swarl-bench-grading-")
    env = {**os.environ, "DOCKER_HOST": docker_url, "SWARL_ENVD_TOKEN": token, "SWARL_REDIS_URL": "",
           "SWARL_RUN_DIR": run_dir, "PYTHONPATH": str(code)}
    log = open(Path(run_dir) / "envd.log", "wb")  # handed to the child
    proc = subprocess.Popen([sys.executable, "-c", "import sys, envd, swarl.cli; "
                             f"assert envd.__file__.startswith({str(code)!r}), envd.__file__; "
                             "sys.argv[0] = 'swarl'; swarl.cli.main()",
                             "envd", "serve", "--port", str(port), "--node-id", f"bench-{secrets.token_hex(3)}"],
                            stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True,
                            cwd=code)  # `python -c` puts the cwd first on sys.path
    log.close()
    wait_port("127.0.0.1", port, timeout=60)
    return proc, f"http://127.0.0.1:{port}"


def evaluate(c: httpx.Client, image: str, row: dict, patch: str) -> tuple[float, dict]:
    cid = c.post("/container/create", json={"image": image}).json()["container_id"]
    try:
        t0 = time.perf_counter()
        r = c.post("/container/evaluate", json={"container_id": cid, "patch": patch, "instance": row, "timeout": 300})
        dt = time.perf_counter() - t0
    finally:
        c.post("/container/destroy", json={"container_id": cid})
    assert r.status_code == 200, r.text
    return dt, r.json()


def wrong_patch(c: httpx.Client, image: str, row: dict) -> str:
    cid = c.post("/container/create", json={"image": image}).json()["container_id"]
    try:
        out = c.post("/container/exec", json={"container_id": cid, "command": row["swarl_wrong_commands"][0]}).json()
        assert out["returncode"] == 0, out
        return c.post("/container/diff", json={"container_id": cid}).json()["patch"]
    finally:
        c.post("/container/destroy", json={"container_id": cid})


def grade_all(c: httpx.Client, episodes: list[tuple[dict, str, str, str]], concurrency: int,
              name: str) -> dict[str, list[float]]:
    """Every episode (row, image, kind, patch) graded through `c`, `concurrency` at once:
    {kind: per-episode seconds}."""
    out: dict[str, list[float]] = {"gold": [], "wrong": []}
    lock = threading.Lock()

    def one(ep: tuple[dict, str, str, str]) -> None:
        row, image, kind, patch = ep
        dt, ev = evaluate(c, image, row, patch)
        assert ev["resolved"] == (kind == "gold") and not ev["reward_hack"], (name, row["instance_id"], ev)
        with lock:
            out[kind].append(dt)

    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        list(pool.map(one, episodes))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--old", type=Path, help="a checkout whose grader to compare with (e.g. a git worktree)")
    ap.add_argument("--tasks", type=int, default=32, help="how many bundled tasks (default: all 32)")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--concurrency", default="1", help="comma-separated episodes graded at once (e.g. 1,16)")
    args = ap.parse_args()
    levels = [int(x) for x in args.concurrency.split(",") if x.strip()]
    sys.path.insert(0, str(REPO))
    from envd.images import build_task_images, ensure_base_image
    from swe.tasks import load_tasks

    docker_url = ensure_docker()
    client = docker.DockerClient(base_url=docker_url, timeout=900)
    ensure_base_image(client)
    rows = load_tasks("all")[:args.tasks]
    images = build_task_images(client, rows, progress=False)
    token = secrets.token_hex(16)
    codes = {"after": REPO, **({"before": args.old.resolve()} if args.old else {})}
    procs, clients = [], {}
    times: dict[tuple[str, int, str], list[float]] = {(n, lv, k): [] for n in codes for lv in levels
                                                      for k in ("gold", "wrong")}
    load: dict[str, list[float]] = {}
    try:
        for name, code in codes.items():
            proc, url = start_envd(code, docker_url, token)
            procs.append(proc)
            clients[name] = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=900)
        with ThreadPoolExecutor(max_workers=4) as pool:
            wrongs = list(pool.map(lambda ri: wrong_patch(clients["after"], ri[1], ri[0]), zip(rows, images, strict=True)))
        episodes = [ep for row, image, wrong in zip(rows, images, wrongs, strict=True)
                    for ep in ((row, image, "gold", row["patch"]), (row, image, "wrong", wrong))]
        for rep in range(args.repeats):
            for lv in levels:
                order = list(codes) if rep % 2 == 0 else list(reversed(codes))
                for name in order:
                    before_load = os.getloadavg()[0]
                    got = grade_all(clients[name], episodes, lv, name)
                    load.setdefault(f"{name}_c{lv}", []).extend([round(before_load, 2), round(os.getloadavg()[0], 2)])
                    for kind, xs in got.items():
                        times[(name, lv, kind)] += xs
                    print(json.dumps({"grader": name, "concurrency": lv, "repeat": rep,
                                      **{f"{k}_s_mean": round(statistics.mean(v), 3) for k, v in got.items()}}),
                          flush=True)
    finally:
        for c in clients.values():
            c.close()
        for proc in procs:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=30)
        client.close()
    table = []
    summary: dict[str, object] = {"tasks": len(rows), "repeats": args.repeats, "concurrency": levels,
                                  "loadavg_1m_before_after": load}
    for name in codes:
        for lv in levels:
            both = times[(name, lv, "gold")] + times[(name, lv, "wrong")]
            summary[f"{name}_c{lv}_s_mean"] = round(statistics.mean(both), 3)
            summary[f"{name}_c{lv}_s_p50"] = round(statistics.median(both), 3)
            for kind in ("gold", "wrong"):
                xs = times[(name, lv, kind)]
                table.append([name, lv, kind, len(xs), statistics.mean(xs), statistics.median(xs), max(xs)])
    if "before" in codes:
        for lv in levels:
            a, b = summary[f"after_c{lv}_s_mean"], summary[f"before_c{lv}_s_mean"]
            assert isinstance(a, float) and isinstance(b, float)
            summary[f"c{lv}_ratio_after_to_before"] = round(a / b, 3)
    md = markdown_table(["grader", "at once", "patch", "episodes", "mean s", "p50 s", "max s"], table)
    notes = ("Per episode: one /container/evaluate (fresh container, patch, pristine test files, eval script, "
             "verdict), with `at once` episodes graded concurrently through one envd. `after`: this checkout's "
             f"grader; `before`: {args.old or '-'}. Load average (1 min) before and after each level in the JSON. "
             f"Command: `.venv/bin/python benchmarks/grading_time.py{' --old ' + str(args.old) if args.old else ''}"
             f" --tasks {args.tasks} --concurrency {args.concurrency}"
             f"{' --repeats ' + str(args.repeats) if args.repeats != 1 else ''}`.")
    record("grading_time", md, summary, notes)
    print(md)
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
