"""Asynchronous vs synchronous, measured on swarl itself: one knob, admission.max_staleness.

Real swarl processes — a private redis-server, envd + pool with real containers (the bundled
train tasks, graded by their own tests), scripted policy servers with a heavy-tailed latency
profile (inference/latency.py: lognormal turns and per-token time per episode), `swarl actor`
processes, and `swarl learner` training the tiny model for real with rolling weight sync (disk)
— run max_staleness 0, 1, 2 and 4 one after another, each with the same actors, containers and
wall-clock budget (a fresh run id: its own queue, stream, registry and run directory). Then, at
max_staleness 2, a run of twice the budget where the same number of actors again joins halfway.

Per setting: trained samples (and episodes) per minute between the first and last learner
step, the learner's idle fraction (1 - its busy seconds: step + checkpoint + publish, over that
window), the actors' idle fraction (1 - seconds their generation slots spent on episodes, pin to last
turn, over slots x window), the generated tokens never trained (wasted, at the window's end),
how long the learner held steps for running episodes they would leave behind (learner.hold),
the distribution of sample staleness (learner version at training - the episode's
policy version), weight-sync time (a version's publication to every server reporting it; and the
learner's own publish seconds) and the reward curve. ideal_speedup = E[max of a batch's episode
durations] / E[episode duration], from the delays the servers actually drew (bootstrap over all
episodes). Writes a PNG and a section of benchmarks/RESULTS.md; the last line is one JSON object.

    .venv/bin/python benchmarks/async_vs_sync.py            # ~45 min on 2 cores (make bench-async)
    .venv/bin/python benchmarks/async_vs_sync.py --quick    # ~4 min, what the test suite runs
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import random
import secrets
import shutil
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import yaml  # noqa: E402

from _record import markdown_table, record  # noqa: E402
from common.procs import ProcessGroup, swarl_exe, wait_http  # noqa: E402
from common.services import ensure_docker, free_port, start_redis  # noqa: E402
from inference.latency import LatencyProfile  # noqa: E402
from learner.metrics_log import read_metrics  # noqa: E402
from swarl.config import CONFIG_DIR, load_config  # noqa: E402

# The tiny model, smaller still: the learner must not be the bottleneck on 2 shared cores.
# The vocabulary dominates a CPU step (logits of every position): 1,024 entries, one layer.
MODEL_SIZE = {"vocab_size": 1024, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
              "num_attention_heads": 1, "num_key_value_heads": 1, "head_dim": 32}


def options(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=float, default=6.0, help="wall-clock budget per setting")
    p.add_argument("--etas", default="0,1,2,4", help="max_staleness values, in order")
    p.add_argument("--batch", type=int, default=16, help="admission.batch_size (episodes per step)")
    p.add_argument("--group", type=int, default=4, help="episodes per prompt (group)")
    p.add_argument("--actors", type=int, default=2)
    p.add_argument("--concurrency", type=int, default=8, help="episodes per actor (slots = actors x this)")
    p.add_argument("--servers", type=int, default=6, help="scripted policy servers (the records use 6)")
    p.add_argument("--profile", default="{}", help="LatencyProfile JSON over the benchmark's defaults")
    p.add_argument("--no-scale", action="store_true", help="skip the run where actors are doubled")
    p.add_argument("--quick", action="store_true", help="a short version (tests): eta 0 and 2, batch 4")
    p.add_argument("--out", default=None, help="run directory (default runs/async-vs-sync-<time>)")
    p.add_argument("--png", default=str(REPO / "benchmarks" / "async_vs_sync.png"))
    p.add_argument("--no-record", action="store_true", help="do not write benchmarks/RESULTS.md")
    p.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                   help="a config override for every setting (e.g. weight_sync.max_updating=3)")
    p.add_argument("--mode", default="pinned", choices=["pinned", "in-flight"],
                   help="weight_sync.rollout_mode of every setting")
    p.add_argument("--report", default=None, help="only report again from this run directory")
    o = p.parse_args(argv)
    if o.quick:
        o.minutes, o.etas, o.batch, o.group, o.actors, o.concurrency, o.servers = 1.0, "0,2", 4, 2, 2, 2, 2
        o.no_scale = True
    o.eta_list = [int(x) for x in o.etas.split(",")]
    # Defaults: SWE-like heavy tail, episode sigma ~0.75 (p95 about 3.4x the median).
    base = {"turns_median": 3.0, "turns_sigma": 0.35, "max_turns": 8, "token_s_median": 0.06,
            "token_s_sigma": 0.65, "seed": 0}
    if o.quick:
        base["token_s_median"] = 0.03
    o.latency = LatencyProfile.model_validate({**base, **json.loads(o.profile)})
    return o


class Bench:
    def __init__(self, o: argparse.Namespace) -> None:
        self.o = o
        stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
        self.dir = Path(o.out or REPO / "runs" / f"async-vs-sync-{stamp}").resolve()
        self.dir.mkdir(parents=True, exist_ok=True)
        self.procs = ProcessGroup(self.dir / "logs")
        self.tokens = {"envd": secrets.token_hex(16), "inference": secrets.token_hex(16)}
        self.redis: Any = None
        self.pool_url = ""
        self.node_id = ""
        self.model = self.dir / "model"
        self.extra_sets: list[str] = []  # config overrides of the next setting (a sibling's, e.g. the mode)

    # -- shared services -------------------------------------------------------------------
    def setup(self) -> None:
        import docker

        from envd.images import build_task_images
        from inference.tiny_model import init_tiny

        # what shaped the run, for --report (which otherwise only knows its own arguments)
        (self.dir / "options.json").write_text(json.dumps({k: getattr(self.o, k) for k in RUN_OPTIONS}))
        self.redis = start_redis(self.dir / "redis")
        url = ensure_docker()
        os.environ["DOCKER_HOST"] = url
        client = docker.DockerClient(base_url=url, timeout=300)
        try:
            build_task_images(client)
        finally:
            client.close()
        init_tiny(self.model, seed=0, **MODEL_SIZE)
        self.procs.env.update({"SWARL_ENVD_TOKEN": self.tokens["envd"], "DOCKER_HOST": url,
                               "SWARL_INFERENCE_API_KEY": self.tokens["inference"],
                               "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"})
        cfg = self.config("bench-pool", 0)
        exe = swarl_exe()
        envd_port, pool_port = free_port(), free_port()
        auth = {"Authorization": f"Bearer {self.tokens['envd']}"}
        self.node_id = f"bench-{secrets.token_hex(3)}"
        envd = self.procs.start("envd", [*exe, "envd", "serve", "--port", str(envd_port), "-c", cfg,
                                         "--node-id", self.node_id])  # reaps only its own
        wait_http(f"http://127.0.0.1:{envd_port}/healthz", envd, 120, headers=auth)
        pool = self.procs.start("pool", [*exe, "pool", "serve", "--port", str(pool_port), "-c", cfg,
                                         "--exec-urls", f"http://127.0.0.1:{envd_port}"])
        self.pool_url = f"http://127.0.0.1:{pool_port}"
        wait_http(f"{self.pool_url}/healthz", pool, 120, headers=auth)

    def config(self, run_id: str, eta: int) -> str:
        o = self.o
        slots = 2 * o.actors * o.concurrency  # the doubled run too
        sets = {
            "run.id": run_id, "run.dir": str(self.dir / run_id), "redis.url": self.redis.url,
            "inference.model": str(self.model), "learner.model_dir": str(self.model),
            "actor.tokenizer": str(self.model), "admission.max_staleness": eta,
            "admission.batch_size": o.batch, "learner.n_samples_per_prompt": o.group,
            "actor.step_limit": o.latency.max_turns + 2, "actor.pin_wait_s": 600,
            "actor.shutdown_grace_s": 1, "actor.save_trajectories": False,
            "actor.allocate_wait_s": 300, "queue.poll_delay_s": 0.2, "learner.tensorboard": False,
            "learner.group_timeout_s": 3600, "learner.checkpoint_every": 1, "learner.lr": 1e-4,
            "weight_sync.poll_interval_s": 0.2, "weight_sync.drain_timeout_s": 3600,
            "weight_sync.keep_versions": 4, "weight_sync.rollout_mode": o.mode,
            "pool.max_per_node": 2 * slots + 8,
            "pool.max_concurrent": 2 * slots + 8, "envd.memory": "512m",
            # the learner its records measured (configs/demo.yaml before the demo took the learning
            # proof's design): 4 updates a batch, no trust region or spike clip
            "learner.minibatches": 4, "learner.max_update_kl": "null", "learner.spike_clip": "null",
        }
        if self.pool_url:
            sets["pool.url"] = self.pool_url
        cfg = load_config(CONFIG_DIR / "demo.yaml",
                          [f"{k}={v}" for k, v in sets.items()] + o.sets + self.extra_sets, environ={})
        path = self.dir / f"{run_id}.yaml"
        path.write_text(yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False))
        return str(path)

    # -- one setting -------------------------------------------------------------------------
    async def setting(self, eta: int, scale: bool = False, tag: str = "") -> dict[str, Any]:
        from broker.connection import connect
        from broker.registry import PolicyRegistry, ServerRegistry
        from broker.tasks import arq_pool, enqueue_jobs, jobs_for
        from swarl.config import load_config as load
        from swe.tasks import load_tasks

        o = self.o
        run_id = f"bench-eta{eta}" + ("-2x" if scale else "") + tag
        cfg_path = self.config(run_id, eta)
        keys = load(cfg_path, [], environ={}).keys
        exe = swarl_exe()
        rows = load_tasks("train")
        rng = random.Random(eta)
        for i, row in enumerate(rows):  # half resolved, half wrong fixes: rewards differ per task
            row["swarl_scripted_mode"] = "fix" if i % 2 == 0 else "wrong"
        tasks = self.dir / f"{run_id}-tasks.jsonl"
        tasks.write_text("".join(json.dumps(r) + "\n" for r in rows))
        servers: list[str] = []
        for i in range(o.servers):
            port = free_port()
            p = self.procs.start(f"{run_id}-server-{i}", [
                *exe, "scripted-policy", "serve", "--tokenizer", str(self.model), "--port", str(port),
                "--tasks", str(tasks), "--redis-url", self.redis.url, "--run-id", run_id,
                "--server-id", f"scripted-{i}", "--latency-profile", o.latency.model_dump_json(), "-c", cfg_path])
            servers.append(f"http://127.0.0.1:{port}")
            wait_http(f"{servers[-1]}/health", p, 120)
        pool = await arq_pool(self.redis.url)
        try:
            order = list(range(len(rows)))
            for epoch in range(40):
                rng.shuffle(order)
                for i in order:
                    await enqueue_jobs(pool, keys, jobs_for(keys, rows[i], "swarl-tasks", o.group, epoch))
        finally:
            await pool.aclose()
        learner = self.procs.start(f"{run_id}-learner", [*exe, "learner", "-c", cfg_path])
        # the learner is up (it has published nothing yet) before the actors take jobs
        r = connect(self.redis.url)
        t_wait = time.monotonic() + 180
        while not await r.hget(keys.learner_state, "step"):
            if not learner.alive():
                raise RuntimeError(f"learner exited:\n{learner.tail()}")
            if time.monotonic() > t_wait:
                raise TimeoutError(f"learner not up:\n{learner.tail()}")
            await asyncio.sleep(0.5)
        actors = [self.procs.start(f"{run_id}-actor-{i}", [
            *exe, "actor", "-c", cfg_path, "--concurrency", str(o.concurrency)]) for i in range(o.actors)]
        polreg, srvreg = PolicyRegistry(r, keys), ServerRegistry(r, keys)
        # the budget starts at the first learner step: process start-up (imports on a loaded
        # machine) is not what is compared
        first = time.monotonic() + 600
        while not read_metrics(self.dir / run_id / "metrics.jsonl"):
            for p in [learner, *actors]:
                if not p.alive():
                    raise RuntimeError(f"{p.name} exited:\n{p.tail()}")
            if time.monotonic() > first:
                raise TimeoutError(f"{run_id}: no learner step within 600 s")
            await asyncio.sleep(0.25)
        t0 = time.time()
        # the doubled run: a whole budget before the new actors join and one after (a half of
        # one budget held too few steps after the join to measure a rate)
        budget = o.minutes * 60 * (2 if scale else 1)
        published: dict[int, float] = {}
        everywhere: dict[int, float] = {}
        anywhere: dict[int, float] = {}  # the first server at a version: what new episodes wait for
        busy: list[tuple[float, float, int]] = []  # (time, rollout_busy_s, slots)
        slots = o.actors * o.concurrency
        scaled_at = None
        floor: int | None = None
        try:
            def more() -> bool:
                # a rate needs two steps in the window (three in all): a short budget whose
                # synchronous batches drew long tails runs on for them, up to 3 budgets
                elapsed = time.time() - t0
                if elapsed < budget:
                    return True
                return elapsed < 3 * budget and len(read_metrics(self.dir / run_id / "metrics.jsonl")) < 3

            while more():
                for p in [learner, *actors]:
                    if not p.alive():
                        raise RuntimeError(f"{p.name} exited:\n{p.tail()}")
                if scale and scaled_at is None and time.time() - t0 >= budget / 2:
                    actors += [self.procs.start(f"{run_id}-actor-{o.actors + i}", [
                        *exe, "actor", "-c", cfg_path, "--concurrency", str(o.concurrency)])
                        for i in range(o.actors)]
                    scaled_at, slots = time.time(), 2 * slots
                now = time.time()
                cur = await polreg.current()
                if floor is None:
                    floor = cur  # published before the window: its time is unknown
                published.setdefault(cur, now)
                vs = [s.version or 0 for s in await srvreg.list(alive_only=True)]
                if vs:
                    for v in range(min(vs) + 1):
                        everywhere.setdefault(v, now)
                    for v in range(max(vs) + 1):
                        anywhere.setdefault(v, now)
                b = float(await r.hget(keys.stats, "rollout_busy_s") or 0.0)
                busy.append((now, b, slots))
                await asyncio.sleep(0.25)
            # the token counts at the window's end, before the actors are stopped (their running
            # episodes then count in flight, not wasted by the benchmark's own stop)
            window_stats = {k.decode(): float(v) for k, v in (await r.hgetall(keys.stats)).items()}
        finally:
            for a in actors:
                a.signal(15)
            for a in actors:
                a.stop(30)
            learner.stop(60)
            # what the actors did with their episodes (finished, stopped stale, stopped because
            # the learner closed their group): the work the bound cost
            try:
                all_stats = {k.decode(): float(v) for k, v in (await r.hgetall(keys.stats)).items()}
            finally:
                await r.aclose()
            stats = {k: v for k, v in all_stats.items() if k.startswith("episodes_")}
        published = {v: t for v, t in published.items() if floor is not None and v > floor}
        lat: dict[str, float] = {}
        import httpx

        async with httpx.AsyncClient(timeout=10, headers={
                "Authorization": f"Bearer {self.tokens['inference']}"}) as http:
            for url in servers:
                got = (await http.get(f"{url}/swarl/latency")).json()
                for k, ep in got["episodes"].items():
                    lat[k] = lat.get(k, 0.0) + float(ep["delay_s"])
        for i in range(o.servers):
            self.procs.stop(f"{run_id}-server-{i}", 30)
        out = summarize(run_id, eta, self.dir / run_id / "metrics.jsonl", published, everywhere,
                        busy, lat, o.batch, scaled_at, anywhere)
        out["episodes"] = {k: int(v) for k, v in sorted(stats.items())}
        from broker.status import tokens

        # every generated token: trained, wasted by cause, in flight; at the window's end, and
        # after the stop (the actors' hand-back counts as interrupted)
        out["tokens"], out["tokens_after_stop"] = tokens(window_stats), tokens(all_stats)
        return out

    def close(self) -> None:
        self.procs.stop_all(30)
        if self.redis is not None:
            self.redis.stop()
        if self.node_id:  # envd keeps Redis-leased containers when it stops (a restart adopts them)
            import docker

            from envd.docker_backend import LABEL_OWNER

            client = docker.DockerClient(base_url=os.environ.get("DOCKER_HOST", ""), timeout=120)
            try:
                for c in client.containers.list(all=True, filters={"label": f"{LABEL_OWNER}={self.node_id}"},
                                                ignore_removed=True):
                    c.remove(force=True)
            finally:
                client.close()


# -- figures ------------------------------------------------------------------------------


def summarize(run_id: str, eta: int, metrics_path: Path, published: dict[int, float],
              everywhere: dict[int, float], busy: list[tuple[float, float, int]],
              lat: dict[str, float], batch: int, scaled_at: float | None,
              anywhere: dict[int, float] | None = None) -> dict[str, Any]:
    rows = read_metrics(metrics_path)
    out: dict[str, Any] = {"run": run_id, "eta": eta, "steps": len(rows), "durations": list(lat.values())}
    if len(rows) < 2:
        out.update(samples_per_min=0.0, episodes_per_min=0.0, learner_idle=1.0, actor_idle=float("nan"),
                   staleness={}, max_staleness_seen=0, sync_s=float("nan"), first_s=float("nan"),
                   publish_s=float("nan"),
                   reward=[], step_period_s=float("nan"))
        return out
    t1, tn = rows[0]["time"], rows[-1]["time"]
    window = max(1e-9, tn - t1)
    later = rows[1:]
    out["samples_per_min"] = 60 * sum(int(x["samples"]) for x in later) / window
    out["episodes_per_min"] = 60 * sum(int(x["episodes"]) for x in later) / window
    out["step_period_s"] = window / len(later)
    busy_s = sum(float(x.get("step_time_s", 0)) + float(x.get("checkpoint_s", 0))
                 + float(x.get("publish_s", 0)) for x in later)
    out["learner_idle"] = max(0.0, 1 - busy_s / window)
    out["learner_busy_s_per_step"] = busy_s / len(later)
    out.update(hold_figures(later))
    inside = [b for b in busy if t1 <= b[0] <= tn]
    if len(inside) >= 2:
        slot_s = sum((b2[0] - b1[0]) * b1[2] for b1, b2 in itertools.pairwise(inside))
        out["actor_idle"] = max(0.0, 1 - (inside[-1][1] - inside[0][1]) / max(1e-9, slot_s))
        # where a slot's time goes: per trained episode, the seconds generation slots were busy
        # from a pin to the last turn (the lease, the turns and commands; grading runs past the
        # slot, actor.grading_concurrency; also episodes stopped or dropped), against the
        # trained episodes' own wall time
        episodes = sum(int(x["episodes"]) for x in later)
        out["slot_s_per_episode"] = (inside[-1][1] - inside[0][1]) / max(1, episodes)
    else:
        out["actor_idle"] = float("nan")
    out["episode_times"] = episode_times(metrics_path)
    stale: dict[int, int] = {}
    for x in rows:
        for k, v in x.items():
            if k.startswith("staleness/age_"):
                age = int(k.rsplit("_", 1)[1])
                stale[age] = stale.get(age, 0) + int(v)
    out["staleness"] = dict(sorted(stale.items()))
    out["max_staleness_seen"] = max((a for a, n in stale.items() if n), default=0)
    def mean_lag(reached: dict[int, float]) -> float:
        """Mean seconds from a version's publication until `reached` records it."""
        lags = [reached[v] - published[v] for v in published if v > 0 and v in reached]
        return sum(lags) / len(lags) if lags else float("nan")

    out["sync_s"], out["first_s"] = mean_lag(everywhere), mean_lag(anywhere or {})
    out["publish_s"] = sum(float(x.get("publish_s", 0)) for x in rows) / len(rows)
    out["reward"] = [(round(x["time"] - t1, 2), float(x.get("reward_mean", 0.0))) for x in rows]
    out["dropped"] = {k: v for k, v in rows[-1].items() if k.startswith("dropped/")}
    if scaled_at is not None:
        before = [x for x in rows if x["time"] <= scaled_at]
        after = [x for x in rows if x["time"] > scaled_at + out["step_period_s"]]  # after a warm-up step

        def rate(rs: list[dict[str, Any]]) -> float:
            if len(rs) < 2:
                return float("nan")
            return 60 * sum(int(x["samples"]) for x in rs[1:]) / max(1e-9, rs[-1]["time"] - rs[0]["time"])

        out["samples_per_min_before"], out["samples_per_min_after"] = rate(before), rate(after)
    return out


