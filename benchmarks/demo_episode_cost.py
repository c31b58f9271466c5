"""Where a `make demo` episode's time goes: container create, exec, generation, grading, the
learner; episodes per minute.

It runs the training phase of `swarl demo` as the demo sets it up (swarl.demo.run.Demo: a private
Redis, the shared Docker engine and the generated suite's cached task images, the tiny model
warm-started as `make demo` does (cached in ~/.cache/swarl/warmstart), envd, the pool, the CPU
inference server(s) (--servers, 1 as the demo), the learner with disk weight sync and 2 actors x 3 episodes (--concurrency) on the train
split, configs/demo.yaml) for `--minutes`, without the evaluations before and after, then reads:
- every episode's trajectory (traj.json metrics): generation = the policy's turns
  (model_query_time_sum), exec = the agent's commands (env_execution_time_sum), grading = the
  evaluate call (a fresh container, the patch, the tests: eval_time), wall = the whole episode;
- envd's log: each container create's seconds, the agent's and the grading one apart (the
  agent's runs beside the first turn, actor.lease_ahead);
- the learner's metrics.jsonl: step_time_s + checkpoint_s + publish_s per step;
- the CPU seconds of each process over the window (psutil), and of the Docker engine
  (dockerd, containerd, shims) and of the containers (cgroup cpuacct of `docker/`): the last
  two are shared with whatever else uses the engine on this machine.

Usage: .venv/bin/python benchmarks/demo_episode_cost.py --label before [--minutes 4] [--set k=v ...]
Each label's figures are kept in benchmarks/demo_episode_cost.json and all of them are written
side by side to benchmarks/RESULTS.md (section demo_episode_cost). Last line: the label's JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # the packages before this folder (benchmarks/weight_sync.py), which Python put first
from _record import markdown_table, record  # noqa: E402

OUT = Path(__file__).resolve().parent / "demo_episode_cost.json"
DOCKER_PROCS = ("dockerd", "containerd", "containerd-shim", "containerd-shim-runc-v2", "runc")
CONTAINERS_CPUACCT = Path("/sys/fs/cgroup/cpuacct/docker/cpuacct.usage")
_CREATED = re.compile(r"container_created .*?lease=(\S+) .*?create_s=([0-9.]+)")


def cpu_of(proc: psutil.Process) -> float:
    """CPU seconds of a process and its living children (and the children it has reaped)."""
    total = 0.0
    for p in [proc, *proc.children(recursive=True)]:
        try:
            t = p.cpu_times()
            total += t.user + t.system + t.children_user + t.children_system
        except psutil.Error:
            pass
    return total


def docker_cpu() -> float:
    total = 0.0
    for p in psutil.process_iter(["name"]):
        if p.info["name"] in DOCKER_PROCS:
            try:
                t = p.cpu_times()
                total += t.user + t.system + t.children_user + t.children_system
            except psutil.Error:
                pass
    return total


def containers_cpu() -> float:
    try:
        return int(CONTAINERS_CPUACCT.read_text()) / 1e9
    except (OSError, ValueError):
        return float("nan")


def role(name: str) -> str:
    return name.split("-")[0]  # actor-0 -> actor, inference-1 -> inference


def cpu_snapshot(demo: Any) -> dict[str, float]:
    out: dict[str, float] = {}
    for p in demo.procs.procs:
        try:
            out[role(p.name)] = out.get(role(p.name), 0.0) + cpu_of(psutil.Process(p.proc.pid))
        except psutil.Error:
            pass
    if demo.redis is not None:
        out["redis"] = cpu_of(psutil.Process(demo.redis.proc.pid))
    out["docker engine"] = docker_cpu()
    out["containers"] = containers_cpu()
    return out


def stats(xs: list[float]) -> dict[str, float]:
    if not xs:
        return {"n": 0, "mean": 0.0, "p50": 0.0, "p90": 0.0, "sum": 0.0}
    s = sorted(xs)
    return {"n": len(xs), "mean": statistics.fmean(xs), "p50": s[len(s) // 2],
            "p90": s[min(len(s) - 1, int(0.9 * len(s)))], "sum": sum(xs)}


def episodes(run_dir: Path) -> list[dict[str, Any]]:
    out = []
    for f in sorted((run_dir / "trajectories").glob("*/traj.json")):
        t = json.loads(f.read_text())
        if t.get("metrics"):
            out.append(t)
    return out


def creates(run_dir: Path) -> dict[str, list[float]]:
    """Create seconds of the agents' containers (fresh, or reused: envd.reuse) and the grading ones;
    `refused`: one 0 per reset that failed (the container destroyed)."""
    out: dict[str, list[float]] = {"agent": [], "reused": [], "grading": [], "refused": []}
    log = run_dir / "logs" / "envd.log"
    for line in log.read_text(errors="replace").splitlines() if log.exists() else []:
        m = _CREATED.search(line)
        if m:
            kind = "grading" if m.group(1).startswith("eval-") else "reused" if "reused=True" in line else "agent"
            out[kind].append(float(m.group(2)))
        elif "reset_refused" in line:
            out["refused"].append(0.0)
    return out


def measure(minutes: float, sets: list[str], run_dir: Path | None, model_dir: Path | None = None,
            servers: int = 1, concurrency: int = 3) -> dict[str, Any]:
    from swarl.demo.run import Demo, DemoOptions

    # the minutes alone bound the window (not the demo's 18 learner steps)
    demo = Demo(DemoOptions(minutes=minutes, steps=None, seed=0, sets=tuple(sets), handwritten=False, servers=servers,
                            concurrency=concurrency, run_dir=str(run_dir) if run_dir else None))
    try:
        demo.run_dir.mkdir(parents=True, exist_ok=True)
        redis_url = demo.start_redis()
        demo.build_images()
        model = demo.model() if model_dir is None else model_dir.resolve()
        svc = demo.start_services(redis_url, model)
        load0, cpu0, t0 = os.getloadavg(), cpu_snapshot(demo), time.monotonic()
        # train() ends with the window; the CPU is read before the actors stop
        asyncio.run(demo.train(redis_url, svc["pool_url"], svc["config"]))
        window = time.monotonic() - t0
        cpu1, load1 = cpu_snapshot(demo), os.getloadavg()
        demo.stop_training()
    finally:
        demo.close()
    return {**summarize(demo.run_dir, window, cpu0, cpu1, load0, load1, demo.metrics(), sets, minutes),
            "servers": servers, "concurrency": concurrency}


def summarize(run_dir: Path, window: float, cpu0: dict[str, float], cpu1: dict[str, float],
              load0: tuple[float, ...], load1: tuple[float, ...], steps: list[dict[str, Any]],
              sets: list[str], minutes: float) -> dict[str, Any]:
    eps = episodes(run_dir)
    m = [e["metrics"] for e in eps]
    made = creates(run_dir)
    learner = [float(s.get("step_time_s", 0)) + float(s.get("checkpoint_s", 0)) + float(s.get("publish_s", 0))
               for s in steps]
    trained = sum(int(s.get("episodes", 0)) for s in steps)
    phases = {
        "create (agent container)": stats(made["agent"]),
        "agent container reused (envd.reuse)": stats(made["reused"]),
        "reset refused (container destroyed)": stats(made["refused"]),
        "create (grading container)": stats(made["grading"]),
        "exec (agent commands, per episode)": stats([x["env_execution_time_sum"] for x in m]),
        "generation (per episode)": stats([x["model_query_time_sum"] for x in m]),
        "grading (evaluate, per graded episode)": stats([x["eval_time"] for x in m if x["eval_time"] > 0]),
        # envd.grade_cache: a verdict graded afresh, or the one an earlier grading of the same inputs had
        "grading: graded afresh": stats([x["eval_time"] for x in m if x["eval_time"] > 0 and not x.get("eval_cached")]),
        "grading: answered from envd's cache": stats([x["eval_time"] for x in m if x.get("eval_cached")]),
        "episode wall": stats([x["total_time"] for x in m]),
        "learner step": stats(learner),
    }
    cpu = {k: round(cpu1.get(k, 0.0) - cpu0.get(k, 0.0), 1) for k in cpu1}
    samples = sum(int(s.get("samples", 0)) for s in steps)
    return {
        "minutes": round(window / 60, 2), "episodes": len(eps),
        "episodes_per_min": round(len(eps) / (window / 60), 2),
        "learner_steps": len(steps), "episodes_trained": trained, "samples_trained": samples,
        "tokens_trained": int(sum(float(s.get("tokens", 0)) for s in steps)),
        "graded": sum(1 for x in m if x["eval_time"] > 0), "resolved": sum(1 for e in eps if e.get("resolved")),
        "turns_mean": round(statistics.fmean([x["turns"] for x in m]), 2) if m else 0.0,
        "phases": {k: {kk: round(vv, 3) for kk, vv in v.items()} for k, v in phases.items()},
        "cpu_s": cpu, "load_avg_start": [round(x, 2) for x in load0], "load_avg_end": [round(x, 2) for x in load1],
        "sets": sets, "requested_minutes": minutes, "run_dir": str(run_dir),
        "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                                 text=True).stdout.strip(),
    }


def from_log(path: Path) -> dict[str, Any]:
    """A finished run's result from its printed last line (the window's CPU seconds, load and
    counts, which only the run itself could read) and its run dir (the phases, read again)."""
    from learner.metrics_log import EVAL_VERSION, read_metrics

    text = path.read_text(errors="replace")
    printed = json.loads(text[text.rindex('{"label"'):].splitlines()[0])
    run_dir = Path(printed["run_dir"])
    steps = [r for r in read_metrics(run_dir / "metrics.jsonl") if EVAL_VERSION not in r]
    again = summarize(run_dir, printed["minutes"] * 60, {}, printed["cpu_s"], tuple(printed["load_avg_start"]),
                      tuple(printed["load_avg_end"]), steps, printed["sets"], printed["requested_minutes"])
    if again["episodes"] != printed["episodes"]:
        raise SystemExit(f"{run_dir} holds {again['episodes']} episodes, the log says {printed['episodes']}")
    return {**again, **{k: v for k, v in printed.items() if k != "label"}}


def write_results(all_runs: dict[str, dict[str, Any]]) -> None:
    labels = list(all_runs)
    phase_names = list(dict.fromkeys(p for r in all_runs.values() for p in r["phases"]))
    rows: list[list[object]] = []
    for ph in phase_names:
        rows.append([ph, *(f"{r['phases'][ph]['mean']:.3g} / {r['phases'][ph]['p50']:.3g} (n {r['phases'][ph]['n']})"
                           if r["phases"].get(ph, {}).get("n") else "-" for r in all_runs.values())])
    for key, name in (("episodes_per_min", "episodes per minute"), ("episodes", "episodes"),
                      ("learner_steps", "learner steps"), ("samples_trained", "samples trained"),
                      ("tokens_trained", "tokens trained"), ("turns_mean", "turns per episode")):
        rows.append([name, *(r[key] for r in all_runs.values())])
    cpu_keys = sorted({k for r in all_runs.values() for k in r["cpu_s"]})
    for k in cpu_keys:
        rows.append([f"CPU s: {k}", *(r["cpu_s"].get(k, "-") for r in all_runs.values())])
    ours = ("actor", "envd", "inference", "learner", "pool", "redis")
    rows.append(["CPU s per episode: all measured", *(
        round(sum(r["cpu_s"].values()) / max(1, r["episodes"]), 3) for r in all_runs.values())])
    rows.append(["CPU s per episode: containers (shared)", *(
        round(r["cpu_s"].get("containers", 0.0) / max(1, r["episodes"]), 3) for r in all_runs.values())])
    rows.append(["CPU s per episode: swarl's processes", *(
        round(sum(r["cpu_s"].get(k, 0.0) for k in ours) / max(1, r["episodes"]), 3) for r in all_runs.values())])
    rows.append(["CPU s per episode: learner", *(
        round(r["cpu_s"].get("learner", 0.0) / max(1, r["episodes"]), 3) for r in all_runs.values())])
    rows.append(["CPU s per episode: docker engine (shared)", *(
        round(r["cpu_s"].get("docker engine", 0.0) / max(1, r["episodes"]), 3) for r in all_runs.values())])
    rows.append(["load average (1 min) start / end", *(f"{r['load_avg_start'][0]} / {r['load_avg_end'][0]}"
                                                         for r in all_runs.values())])
    rows.append(["commit", *(r["commit"] for r in all_runs.values())])
    table = markdown_table(["phase: mean / p50 s (n)", *labels], rows)
    notes = ("Each column: the training phase of `swarl demo` (configs/demo.yaml, generated train split, warm-started "
             "tiny model, 2 actors x the episodes each said, the CPU servers said) for the minutes shown, evaluations "
             "left out; `.venv/bin/python benchmarks/demo_episode_cost.py --label <label> --minutes M [--set k=v] "
             "[--servers N] [--concurrency K]`. Settings per label: " + "; ".join(
                 f"{k}: {r['minutes']} min, {' '.join(r['sets']) or 'defaults'}"
                 + f", {r.get('servers', 2)} server(s), 2 actors x {r.get('concurrency', 3)}" for k, r in all_runs.items())
             + ". Creates from envd's log (the agent's runs beside the first turn); exec, generation and grading "
             "from each episode's trajectory metrics; learner step = step_time_s + checkpoint_s + publish_s. "
             "CPU seconds over the window per process, and per episode (the figure the machine's other load "
             "moves least); 'docker engine' (dockerd, containerd, shims) and "
             "'containers' (cgroup cpuacct) count everything on the shared engine, other sessions' work included. "
             "The machine (2 cores) is shared: compare columns only with their load averages.")
    summary = {label: {k: r[k] for k in ("episodes_per_min", "episodes", "learner_steps", "samples_trained",
                                         "minutes", "load_avg_end")} for label, r in all_runs.items()}
    record("demo_episode_cost", table, summary, notes)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--label", default="latest", help="column name (before, after-reuse, ...)")
    ap.add_argument("--minutes", type=float, default=4.0)
    ap.add_argument("--set", dest="sets", action="append", default=[], help="config override key=value")
    ap.add_argument("--run-dir", type=Path, default=None)
    ap.add_argument("--servers", type=int, default=1, help="CPU inference servers (the demo's --servers)")
    ap.add_argument("--concurrency", type=int, default=3, help="episodes each of the 2 actors runs at once (the demo's -k)")
    ap.add_argument("--model", type=Path, default=None,
                    help="a model directory instead of the demo's cached warm start (plumbing checks only)")
    ap.add_argument("--no-record", action="store_true", help="print only; RESULTS.md and the JSON stay")
    ap.add_argument("--rewrite", action="store_true", help="only rewrite RESULTS.md from the JSON (no run)")
    ap.add_argument("--from-log", type=Path, default=None,
                    help="record a run made with --no-record: its printed last line (in this log) and its run dir")
    a = ap.parse_args(argv)
    if a.rewrite:
        write_results(json.loads(OUT.read_text()))
        return 0
    result = from_log(a.from_log) if a.from_log else measure(a.minutes, a.sets, a.run_dir, a.model, a.servers,
                                                                               a.concurrency)
    if not a.no_record:
        runs = json.loads(OUT.read_text()) if OUT.exists() else {}
        runs[a.label] = result
        OUT.write_text(json.dumps(runs, indent=1) + "\n")
        write_results(runs)
    print(json.dumps({"label": a.label, **{k: v for k, v in result.items() if k != "phases"}}))
    return 0


if __name__ == "__main__":
    from swarl.demo import kernels

    kernels.pin()  # the kernels `swarl demo` pins: the same warm start (swarl/demo/kernels.py)
    raise SystemExit(main())
