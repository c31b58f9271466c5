"""`swarl learning-check`: does the loop learn something that depends on its input?

The whole system, as on a cluster — a private redis-server, a CPU inference server with weight
sync (disk, rolling), `swarl actor` processes taking jobs over Redis, `swarl learner` — trains the
tiny model on the **reading task**: the prompt is a line of code (`k = tx + b`), the question
which of two operators it contains, and the reward 1 for the right one (actor.environment
scored, the exact scorer). Nothing but reading the prompt beats chance (1/2): the operator is
drawn independently of the names, each equally often.

The model starts from a warm start that teaches the answer's *form* only: supervised training
on the task's prompts with an operator drawn at random, independent of the prompt, so the policy
answers `+` or `-` about equally often whatever it reads (chance, measured: `before`). Which one
the line needs is what RL has to learn. The run reports the resolve rate of the trained batches
per learner step, the mismatch KL and the other diagnostics; `--arm shuffled` is the control
(learner.reward_shuffle: the same run with rewards permuted across each batch), which must not
rise. tests/system/test_loop_learns.py holds the bar; benchmarks/learner_settings.py measures
the learner's settings on it.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import random
import secrets
import shutil
import string
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from common.files import machine_lock
from common.procs import ProcessGroup, swarl_exe, wait_http
from common.services import RedisProcess, free_port, start_redis
from swarl.config import CONFIG_DIR, load_config

OPERATORS = ("+", "-")
CHANCE = 1.0 / len(OPERATORS)
QUESTION = "Which operator?"
CACHE = Path(os.environ.get("SWARL_CACHE", Path.home() / ".cache" / "swarl"))
ARMS = ("rl", "shuffled")
_WARM_LOCK = threading.Lock()


def _name(rng: random.Random) -> str:
    return "".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(1, 2)))


def reading_rows(n: int, seed: int = 0) -> list[dict[str, Any]]:
    """`n` rows of the reading task, operators balanced (even index `+`, odd `-`), names drawn
    from `seed` independently of the operator."""
    rng = random.Random(f"reading:{seed}")
    rows = []
    for i in range(n):
        op = OPERATORS[i % len(OPERATORS)]
        prompt = f"{_name(rng)} = {_name(rng)} {op} {_name(rng)}\n{QUESTION}"
        rows.append({"instance_id": f"reading-{seed}-{i}", "prompt": prompt, "answer": op})
    return rows


def form_demonstrations(model_dir: Path, n: int, seed: int) -> list[tuple[list[int], list[int]]]:
    """(ids, loss mask) of `n` demonstrations of the answer's form: the task's prompt, then an
    operator drawn at random (not the prompt's), then the end of turn; exactly the token ids an
    episode has (actors.encoding), the mask on the answer."""
    from transformers import AutoTokenizer

    from actors.encoding import ChatEncoder
    from actors.scored import SCORED_PROMPTS
    from actors.templates import load_templates

    enc = ChatEncoder(AutoTokenizer.from_pretrained(model_dir))
    t = load_templates(SCORED_PROMPTS)
    rng = random.Random(f"form:{seed}")
    seqs = []
    for row in reading_rows(n, seed=10_000 + seed):  # prompts the RL run never sees
        variables = {"task": row["prompt"], "instance": row, "step_limit": 1, "cwd": "/"}
        prompt = enc.prompt(t.render("system", **variables), t.render("instance", **variables)) + enc.gen_prompt
        answer = [*enc.tokenize(rng.choice(OPERATORS)), enc.eos_id]
        seqs.append((prompt + answer, [0] * len(prompt) + [1] * len(answer)))
    return seqs


def warm_start(out: Path, seed: int = 0, demos: int = 512, steps: int = 120,
               say: Callable[[str], None] = print) -> Path:
    """The tiny model, taught the answer's form (form_demonstrations), cached by its inputs."""
    with _WARM_LOCK:  # one at a time in a process (transformers' lazy imports race in threads)
        return _warm_start(out, seed, demos, steps, say)


def _warm_start(out: Path, seed: int, demos: int, steps: int, say: Callable[[str], None]) -> Path:
    from inference.tiny_model import init_tiny
    from swarl.demo.warmstart import sft

    base = init_tiny(out / "base", seed=seed)
    seqs = form_demonstrations(base, demos, seed)
    h = hashlib.sha256(json.dumps([seqs, steps, seed, "form-v1"]).encode()).hexdigest()[:16]
    cached = CACHE / "learning-check" / h
    with machine_lock(f"learning-check-{h}"):  # two checks at once: one trains, the other finds it
        if not (cached / "model.safetensors").exists():
            t0 = time.monotonic()
            tmp = cached.with_name(h + ".tmp")
            shutil.rmtree(tmp, ignore_errors=True)
            sft(base, tmp, seqs, epochs=100, lr=1e-3, batch_size=16, seed=seed, max_steps=steps, warmup=10)
            tmp.rename(cached)
            say(f"warm start (answer form only): {steps} steps in {time.monotonic() - t0:.0f}s, "
                f"cached in {cached}")
    warm = out / "warm"
    shutil.copytree(cached, warm, dirs_exist_ok=True)
    return warm


# the learner and rollout settings of the check (any can be overridden with --set)
SETTINGS: dict[str, Any] = {
    "actor.environment": "scored", "actor.scorer": "exact", "actor.sampling.max_new_tokens": 4,
    "actor.sampling.temperature": 1.0, "actor.max_context_len": 256, "actor.save_trajectories": False,
    "actor.heartbeat_s": 1, "actor.pin_wait_s": 30,
    "admission.batch_size": 64, "admission.max_staleness": 1,
    "learner.n_samples_per_prompt": 8, "learner.minibatches": 4, "learner.epochs": 1, "learner.lr": 3e-4,
    "learner.kl_coef": 0.0, "learner.aggregation": "token", "learner.threads": 1,
    # the trust region (docs/learner.md): the jump from chance to reading moved the policy 0.15-0.76
    # a step in KL, garbled answers for a step or two, and once (a CI run under load) it never
    # recovered; 0.05 a minibatch leaves ordinary steps alone (their update KL is 0.01-0.06)
    "learner.max_update_kl": 0.05,
    "learner.heartbeat_s": 1, "learner.checkpoint_every": 1000, "learner.log_trained_ids": False,
    "learner.tensorboard": False, "learner.group_timeout_s": 60, "learner.straggler_grace_s": 0,
    "weight_sync.transport": "disk", "weight_sync.poll_interval_s": 0.2, "weight_sync.keep_versions": 4,
    "queue.poll_delay_s": 0.05, "replay.block_ms": 200,
}


@dataclass
class CheckOptions:
    run_dir: Path
    steps: int = 40                  # learner steps (learner.max_steps)
    seconds: float = 240.0           # wall-clock bound of the training part
    seed: int = 0
    arm: str = "rl"
    tasks: int = 256                 # reading rows enqueued (each n_samples_per_prompt times per epoch)
    actors: int = 1
    concurrency: int = 16
    sets: list[str] = field(default_factory=list)  # key=value overrides of SETTINGS
    say: Callable[[str], None] = print


def _config(o: CheckOptions, redis_url: str, model: Path, api_key: str) -> dict[str, Any]:
    sets = {**SETTINGS, "run.dir": str(o.run_dir), "run.id": f"check-{o.seed}", "run.seed": o.seed,
            "redis.url": redis_url, "inference.model": str(model), "learner.model_dir": str(model),
            "actor.tokenizer": str(model), "inference.api_key": api_key, "weight_sync.api_key": api_key,
            "actor.inference_api_key": api_key, "learner.max_steps": o.steps,
            "learner.reward_shuffle": o.arm == "shuffled"}
    for s in o.sets:
        k, _, v = s.partition("=")
        sets[k] = yaml.safe_load(v)
    cfg = load_config(CONFIG_DIR / "local.yaml",
                      [f"{k}={json.dumps(v) if isinstance(v, str) else v}" for k, v in sets.items()],
                      environ={})
    return cfg.model_dump(mode="json")


async def _enqueue(redis_url: str, cfg: dict[str, Any], rows: list[dict[str, Any]], epochs: int) -> None:
    from broker.tasks import arq_pool, enqueue_jobs, epoch_order, jobs_for
    from swarl.config import SwarlConfig

    keys = SwarlConfig.model_validate(cfg).keys
    n = int(cfg["learner"]["n_samples_per_prompt"])
    pool = await arq_pool(redis_url)
    try:
        await enqueue_jobs(pool, keys, [j for row, epoch in epoch_order(rows, range(epochs), seed=cfg["run"]["seed"])
                                        for j in jobs_for(keys, row, "reading", n, epoch)])
    finally:
        await pool.aclose()


def run_check(o: CheckOptions) -> dict[str, Any]:
    """Train on the reading task through the real processes; the reward curve and its summary."""
    from learner.metrics_log import read_metrics

    if o.arm not in ARMS:
        raise ValueError(f"arm: one of {', '.join(ARMS)}, got {o.arm!r}")
    o.run_dir.mkdir(parents=True, exist_ok=True)
    t_start = time.monotonic()
    model = warm_start(o.run_dir / "model", seed=o.seed, say=o.say)
    key = secrets.token_hex(16)
    procs = ProcessGroup(o.run_dir / "logs", env={"SWARL_INFERENCE_API_KEY": key, "TOKENIZERS_PARALLELISM": "false",
                                                   "OMP_NUM_THREADS": "1"})
    redis: RedisProcess | None = None
    try:
        redis = start_redis(o.run_dir / "redis")
        cfg = _config(o, redis.url, model, key)
        cfg_path = o.run_dir / "config.yaml"
        cfg_path.write_text(yaml.safe_dump(cfg, sort_keys=False))
        exe = swarl_exe()
        port = free_port()
        srv = procs.start("inference", [*exe, "inference", "serve", "--model", str(model), "--port", str(port),
                                        "-c", str(cfg_path), "--weight-version", "0", "--redis-url", redis.url,
                                        "--run-id", cfg["run"]["id"], "--server-id", "cpu-0"])
        wait_http(f"http://127.0.0.1:{port}/health", srv, 120, headers={"Authorization": f"Bearer {key}"})
        per_step = int(cfg["admission"]["batch_size"])
        epochs = max(1, -(-o.steps * per_step * 2 // (o.tasks * int(cfg["learner"]["n_samples_per_prompt"]))))
        asyncio.run(_enqueue(redis.url, cfg, reading_rows(o.tasks, seed=o.seed), epochs))
        t_train = time.monotonic()
        procs.start("learner", [*exe, "learner", "-c", str(cfg_path)])
        for i in range(o.actors):
            procs.start(f"actor-{i}", [*exe, "actor", "-c", str(cfg_path), "-k", str(o.concurrency)])
        metrics_path = o.run_dir / "metrics.jsonl"
        said = 0
        cpu_at: dict[int, float] = {}  # learner step -> CPU seconds of every process of the run so far
        cpu0 = cpu_seconds(procs)
        while True:
            procs.check()
            rows = read_metrics(metrics_path) if metrics_path.exists() else []
            cpu = cpu_seconds(procs) - cpu0
            for r in rows:
                cpu_at.setdefault(int(r["step"]), cpu)
            learner = next(p for p in procs.procs if p.name == "learner")
            if not learner.alive() or len(rows) >= o.steps or time.monotonic() - t_train > o.seconds:
                break
            if len(rows) >= said + 10:
                said = len(rows)
                o.say(f"{o.arm}: step {len(rows)}, resolve rate {rows[-1].get('resolve_rate', 0):.2f}, "
                      f"{time.monotonic() - t_train:.0f}s")
            time.sleep(0.5)
        train_s = time.monotonic() - t_train
        procs.stop_all(timeout=60)
        rows = read_metrics(metrics_path) if metrics_path.exists() else []
    finally:
        procs.stop_all(timeout=30)
        if redis is not None:
            redis.stop()
    return summarize(rows, o, train_s, time.monotonic() - t_start, cpu_at)


def cpu_seconds(procs: ProcessGroup) -> float:
    """User + system CPU seconds of the group's processes and their children (what a setting
    costs, whatever else the machine runs)."""
    import psutil

    total = 0.0
    for p in procs.procs:
        try:
            root = psutil.Process(p.proc.pid)
            for q in [root, *root.children(recursive=True)]:
                t = q.cpu_times()
                total += t.user + t.system
        except psutil.Error:  # gone: its time is no longer counted (stopped at the end only)
            continue
    return total


def summarize(rows: list[dict[str, Any]], o: CheckOptions, train_s: float, wall_s: float,
              cpu_at: dict[int, float] | None = None, window: int = 5, bar: float = 0.8) -> dict[str, Any]:
    """The curve per step and its ends: the mean resolve rate of the first and last `window`
    steps (each step's rate is of the episodes it trained, sampled at temperature 1), and the
    CPU seconds the run's processes had spent when the rolling mean of 3 steps first reached
    `bar` (None: never)."""
    cpu_at = cpu_at or {}
    steps = [r for r in rows if "resolve_rate" in r]
    curve = [{**{k: r.get(k) for k in ("step", "resolve_rate", "reward_mean", "mismatch_kl", "behav_kl",
                                       "update_kl", "entropy", "clip_frac", "zero_spread_groups_frac",
                                       "grad_norm")}, "cpu_s": cpu_at.get(int(r["step"]))}
             for r in steps]
    rates = [float(r["resolve_rate"]) for r in steps]

    def mean(xs: list[float]) -> float:
        return sum(xs) / len(xs) if xs else float("nan")

    kls = [float(r["mismatch_kl"]) for r in steps if isinstance(r.get("mismatch_kl"), int | float)]
    reached = next((int(steps[i]["step"]) for i in range(2, len(steps))
                    if mean(rates[i - 2:i + 1]) >= bar), None)
    return {"arm": o.arm, "seed": o.seed, "steps": len(steps), "chance": CHANCE,
            "bar": bar, "step_at_bar": reached, "cpu_s_at_bar": cpu_at.get(reached) if reached else None,
            "cpu_s": max(cpu_at.values(), default=None),
            "first": mean(rates[:window]), "last": mean(rates[-window:]), "best": max(rates, default=float("nan")),
            "mismatch_kl_max": max(kls, default=float("nan")), "mismatch_kl_mean": mean(kls),
            "train_s": round(train_s, 1), "wall_s": round(wall_s, 1),
            "episodes": int(sum(float(r.get("episodes", 0)) for r in steps)), "sets": o.sets, "curve": curve}