def hold_figures(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """What the learner's hold rule (learner.hold) did over these steps: seconds a step waited
    for running episodes it would leave behind, how many steps waited, the episodes steps left
    behind (stopped or dropped by the bound), and why steps went with some still running."""
    n = max(1, len(rows))
    why: dict[str, int] = {}
    for x in rows:
        if x.get("hold/left_behind"):
            why[str(x.get("hold/why"))] = why.get(str(x.get("hold/why")), 0) + 1
    return {"held_s_per_step": sum(float(x.get("straggler_wait_s", 0)) for x in rows) / n,
            "steps_held": sum(1 for x in rows if float(x.get("straggler_wait_s", 0)) > 0),
            "left_behind": sum(int(x.get("hold/left_behind", 0)) for x in rows), "left_behind_why": why}


def held_s(r: dict[str, Any]) -> float:
    """Seconds per step the learner held (a run recorded before the hold rule: its grace)."""
    return float(r.get("held_s_per_step", r.get("straggler_wait_s_per_step", float("nan"))))


def wasted_fraction(r: dict[str, Any]) -> float:
    """Generated tokens never trained, of all generated, at the window's end (broker.status.tokens)."""
    return float((r.get("tokens") or {}).get("wasted_fraction", float("nan")))


# issue 42's goals for max_staleness 2: throughput against the ideal, waste, idle actors
GOALS = {"of_ideal": 0.9, "wasted_fraction": 0.02, "actor_idle": 0.05}


def ideal_speedup(durations: list[float], batch: int, draws: int = 20000, seed: int = 0) -> float:
    """E[max of `batch` episode durations] / E[episode duration], by bootstrap over `durations`."""
    if not durations:
        return float("nan")
    rng = random.Random(seed)
    mean = sum(durations) / len(durations)
    emax = sum(max(rng.choices(durations, k=batch)) for _ in range(draws)) / draws
    return emax / mean


def plot(results: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(2, 2, figsize=(11, 8))
    plain = [r for r in results if not r["run"].endswith("-2x")]
    names = [f"eta {r['eta']}" for r in plain]
    ax[0, 0].bar(names, [r["samples_per_min"] for r in plain], color="tab:blue")
    for r in results:  # the doubled run: before and after the second set of actors joined
        if r["run"].endswith("-2x") and "samples_per_min_after" in r:
            ax[0, 0].bar(["eta 2\n1x", "eta 2\n2x"],
                         [r["samples_per_min_before"], r["samples_per_min_after"]], color="tab:green")
    ax[0, 0].tick_params(axis="x", labelsize=8)
    ax[0, 0].set_title("trained samples / min (green: one run, actors doubled halfway)")
    x = range(len(plain))
    ax[0, 1].bar([i - 0.2 for i in x], [r["learner_idle"] for r in plain], 0.4, label="learner idle")
    ax[0, 1].bar([i + 0.2 for i in x], [r["actor_idle"] for r in plain], 0.4, label="actor idle")
    ax[0, 1].set_xticks(list(x), names)
    ax[0, 1].set_ylim(0, 1)
    ax[0, 1].set_title("idle fraction")
    ax[0, 1].legend()
    for r in plain:
        total = sum(r["staleness"].values()) or 1
        ages = sorted(r["staleness"])
        ax[1, 0].plot(ages, [r["staleness"][a] / total for a in ages], "o-", label=f"eta {r['eta']}")
        if r["reward"]:
            ts, rw = zip(*r["reward"], strict=True)
            ax[1, 1].plot(ts, rw, label=f"eta {r['eta']}")
    ax[1, 0].set_title("staleness of trained samples (versions)")
    ax[1, 0].set_xlabel("age")
    ax[1, 0].legend()
    ax[1, 1].set_title("reward mean per step")
    ax[1, 1].set_xlabel("seconds since the first step")
    ax[1, 1].legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=80)
    plt.close(fig)


def episode_times(metrics_path: Path) -> dict[str, float]:
    """From the learner's per-step agent metrics (each step: one batch of episodes): the mean
    over steps of the slowest episode's wall time and of the mean one, of the drawn model time
    and of the grading time. At max_staleness 0 a step's batch is one version's rollouts, so
    slowest / mean is the ideal speedup of the episodes as they ran (container work included)."""
    rows = [x for x in read_metrics(metrics_path) if "agent/total_time_max" in x]
    if not rows:
        return {}

    def avg(k: str) -> float:
        return sum(float(x.get(k, 0.0)) for x in rows) / len(rows)

    return {"wall_max_s": avg("agent/total_time_max"), "wall_mean_s": avg("agent/total_time_mean"),
            "model_s": avg("agent/model_query_time_sum_mean"), "eval_s": avg("agent/eval_time_mean"),
            "env_s": avg("agent/env_execution_time_sum_mean")}


def report(o: argparse.Namespace, results: list[dict[str, Any]], run_dir: Path) -> dict[str, Any]:
    durations = [d for r in results for d in r["durations"]]
    ideal = ideal_speedup(durations, o.batch)
    sync_times = episode_times(run_dir / "bench-eta0" / "metrics.jsonl")
    by = {r["run"]: r for r in results}
    base = by.get("bench-eta0", {}).get("samples_per_min") or float("nan")
    headers = ["setting", "steps", "samples/min", "episodes/min", "speedup", "of ideal", "wasted tokens %",
               "actor idle", "held s/step", "steps held", "left behind", "learner idle",
               "staleness (age: samples)", "max age", "first server s", "every server s", "publish s"]
    table = []
    for r in results:
        speedup = r["samples_per_min"] / base
        table.append([r["run"].removeprefix("bench-"), r["steps"], round(r["samples_per_min"], 1),
                      round(r["episodes_per_min"], 2), round(speedup, 2),
                      round(speedup / ideal, 3) if r["eta"] else "-", round(100 * wasted_fraction(r), 2),
                      round(r["actor_idle"], 3), round(held_s(r), 2), r.get("steps_held", "-"),
                      r.get("left_behind", "-"), round(r["learner_idle"], 3),
                      " ".join(f"{a}:{n}" for a, n in r["staleness"].items()), r["max_staleness_seen"],
                      round(r.get("first_s", float("nan")), 2), round(r["sync_s"], 2),
                      round(r["publish_s"], 3)])
    med = sorted(durations)[len(durations) // 2] if durations else float("nan")
    p95 = sorted(durations)[int(0.95 * (len(durations) - 1))] if durations else float("nan")
    summary: dict[str, Any] = {"ideal_speedup": round(ideal, 3), "batch": o.batch, "minutes": o.minutes,
                               "episodes_drawn": len(durations), "duration_p50_s": round(med, 2),
                               "duration_p95_s": round(p95, 2)}
    for r in results:
        tag = r["run"].removeprefix("bench-").replace("-", "_")
        if r["run"].endswith("-2x"):
            summary["samples_per_min_2x_before"] = round(r.get("samples_per_min_before", float("nan")), 1)
            summary["samples_per_min_2x_after"] = round(r.get("samples_per_min_after", float("nan")), 1)
            continue
        e = r["eta"]
        summary[f"samples_per_min_{tag}"] = round(r["samples_per_min"], 1)
        summary[f"speedup_{tag}"] = round(r["samples_per_min"] / base, 3)
        summary[f"learner_idle_{tag}"] = round(r["learner_idle"], 3)
        summary[f"actor_idle_{tag}"] = round(r["actor_idle"], 3)
        summary[f"wasted_fraction_{tag}"] = round(wasted_fraction(r), 4)
        summary[f"held_s_per_step_{tag}"] = round(held_s(r), 2)
        summary[f"steps_held_{tag}"] = r.get("steps_held")
        summary[f"left_behind_{tag}"] = r.get("left_behind")
        summary[f"max_staleness_seen_{tag}"] = r["max_staleness_seen"]
        summary[f"stale_dropped_{tag}"] = int(r.get("dropped", {}).get("dropped/stale", 0))
        summary[f"late_dropped_{tag}"] = int(r.get("dropped", {}).get("dropped/late", 0))  # group trained
        summary[f"first_server_s_{tag}"] = round(r.get("first_s", float("nan")), 1)
        summary[f"every_server_s_{tag}"] = round(r["sync_s"], 1)
        summary[f"staleness_bound_kept_{tag}"] = r["max_staleness_seen"] <= e
        times = r.get("episode_times") or {}
        if times:
            summary[f"episode_wall_s_{tag}"] = round(times["wall_mean_s"], 2)
            if "eval_s" in times:  # container work: the machine's share, apart from the policy's
                summary[f"grading_s_{tag}"] = round(times["eval_s"], 2)
        if "slot_s_per_episode" in r:
            summary[f"slot_s_per_episode_{tag}"] = round(r["slot_s_per_episode"], 2)
        for k, v in (r.get("episodes") or {}).items():
            summary[f"{k}_{tag}"] = v
        if r["durations"]:
            summary[f"delay_mean_s_{tag}"] = round(sum(r["durations"]) / len(r["durations"]), 2)
    if "speedup_eta2" in summary:
        summary["speedup_eta2_vs_ideal"] = round(summary["speedup_eta2"] / ideal, 3)
        summary["goals_eta2"] = {  # issue 42: all three at once
            "of_ideal": summary["speedup_eta2_vs_ideal"] >= GOALS["of_ideal"],
            "wasted_fraction": summary["wasted_fraction_eta2"] <= GOALS["wasted_fraction"],
            "actor_idle": summary["actor_idle_eta2"] <= GOALS["actor_idle"]}
    summary["mode"] = o.mode
    if sync_times:
        wall_ideal = sync_times["wall_max_s"] / sync_times["wall_mean_s"]
        summary["ideal_speedup_episode_wall"] = round(wall_ideal, 3)
        summary.update({f"eta0_episode_{k}": round(v, 1) for k, v in sync_times.items()})
        if "speedup_eta2" in summary:
            summary["speedup_eta2_vs_episode_wall_ideal"] = round(summary["speedup_eta2"] / wall_ideal, 3)
    notes = (
        f"Each setting: {o.actors} actors x {o.concurrency} episodes ({o.actors * o.concurrency} slots), "
        f"{o.servers} scripted servers, batch {o.batch} episodes ({o.batch // o.group} tasks x {o.group}), "
        f"{o.minutes:g} min{'; config overrides ' + ', '.join(o.sets) if o.sets else ''}; the bundled "
        "train tasks in real containers (half scripted to the fix, half "
        f"to a wrong fix), the tiny model trained by `swarl learner` (rolling disk weight sync every "
        f"step; rollout mode {o.mode}; grading with envd's referee, its default; the learner's hold "
        "rule, learner.hold, at its defaults unless overridden). "
        f"Latency profile {o.latency.model_dump_json()}: episode delay p50 {med:.1f} s, p95 "
        f"{p95:.1f} s over {len(durations)} episodes; ideal speedup {ideal:.2f}. Rates are between a "
        "setting's first and last learner step. The learner's busy time per step (train + checkpoint + "
        "publish) is in the JSON per setting; the reward curve is flat by construction (a scripted "
        "policy does not learn). 2x: at max_staleness 2, a run of twice the budget, the same actors again join halfway. "
        "'of ideal': speedup / ideal speedup; 'wasted tokens %': generated tokens never trained, at the "
        "window's end; 'held s/step': seconds a step waited for running episodes it would leave behind; "
        "'steps held': steps that waited; 'left behind': running episodes steps went without (stopped or "
        "dropped by the staleness bound). Goals at max_staleness 2 (issue 42): of ideal >= "
        f"{GOALS['of_ideal']}, wasted <= {100 * GOALS['wasted_fraction']:g}%, actor idle <= {GOALS['actor_idle']}.")
    if sync_times:
        notes += (
            f" An episode is more than its drawn delay: at max_staleness 0 the mean episode took "
            f"{sync_times['wall_mean_s']:.1f} s of wall time (model {sync_times['model_s']:.1f} s, commands "
            f"{sync_times['env_s']:.1f} s, grading in a fresh container {sync_times['eval_s']:.1f} s) and "
            f"the slowest of each batch {sync_times['wall_max_s']:.1f} s: the ideal speedup of the episodes "
            f"as they ran is {sync_times['wall_max_s'] / sync_times['wall_mean_s']:.2f}.")
    # where a slot's time goes, per setting: the drawn delay is all the ideal knows of
    time_headers = ["setting", "drawn delay s", "model s", "commands s", "grading s", "episode wall s",
                    "slot s per episode"]
    time_table = []
    for r in results:
        t = r.get("episode_times") or {}
        if not t:
            continue
        d = r["durations"]
        time_table.append([r["run"].removeprefix("bench-"), round(sum(d) / len(d), 2) if d else "",
                           round(t["model_s"], 2), round(t["env_s"], 2), round(t["eval_s"], 2),
                           round(t["wall_mean_s"], 2), round(r.get("slot_s_per_episode", float("nan")), 2)])
    tables = markdown_table(headers, table)
    if time_table:
        tables += "\n\nWhere a slot's time goes (means per episode):\n\n" + markdown_table(time_headers, time_table)
    if not o.no_record:
        record("async_vs_sync" + ("" if o.mode == "pinned" else "_in_flight"), tables, summary, notes)
    print(tables)
    print(notes)
    return summary


async def main_async(o: argparse.Namespace) -> dict[str, Any]:
    bench = Bench(o)
    results = []
    try:
        await asyncio.to_thread(bench.setup)
        for eta in o.eta_list:
            results.append(await bench.setting(eta))
            print(f"eta {eta}: {json.dumps({k: v for k, v in results[-1].items() if k not in ('durations', 'reward')})}",
                  file=sys.stderr, flush=True)
        if not o.no_scale:
            results.append(await bench.setting(2, scale=True))
    finally:
        bench.close()
    (bench.dir / "results.json").write_text(json.dumps(results))
    plot(results, Path(o.png))
    summary = report(o, results, bench.dir)
    shutil.rmtree(bench.dir / "redis", ignore_errors=True)
    return summary


RUN_OPTIONS = ("minutes", "etas", "batch", "group", "actors", "concurrency", "servers", "profile", "sets", "mode")


def _as_args(saved: dict[str, Any]) -> list[str]:
    """A run's saved options as command-line arguments (later ones win over earlier)."""
    out: list[str] = []
    for k, v in saved.items():
        if k == "sets":
            out += [a for kv in v for a in ("--set", kv)]
        else:
            out += [f"--{k}", str(v)]
    return out


def main(argv: list[str] | None = None) -> None:
    o = options(argv)
    if o.report:  # figures again from a finished run's results.json and metrics
        run_dir = Path(o.report)
        results = json.loads((run_dir / "results.json").read_text())
        if (run_dir / "options.json").exists():
            saved = json.loads((run_dir / "options.json").read_text())
            o = options([*(argv or sys.argv[1:]), *_as_args(saved)])
        elif (run_dir / "overrides.json").exists():  # a run recorded before options.json
            o.sets = json.loads((run_dir / "overrides.json").read_text())
        plot(results, Path(o.png))
        summary = report(o, results, run_dir)
    else:
        from common.procs import sigterm_interrupts

        sigterm_interrupts()  # a stopped benchmark stops its processes and their containers
        summary = asyncio.run(main_async(o))
    print(json.dumps(summary, sort_keys=True))


if __name__ == "__main__":
    main()
