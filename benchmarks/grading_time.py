"""Grading time per episode: /container/evaluate on the bundled tasks, the gold patch and a wrong
fix of each, through envd's grader as it is (the referee, canaries, FAIL_TO_PASS re-run alone)
and, given --old, through the grader of another checkout (e.g. the code before the referee).

Both envds run side by side (`swarl envd serve` from each checkout's code, same venv, same
dockerd, same cached task images) and grade task by task in turns, one request at a time, so
that drift on the machine falls on both alike. Per-episode time is the evaluate request's wall
time (a fresh container, the patch, the test infrastructure restored, the eval script, the
verdict). Usage:
  git worktree add /tmp/old30 <commit before the referee>
  .venv/bin/python benchmarks/grading_time.py --old /tmp/old30 [--tasks 32] [--repeats 1]
Last line: {"after_s_mean": ..., "before_s_mean": ..., "overhead_s_mean": ..., ...}.
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
import time
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--old", type=Path, help="a checkout whose grader to compare with (e.g. a git worktree)")
    ap.add_argument("--tasks", type=int, default=32, help="how many bundled tasks (default: all 32)")
    ap.add_argument("--repeats", type=int, default=1)
    args = ap.parse_args()
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
    try:
        for name, code in codes.items():
            proc, url = start_envd(code, docker_url, token)
            procs.append(proc)
            clients[name] = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=600)
        times: dict[tuple[str, str], list[float]] = {(n, k): [] for n in codes for k in ("gold", "wrong")}
        for _ in range(args.repeats):
            for row, image in zip(rows, images, strict=True):
                patches = {"gold": row["patch"], "wrong": wrong_patch(clients["after"], image, row)}
                for kind, patch in patches.items():
                    for name, c in clients.items():
                        dt, ev = evaluate(c, image, row, patch)
                        assert ev["resolved"] == (kind == "gold") and not ev["reward_hack"], (name, row["instance_id"], ev)
                        times[(name, kind)].append(dt)
                print(json.dumps({"task": row["instance_id"], **{f"{n}_{k}_s": round(v[-1], 3)
                                                                  for (n, k), v in times.items()}}), flush=True)
    finally:
        for c in clients.values():
            c.close()
        for proc in procs:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=30)
        client.close()
    table = []
    summary: dict[str, float | int] = {"tasks": len(rows), "repeats": args.repeats}
    for name in codes:
        both = times[(name, "gold")] + times[(name, "wrong")]
        summary[f"{name}_s_mean"] = round(statistics.mean(both), 3)
        summary[f"{name}_s_p50"] = round(statistics.median(both), 3)
        for kind in ("gold", "wrong"):
            xs = times[(name, kind)]
            table.append([name, kind, len(xs), statistics.mean(xs), statistics.median(xs), max(xs)])
    if "before" in codes:
        summary["overhead_s_mean"] = round(summary["after_s_mean"] - summary["before_s_mean"], 3)
        summary["overhead_ratio"] = round(summary["after_s_mean"] / summary["before_s_mean"], 3)
    md = markdown_table(["grader", "patch", "episodes", "mean s", "p50 s", "max s"], table)
    notes = ("Per episode: one /container/evaluate (fresh container, patch, pristine test files, eval script, "
             "verdict). `after`: the refereed grader (envd.referee: the referee process and its plugin, four "
             "canaries, each FAIL_TO_PASS test re-run alone when the gold passes); `before`: "
             f"{args.old or '-'} (the grader before the referee). Command: "
             f"`.venv/bin/python benchmarks/grading_time.py{' --old ' + str(args.old) if args.old else ''}"
             f" --tasks {args.tasks}`.")
    record("grading_time", md, summary, notes)
    print(md)
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
