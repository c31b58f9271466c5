"""`swarl demo` (= `make demo`): swarl's main job on its embedded default — a local CPU run.

It only orchestrates: every process is the same `swarl` subcommand a cluster runs (envd, pool,
inference servers, actors, learner), started here with its log under <run_dir>/logs/.
  1. private Redis (AOF) and Docker (the engine that answers, else a private dockerd)
  2. the bundled task images, built locally from Debian packages (cached)
  3. the tiny model, warm-started on demonstrations of the procedure (inspect, edit, submit)
     on practice instances, the edit chosen without looking at the code (cached per seed)
  4. envd, pool, N CPU inference servers (registered in Redis)
  5. resolve rate before training: train, held-out combinations, the held-out two-edit family,
     and the hand-written suite (with --prm, a PRM judge server too: the tiny base model)
  6. learner (+ weight sync) and K actors; train tasks enqueued; train for the time budget
     with a live progress view. Every process is supervised as its systemd unit would be
     (Restart=on-failure with backoff and a start limit; the learner continues with --resume),
     the private Redis too (restarted from its AOF); restarts show in the view, and only a
     process that keeps failing ends the demo
  7. resolve rate after training, on the newest policy; the SFT control (the warm start's
     training continued on its own data for as many steps as the learner took) evaluated too;
     changes with 95% intervals (paired cluster bootstrap over families and tasks,
     swarl/demo/stats.py), per family and code shape, the outcome breakdown per split;
     learning.json, plots; one JSON line
The shuffled-reward control is the same run with learner.reward_shuffle (--arm shuffled);
--seeds runs both arms per seed (run_seeds).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import json
import os
import secrets
import shutil
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from common.logs import get_logger
from common.procs import ProcessGroup, Restart, swarl_exe, wait_http
from common.provenance import code_version
from common.services import RedisProcess, ensure_docker, free_port, start_redis, wait_port
from learner.diagnostics import describe
from swarl.config import (
    CONFIG_DIR,
    REPO_ROOT,
    ConfigError,
    SwarlConfig,
    load_config,
    rollout_temperature_error,
)
from swarl.demo import kernels
from swarl.demo.choice import evaluations as choice_evaluations
from swarl.demo.choice import line as choice_line
from swarl.demo.choice import summary as choice_summary
from swarl.demo.report import ARMS

log = get_logger("demo")
CACHE = Path(os.environ.get("SWARL_CACHE", Path.home() / ".cache" / "swarl"))
RESTART = Restart(backoff_s=1.0, backoff_max_s=30.0, burst=5, interval_s=300.0)
STATUS_STALE_S = 5.0  # a status read slower than this (Redis away) shows as such in the view

SUITE = "generated"  # swe/tasks/generated.py: instances that must be read
EVAL_SPLITS = ("train", "heldout", "heldout_family")
HANDWRITTEN = "handwritten"  # the bundled hand-written suite (swe/tasks/tasks.jsonl), evaluated as is
# practice instances the warm start demonstrates on (swe.tasks.generated.practice): 1,200 steps of
# 8, about 3.5 min on 2 cores; the loss reaches its floor (the choice among a family's edits) by ~1,000
PRACTICE = 9600
# RL's train pool (swe.tasks.generated.pool): fresh instances of the train families and
# combinations, each trained on about once in a run (a fixed set of 96 is memorised instead:
# docs/demo.md "The ceiling"); its images are built once (~0.7 s each) and cached
TRAIN_POOL = 512
# the warm start also shows reading on families RL never meets (other operators): RL then learns
# to read the train combinations and it carries to held-out ones (docs/demo.md "Reading shown
# elsewhere", picked by a pilot on seed 10); the learning proof's design
READING_DEMOS = 3200
POOL_SEED = 0  # the pool is the same for every --seed (its images are built once); seeds reorder it


@dataclass
class DemoOptions:
    minutes: float = 15.0
    steps: int | None = 18  # stop training at this many learner steps (learner.max_steps); minutes bound it
    seed: int = 0
    actors: int = 2
    concurrency: int = 3
    servers: int = 1  # one server batches all the actors' requests: benchmarks/RESULTS.md demo_episode_cost
    eval_samples: int = 2
    eval_per_family: int | None = 8  # tasks per bug family evaluated in each split (None: all)
    train_per_family: int | None = None  # train tasks per bug family enqueued (None: the whole split or pool)
    train_pool: int = TRAIN_POOL  # RL trains on this many fresh pool instances; 0: the fixed train split (96)
    sft_epochs: int = 1
    sft_lr: float = 3e-3
    warm_seed: int | None = None  # the warm start's seed (model init and SFT); None: `seed`
    sft_on: str = "practice"  # practice: PRACTICE new instances; train: the train split, every plausible edit
    sft_demos: int = PRACTICE  # with sft_on=practice: instances demonstrated (one demonstration each)
    practice_names: str = "train"  # practice function numbers: train, or all (swe.tasks.generated.practice)
    reading_demos: int = READING_DEMOS  # more warm-start demonstrations: the reading families' correct fix (warmstart.py)
    arm: str = "rl"        # rl | shuffled (the control: rewards permuted across each batch)
    sft_control: bool = True  # rl arm: continue the warm start's SFT for the learner's steps, evaluate it
    handwritten: bool = False  # also evaluate the hand-written suite before and after (~1 min each on 2 cores)
    recheck: bool = False  # evaluate the warm start again after training: must equal "before" (determinism)
    run_dir: str | None = None
    config: str | None = None
    sets: tuple[str, ...] = ()
    prm: bool = False   # step rewards from a PRM judge: the tiny base model on its own server
    before_from: str | None = None  # a run dir of the same seed and warm start: its "before" episodes are reused
    pair_forms: bool = True  # a learner group holds both forms of a symptom (swe.tasks.generated.form_pairs)


class Demo:
    def __init__(self, opts: DemoOptions) -> None:
        from rich.console import Console

        self.o = opts
        self.console = Console(stderr=True, soft_wrap=True)  # a log line stays one line
        stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
        self.run_dir = Path(opts.run_dir or REPO_ROOT / "runs" / f"demo-{stamp}").resolve()
        self.procs = ProcessGroup(self.run_dir / "logs")
        self.redis: RedisProcess | None = None
        self.tokens = {k: secrets.token_hex(16) for k in ("envd", "inference")}
        self.server_urls: list[str] = []
        self.events: list[str] = []  # supervision events, newest last, for the live view
        self.stopping = threading.Event()  # set when the demo is interrupted: the warm start's thread stops
        self.redis_restarts = 0
        self.pool_images: threading.Thread | None = None  # builds the pool's images in the background
        self.pool_images_error: BaseException | None = None
        self.code = code_version()  # read before the run's processes start and import it

    def say(self, msg: str) -> None:
        self.console.print(f"[bold cyan]swarl demo[/] {msg}")

    # -- set-up ------------------------------------------------------------------------
    def keys(self) -> Any:
        return self.config().keys

    def config(self, **extra: Any) -> SwarlConfig:
        from swe.tasks.generated import PRACTICE_NAMES

        if self.o.arm not in ARMS:
            raise ConfigError(f"arm: one of {', '.join(ARMS)}, got {self.o.arm!r}")
        if self.o.practice_names not in PRACTICE_NAMES:  # before anything starts, not at the warm start
            raise ConfigError(f"practice names: one of {', '.join(PRACTICE_NAMES)}, got {self.o.practice_names!r}")
        if self.o.reading_demos < 0:
            raise ConfigError(f"reading demos: a count of demonstrations, got {self.o.reading_demos}")
        base = [f"run.dir={self.run_dir}", f"run.seed={self.o.seed}",
                *(["actor.prm.enable=true"] if self.o.prm else []),
                *(["learner.reward_shuffle=true"] if self.o.arm == "shuffled" else []),
                *([f"learner.max_steps={self.o.steps}"] if self.o.steps else []), *self.o.sets]
        base += [f"{k}={v}" for k, v in extra.items()]
        return load_config(self.o.config or CONFIG_DIR / "demo.yaml", base, environ={})

    def start_redis(self) -> str:
        self.redis = start_redis(self.run_dir / "redis", appendonly=True)
        self.say(f"private redis-server (AOF everysec) at {self.redis.url}")
        return self.redis.url

    def build_images(self) -> None:
        import docker

        from envd.images import build_task_images

        url = ensure_docker()
        os.environ["DOCKER_HOST"] = url
        self.say(f"Docker engine at {url}; building the bundled task images (cached)")
        client = docker.DockerClient(base_url=url, timeout=300)
        try:
            rows = ([] if self.o.train_pool else self.train_rows()) + [
                r for split in self.splits() for r in self.eval_rows(split)]
            rows = list({r["instance_id"]: r for r in rows}.values())
            build_task_images(client, rows, progress=True, on_image=self._image_progress(len(rows)))
        finally:
            client.close()
        if self.o.train_pool:  # while the warm start and the first evaluation run
            self.pool_images = threading.Thread(target=self._build_pool_images, args=(url,),
                                                name="pool-images", daemon=True)
            self.pool_images.start()

    def _build_pool_images(self, url: str) -> None:
        import docker

        from envd.images import build_task_images

        try:
            t0, rows = time.monotonic(), self.train_rows()
            built = [0]

            def on_image(image: str, new: bool) -> None:
                built[0] += int(new)
                if new and built[0] % 64 == 0:
                    self.say(f"train pool: {built[0]} images built, {time.monotonic() - t0:.0f}s")

            client = docker.DockerClient(base_url=url, timeout=300)
            try:
                build_task_images(client, rows, progress=False, on_image=on_image, stop=self.stopping.is_set)
            finally:
                client.close()
            self.say(f"train pool: {len(rows)} instances' images ready ({built[0]} built) "
                     f"in {time.monotonic() - t0:.0f}s")
        except BaseException as e:  # raised again where training waits for it
            self.pool_images_error = e

    async def wait_pool_images(self) -> None:
        """Training starts once every pool image exists (built in the background since set-up)."""
        if self.pool_images is None:
            return
        if self.pool_images.is_alive():
            self.say("waiting for the train pool's images")
        await asyncio.to_thread(self.pool_images.join)
        if self.pool_images_error is not None:
            raise self.pool_images_error

    def train_rows(self) -> list[dict[str, Any]]:
        """What RL trains on: the first `train_pool` pool instances (swe.tasks.generated.pool),
        or with train_pool 0 the fixed train split; `train_per_family` of each family."""
        from swe.tasks.generated import TRAIN_FAMILIES, pool_rows

        if not self.o.train_pool:
            return self.train_split_rows()
        n = self.o.train_pool
        if self.o.train_per_family:  # the pool's k-th instance is of family k mod 4
            n = min(n, self.o.train_per_family * len(TRAIN_FAMILIES))
        return per_family(pool_rows(n, POOL_SEED, cache_dir=CACHE / "pool"), self.o.train_per_family)

    def train_split_rows(self) -> list[dict[str, Any]]:
        from swe.tasks import load_tasks

        return per_family(load_tasks("train", suite=SUITE), self.o.train_per_family)

    def eval_rows(self, split: str) -> list[dict[str, Any]]:
        from swe.tasks import load_tasks

        if split == HANDWRITTEN:
            return per_family(load_tasks("all", suite="bundled"), self.o.eval_per_family)
        return per_family(load_tasks(split, suite=SUITE), self.o.eval_per_family)

    def splits(self) -> tuple[str, ...]:
        return (*EVAL_SPLITS, *((HANDWRITTEN,) if self.o.handwritten else ()))

    def _image_progress(self, total: int) -> Any:
        """A line per tenth of the images when stderr is not a terminal (rich draws nothing there)."""
        done = [0, 0]

        def on_image(image: str, built: bool) -> None:
            done[0] += 1
            done[1] += int(built)
            if not self.console.is_terminal and (done[0] == total or done[0] % max(1, total // 10) == 0):
                self.say(f"task images {done[0]}/{total} ({done[1]} built)")
        return on_image

    def model(self) -> Path:
        """Tiny model + supervised warm start, cached by seed and the demonstrations' hash."""
        from transformers import AutoTokenizer

        from actors.encoding import ChatEncoder
        from actors.templates import load_templates
        from inference.tiny_model import init_tiny
        from swarl.demo.warmstart import demonstrations, sft
        from swe.tasks.generated import demo_row, practice, reading_practice

        cfg = self.config()
        ws = self.o.seed if self.o.warm_seed is None else self.o.warm_seed
        base = init_tiny(self.run_dir / "model" / "base", seed=ws)
        templates = load_templates(cfg.actor.prompts)
        if self.o.sft_on == "practice":
            train: list[Any] = [(demo_row(i), i) for i in practice(self.o.sft_demos, seed=ws,
                                                                    names=self.o.practice_names)]
        elif self.o.sft_on == "train":
            train = self.train_split_rows()
        else:
            raise ValueError(f"sft_on: train or practice, got {self.o.sft_on!r}")
        train += [(demo_row(i), i) for i in reading_practice(self.o.reading_demos, seed=ws,
                                                             names=self.o.practice_names)]
        seqs = demonstrations(train, templates, ChatEncoder(AutoTokenizer.from_pretrained(base)),
                              cwd=cfg.actor.cwd, step_limit=cfg.actor.step_limit,
                              every_edit=self.o.sft_on == "train")
        self.warm_seqs = seqs  # the SFT control continues on them
        # the kernels too: the same seed trains another model under other float kernels (kernels.py)
        h = hashlib.sha256(json.dumps([seqs, self.o.sft_epochs, self.o.sft_lr, ws, kernels.in_force()]).encode()).hexdigest()[:16]
        cached = CACHE / "warmstart" / h
        out = self.run_dir / "model" / "warm"
        if not (cached / "model.safetensors").exists():
            import torch
            from rich.progress import Progress

            torch.set_num_threads(2)
            self.say(f"warm start: {len(seqs)} demonstrations of the procedure on {len(train)} {self.o.sft_on} "
                     f"instances, {self.o.sft_epochs} epoch(s) (cached in {cached})")
            t0 = time.monotonic()
            with Progress(console=self.console, transient=True) as prog:
                task = prog.add_task("supervised warm start", total=1)

                def tick(step: int, total: int, loss: float) -> None:
                    prog.update(task, total=total, completed=step, description=f"warm start loss {loss:.3f}")
                    if not self.console.is_terminal and (step == total or step % max(1, total // 20) == 0):
                        el = time.monotonic() - t0
                        self.say(f"warm start step {step}/{total}, loss {loss:.3f}, "
                                 f"{el / 60:.1f} min, about {el * (total - step) / step / 60:.1f} min left")

                tmp = cached.with_name(h + ".tmp")
                shutil.rmtree(tmp, ignore_errors=True)
                sft(base, tmp, seqs, epochs=self.o.sft_epochs, lr=self.o.sft_lr, seed=ws, progress=tick,
                    stop=self.stopping.is_set)
                tmp.rename(cached)
        else:
            self.say(f"warm start: cached model {cached}")
        shutil.copytree(cached, out, dirs_exist_ok=True)
        return out

    def start_services(self, redis_url: str, model: Path) -> dict[str, str]:
        exe = swarl_exe()
        common_env = {"SWARL_REDIS_URL": redis_url, "SWARL_ENVD_TOKEN": self.tokens["envd"],
                      "SWARL_INFERENCE_API_KEY": self.tokens["inference"],
                      "DOCKER_HOST": os.environ.get("DOCKER_HOST", "")}
        self.procs.env.update(common_env)
        cfg_path = self.write_config(redis_url, model, pool_url=None)
        envd_port, pool_port = free_port(), free_port()
        envd = self.procs.start("envd", [*exe, "envd", "serve", "--port", str(envd_port), "-c", cfg_path,
                                         "--node-id", "demo-node"], restart=RESTART)
        wait_http(f"http://127.0.0.1:{envd_port}/healthz", envd, 60,
                  headers={"Authorization": f"Bearer {self.tokens['envd']}"})
        pool_url = f"http://127.0.0.1:{pool_port}"
        pool = self.procs.start("pool", [*exe, "pool", "serve", "--port", str(pool_port), "-c", cfg_path,
                                         "--exec-urls", f"http://127.0.0.1:{envd_port}"], restart=RESTART)
        wait_http(f"{pool_url}/healthz", pool, 60, headers={"Authorization": f"Bearer {self.tokens['envd']}"})
        cfg_path = self.write_config(redis_url, model, pool_url)
        for i in range(self.o.servers):
            port = free_port()
            srv = self.procs.start(f"inference-{i}", [
                *exe, "inference", "serve", "--model", str(model), "--port", str(port), "-c", cfg_path,
                "--weight-version", "0", "--redis-url", redis_url, "--run-id", self.config().run.id,
                "--server-id", f"cpu-{i}"], restart=RESTART)
            url = f"http://127.0.0.1:{port}"
            wait_http(f"{url}/health", srv, 120, headers={"Authorization": f"Bearer {self.tokens['inference']}"})
            self.server_urls.append(url)
        if self.o.prm:  # the judge: the untrained tiny model, role prm (never pinned nor updated)
            port = free_port()
            srv = self.procs.start("judge", [
                *exe, "inference", "serve", "--model", str(model.parent / "base"), "--port", str(port),
                "-c", cfg_path, "--role", "prm", "--redis-url", redis_url, "--run-id", self.config().run.id,
                "--server-id", "prm-0"], restart=RESTART)
            wait_http(f"http://127.0.0.1:{port}/health", srv, 120,
                      headers={"Authorization": f"Bearer {self.tokens['inference']}"})
        self.say(f"envd, pool and {self.o.servers} CPU inference server(s) are up"
                 + (", and a PRM judge server (the tiny base model)" if self.o.prm else ""))
        return {"pool_url": pool_url, "config": cfg_path}

    def write_config(self, redis_url: str, model: Path, pool_url: str | None) -> str:
        cfg = self.config(**{"redis.url": redis_url, "inference.model": str(model),
                             "learner.model_dir": str(model), "actor.tokenizer": str(model),
                             **({"pool.url": pool_url} if pool_url else {})})
        path = self.run_dir / "config.yaml"
        path.write_text(yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False))
        return str(path)

    # -- evaluation --------------------------------------------------------------------
    async def evaluate(self, pool_url: str, server_url: str, tag: str) -> dict[str, list[dict[str, Any]]]:
        """Every split's episodes (results.jsonl rows) for the policy on `server_url`, with a
        progress line per tenth of the episodes. Seeded by the demo's seed: before, after and
        the control meet the same draws per (task, sample) — common random numbers — so their
        paired changes measure the policies, not the dice."""
        from actors.evaluate import EvalTarget, evaluate

        cfg = self.config()
        target = EvalTarget(server_url, self.tokens["inference"], pool_url, self.tokens["envd"])
        out: dict[str, list[dict[str, Any]]] = {}
        for split in self.splits():
            rows = self.eval_rows(split)
            total, got = len(rows) * self.o.eval_samples, list[dict[str, Any]]()
            t0 = time.monotonic()

            def on_result(res: dict[str, Any], split: str = split, total: int = total,
                          got: list[dict[str, Any]] = got, t0: float = t0) -> None:
                got.append(res)
                if len(got) % max(1, total // 10) == 0 and len(got) < total:
                    self.say(f"{tag}: {split} {len(got)}/{total} episodes, "
                             f"{sum(1 for g in got if g.get('resolved'))} resolved, {time.monotonic() - t0:.0f}s")

            out_dir = self.run_dir / "eval" / f"{tag}-{split}"
            summary = await evaluate(rows, target, out_dir, cfg.actor, max_concurrent=self.o.actors * self.o.concurrency,
                                     n_samples=self.o.eval_samples, on_result=on_result, seed=self.o.seed)
            out[split] = read_episodes(out_dir)
            self.say(f"{tag}: {split} resolve rate {summary['resolve_rate']:.3f} "
                     f"({summary['resolved']}/{summary['episodes']} episodes of {summary['instances']} tasks; "
                     f"errors {summary['errors']}) in {time.monotonic() - t0:.0f}s")
        return out

    def reuse_before(self, src: Path) -> dict[str, list[dict[str, Any]]]:
        """The "before" episodes of another run of the same seed and warm start (the shuffled
        arm's are the RL arm's: the same weights meet the same draws, which `--recheck` shows
        give the same episodes), copied into this run's eval/."""
        out: dict[str, list[dict[str, Any]]] = {}
        for split in self.splits():
            src_dir, dst = src / "eval" / f"before-{split}", self.run_dir / "eval" / f"before-{split}"
            if not (src_dir / "results.jsonl").is_file():
                raise ConfigError(f"before_from: {src_dir / 'results.jsonl'} is missing")
            shutil.copytree(src_dir, dst, dirs_exist_ok=True)
            out[split] = read_episodes(dst)
        self.say(f"before: the episodes of {src} (same seed, warm start and draws)")
        return out

    async def newest_server(self, redis_url: str) -> tuple[str, int]:
        """A server at the newest published version (bringing one there from disk if needed)."""
        from broker.connection import connect
        from broker.registry import PolicyRegistry, ServerRegistry
        from inference.client import SGLangClient

        r = connect(redis_url)
        try:
            keys = self.keys()
            current = await PolicyRegistry(r, keys).current()
            for s in await ServerRegistry(r, keys).list(alive_only=True):
                if s.version == current:
                    return s.url, current
            manifest = await PolicyRegistry(r, keys).manifest(current)
        finally:
            await r.aclose()
        url = self.server_urls[0]
        if manifest:
            client = SGLangClient(url, api_key=self.tokens["inference"])
            try:
                await client.update_weights_from_disk(manifest["path"], weight_version=str(current))
            finally:
                await client.aclose()
        return url, current

    # -- training ----------------------------------------------------------------------
    def start_training(self, cfg_path: str, pool_url: str) -> None:
        exe = swarl_exe()
        learner = [*exe, "learner", "-c", cfg_path]
        self.procs.start("learner", learner,
                         restart=dataclasses.replace(RESTART, args=(*learner, "--resume")))
        for i in range(self.o.actors):
            self.procs.start(f"actor-{i}", [*exe, "actor", "-c", cfg_path, "--concurrency",
                                            str(self.o.concurrency), "--pool-url", pool_url], restart=RESTART)

    def supervise(self) -> None:
        """One round of supervision: the private Redis (restarted on its port from its AOF when
        it died and nothing else took the port) and every child (common.procs.Restart)."""
        r = self.redis
        if r is not None and r.proc.poll() is not None:
            try:
                wait_port("127.0.0.1", r.port, timeout=0.2)  # restarted by hand meanwhile
            except TimeoutError:
                self.redis = start_redis(r.dir, port=r.port, appendonly=True)
                self.redis_restarts += 1
                self.note(f"redis-server exited with {r.proc.returncode}; restarted from its AOF")
        for event in self.procs.supervise():
            self.note(event)

    def note(self, event: str) -> None:
        self.events.append(f"{time.strftime('%H:%M:%S')} {event}")
        log.warning("supervision", what=event)

    def train_units(self) -> list[list[dict[str, Any]]]:
        """The train rows in learner groups: with pair_forms (and an even group size) each row
        with one of the other form of its symptom, half the group each — one baseline for both,
        so the advantages keep what reading the code changed and the symptom's share cancels —
        else each row alone."""
        from swe.tasks.generated import form_pairs

        rows = self.train_rows()
        if self.o.pair_forms and self.config().learner.n_samples_per_prompt % 2 == 0:
            return form_pairs(rows)
        return [[r] for r in rows]

    async def enqueue(self, redis_url: str, epochs: range) -> None:
        from broker.tasks import arq_pool, enqueue_jobs, epoch_order, jobs_for_group

        keys = self.keys()
        pool = await arq_pool(redis_url)
        try:
            n = self.config().learner.n_samples_per_prompt
            # shuffled per epoch: the split is sorted by family, and in order a short run
            # would train on one family only
            await enqueue_jobs(pool, keys, [j for unit, epoch in epoch_order(self.train_units(), epochs, seed=self.o.seed)
                                            for j in jobs_for_group(keys, unit, "swarl-tasks", n // len(unit), epoch)])
        finally:
            await pool.aclose()

    def tasks_seen(self) -> int:
        """How many distinct train tasks the actors ran episodes of (their trajectories)."""
        d = self.run_dir / "trajectories"
        ids = {r["instance_id"] for r in self.train_rows()}
        return len({p.name.rsplit("__", 1)[0] for p in d.iterdir()} & ids) if d.is_dir() else 0

    def metrics(self) -> list[dict[str, Any]]:
        """The learner's rows of metrics.jsonl, one per step (eval rows left out)."""
        from learner.metrics_log import EVAL_VERSION, read_metrics

        return [r for r in read_metrics(self.run_dir / "metrics.jsonl") if EVAL_VERSION not in r]

    async def train(self, redis_url: str, pool_url: str, cfg_path: str) -> int:
        from rich.live import Live
        from rich.table import Table

        from broker.connection import connect
        from broker.status import gather

        cfg = self.config()
        keys = self.keys()
        # about 768 jobs queued at first and 384 more whenever it runs low, in whole epochs: 4 and
        # 2 epochs of the 96-task split; 1 and 1 of a pool of 512 (each task met once an epoch)
        per_epoch = max(1, len(self.train_units()) * cfg.learner.n_samples_per_prompt)
        first, more = -(-768 // per_epoch), -(-384 // per_epoch)
        epochs_enqueued = first
        await self.enqueue(redis_url, range(epochs_enqueued))
        self.start_training(cfg_path, pool_url)
        t_end = time.monotonic() + self.o.minutes * 60
        r = connect(redis_url)

        async def status() -> dict[str, Any]:
            """Read the run's status, topping the queue up; during a Redis outage this waits
            (redis.outage_s) while the loop below goes on supervising."""
            nonlocal epochs_enqueued
            st = await gather(r, keys, cfg.replay, cfg.admission)
            if st["queue"]["depth"] < 48:  # keep the actors busy
                await self.enqueue(redis_url, range(epochs_enqueued, epochs_enqueued + more))
                epochs_enqueued += more
            return st

        def view(st: dict[str, Any], rows: list[dict[str, Any]], left: float, stale_s: float) -> Table:
            t = Table(title=f"swarl demo — {self.run_dir.name}", title_justify="left")
            t.add_column("what")
            t.add_column("value")
            last = rows[-1] if rows else {}
            recent = rows[-5:]
            rr = sum(x.get("resolve_rate", 0.0) for x in recent) / len(recent) if recent else 0.0
            t.add_row("time left", f"{max(0, left) / 60:.1f} min")
            t.add_row("learner step / policy version", f"{len(rows)} / {st['policy']['current']}")
            t.add_row("resolve rate (last 5 steps)", f"{rr:.3f}")
            t.add_row("reward mean (last step)", f"{last.get('reward_mean', 0.0):+.3f}")
            if last:  # what says whether RL is working (learner.diagnostics)
                t.add_row("RL diagnostics (last step)", describe(last))
            if st["learner"].get("warning"):
                t.add_row("learner warning", f"[bold red]{st['learner']['warning']}[/]")
            t.add_row("samples trained", str(sum(int(x.get("samples", 0)) for x in rows)))
            t.add_row("queue depth / running", f"{st['queue']['depth']} / {st['queue']['running']}")
            t.add_row("replay stream / pending", f"{st['stream']['length']} / {st['stream']['group'].get('pending', 0)}")
            t.add_row("servers", ", ".join(f"{s['id']}:v{s['version']}:{s['state']}" for s in st["servers"]
                                           if s.get("role", "policy") == "policy"))
            if self.o.prm:
                judges = [s for s in st["servers"] if s.get("role") == "prm"]
                t.add_row("PRM judges", ", ".join(f"{s['id']}:{s['state']}" for s in judges) or "none")
                t.add_row("PRM steps scored / judged (per episode)",
                          f"{last.get('agent/prm_steps_scored_mean', 0.0):.1f} / "
                          f"{last.get('agent/prm_steps_judged_mean', 0.0):.1f}")
                t.add_row("PRM votes invalid / failed / all",
                          f"{last.get('agent/prm_votes_invalid_mean', 0.0):.1f} / "
                          f"{last.get('agent/prm_votes_failed_mean', 0.0):.1f} / "
                          f"{last.get('agent/prm_votes_mean', 0.0):.1f}")
                t.add_row("PRM mean step score / outcome reward",
                          f"{last.get('agent/prm_step_score_mean_mean', 0.0):+.3f} / "
                          f"{last.get('agent/outcome_reward_mean', 0.0):+.3f}")
            t.add_row("actors", str(len(st["actors"])))
            t.add_row("samples/min", str(st["samples_per_min"]))
            tok = st.get("tokens") or {}
            if tok.get("generated"):  # every generated token: broker.status.tokens
                t.add_row("tokens generated / trained / in flight",
                          f"{tok['generated']} / {tok['trained']} / {tok['in_flight']}")
                t.add_row("tokens wasted", f"{tok['wasted_total']} ({100 * tok['wasted_fraction']:.1f}%)"
                          + (": " + ", ".join(f"{k} {v}" for k, v in tok["wasted"].items()) if tok["wasted"] else ""))
            t.add_row("processes", ", ".join(
                f"{p.name}:{p.state()}" + (f"(restarted {len(p.restarts)}x)" if p.restarts else "")
                for p in self.procs.procs))
            if stale_s > STATUS_STALE_S:
                t.add_row("status", f"[bold red]not read for {stale_s:.0f}s[/] (Redis away? clients "
                          f"retry for redis.outage_s={cfg.redis.outage_s:g}s)")
            for event in self.events[-4:]:
                t.add_row("supervision", event)
            return t

        st: dict[str, Any] | None = None
        reading: asyncio.Task[dict[str, Any]] | None = None
        read_at = time.monotonic()
        try:
            with Live(console=self.console, refresh_per_second=1) as live:
                said = time.monotonic()
                while (left := t_end - time.monotonic()) > 0:
                    if self.o.steps and len(self.metrics()) >= self.o.steps:
                        break  # equal compute across arms: the same learner steps, however busy the machine
                    if not self.console.is_terminal and st is not None and time.monotonic() - said >= 30:
                        said = time.monotonic()  # rich's Live draws nothing off a terminal: a line
                        m = self.metrics()
                        self.say(f"training: {max(0, left) / 60:.1f} min left, learner step {len(m)}, "
                                 f"policy v{st['policy']['current']}, "
                                 f"{sum(int(x.get('samples', 0)) for x in m)} samples trained, "
                                 f"rollout resolve rate {m[-1].get('resolve_rate', 0.0) if m else 0.0:.2f}")
                    self.supervise()
                    # one status read in flight at a time, never cancelled (a Redis outage only
                    # makes the shown status stale; supervision goes on)
                    if reading is None:
                        reading = asyncio.create_task(status())
                    if reading.done():
                        try:
                            st, read_at = reading.result(), time.monotonic()
                        except Exception as e:  # Redis away past redis.outage_s: try again
                            self.note(f"status read failed: {type(e).__name__}: {e}")
                        reading = None
                    if st is not None:
                        live.update(view(st, self.metrics(), left, time.monotonic() - read_at))
                    await asyncio.sleep(1.0)
        finally:
            if reading is not None:
                with contextlib.suppress(Exception):
                    await reading
            await r.aclose()
        return epochs_enqueued

    def stop_training(self) -> None:
        for p in self.procs.procs:
            if p.name.startswith("actor-"):
                p.signal(15)
        for p in self.procs.procs:
            if p.name.startswith("actor-"):
                p.stop(60)
        self.procs.stop("learner", 120)

    # -- the whole run -----------------------------------------------------------------
    async def run(self) -> dict[str, Any]:
        if (why := rollout_temperature_error(self.config())) is not None:
            raise ConfigError(why)  # before any process starts: the learner would refuse it
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.say(f"run directory {self.run_dir}")
        redis_url = self.start_redis()
        self.build_images()
        try:
            model = await asyncio.to_thread(self.model)
        except BaseException:  # Ctrl-C / SIGTERM: the thread stops at its next step, not at its end
            self.stopping.set()
            raise
        svc = self.start_services(redis_url, model)
        if self.o.before_from:
            before = self.reuse_before(Path(self.o.before_from))
        else:
            before = await self.evaluate(svc["pool_url"], self.server_urls[0], "before")
        await self.wait_pool_images()
        budget = (f"{self.o.steps} learner steps ({self.o.minutes:g} min at most)" if self.o.steps
                  else f"{self.o.minutes:g} min")
        self.say(f"training for {budget} with {self.o.actors} actors x {self.o.concurrency} "
                 f"episodes and {self.o.servers} inference server(s) on "
                 + (f"a pool of {len(self.train_rows())} fresh train instances" if self.o.train_pool
                    else f"the train split ({len(self.train_rows())} instances)"))
        await self.train(redis_url, svc["pool_url"], svc["config"])
        self.stop_training()
        url, version = await self.newest_server(redis_url)
        self.say(f"evaluating policy version {version} on {url}")
        after = await self.evaluate(svc["pool_url"], url, "after")
        rows = self.metrics()
        controls: dict[str, dict[str, list[dict[str, Any]]]] = {}
        if self.o.sft_control and self.o.arm == "rl":
            sft_dir = await asyncio.to_thread(self.sft_control, len(rows))
            ctrl_url = await self.load_server(sft_dir)
            self.say(f"SFT control ({len(rows)} more supervised steps on the warm start's data) on {ctrl_url}")
            controls["sft"] = await self.evaluate(svc["pool_url"], ctrl_url, "sft")
        recheck = None
        if self.o.recheck:  # determinism: the warm start's weights again, with the same draws
            ctrl_url = await self.load_server(self.run_dir / "model" / "warm")
            recheck = await self.evaluate(svc["pool_url"], ctrl_url, "recheck")
        learning = learning_report(before, after, controls, seed=self.o.seed,
                                   groups=task_groups([r for sp in self.splits() for r in self.eval_rows(sp)]))
        try:
            from learner.plot import plot_run
            from swarl.demo.report import plot_run_learning

            plots = [plot_run_learning(learning, rows, self.run_dir / "plots" / "learning.png"),
                     *plot_run(self.run_dir)]
            self.say(f"plots: {', '.join(str(p) for p in plots)}")
        except Exception as e:  # plotting must not lose the result
            log.warning("plot_failed", error=str(e))
        learning["arm"] = self.o.arm
        learning["before_from"] = self.o.before_from
        learning["choice"] = choice_summary(self.run_dir / "trajectories")
        learning["eval_choice"] = choice_evaluations(self.run_dir / "eval")
        if recheck is not None:
            learning["recheck_identical"] = {sp: _outcomes(before[sp]) == _outcomes(recheck[sp]) for sp in before}
        (self.run_dir / "learning.json").write_text(json.dumps(learning, indent=1) + "\n")
        self.say(learning_lines(learning))
        result = {**flat_result(learning),
                "samples_trained": sum(int(x.get("samples", 0)) for x in rows),
                "learner_steps": len(rows), "policy_version": version, "seed": self.o.seed,
                "train_pool": self.o.train_pool, "train_tasks_seen": self.tasks_seen(),
                "warm_seed": self.o.seed if self.o.warm_seed is None else self.o.warm_seed,
                "practice_names": self.o.practice_names, "reading_demos": self.o.reading_demos, "cpu_kernels": kernels.in_force(),
                "minutes": self.o.minutes, "steps_budget": self.o.steps, "prm": self.o.prm, "run_dir": str(self.run_dir), "arm": self.o.arm,
                "code": self.code,
                **({"recheck_identical": learning["recheck_identical"]} if recheck is not None else {}),
                "restarts": {p.name: len(p.restarts) for p in self.procs.procs if p.restarts}
                | ({"redis": self.redis_restarts} if self.redis_restarts else {})}
        (self.run_dir / "result.json").write_text(json.dumps(result) + "\n")  # for a summary of a partial --seeds run
        return result

    async def load_server(self, model_dir: Path) -> str:
        """A server (training is over) loaded with the weights in `model_dir` (the warm start, or
        the SFT control's); registered as version 0, which no one reads any more."""
        from inference.client import SGLangClient

        url = self.server_urls[-1]
        client = SGLangClient(url, api_key=self.tokens["inference"])
        try:
            await client.update_weights_from_disk(str(model_dir), weight_version="0")
        finally:
            await client.aclose()
        return url

    def sft_control(self, steps: int) -> Path:
        """The SFT control: the warm start's supervised training continued on its own
        demonstrations, from the warm weights, for as many optimizer steps as the learner took,
        with the learner's batch size (admission.batch_size) and learning rate — the same
        number of updates of the same size, on the procedure's data instead of rewards."""
        import torch

        from swarl.demo.warmstart import sft

        cfg = self.config()
        if steps == 0:
            return self.run_dir / "model" / "warm"
        torch.set_num_threads(2)
        out = self.run_dir / "model" / "sft-control"
        ws = self.o.seed if self.o.warm_seed is None else self.o.warm_seed
        sft(self.run_dir / "model" / "warm", out, self.warm_seqs, epochs=1 + steps * cfg.admission.batch_size
            // max(1, len(self.warm_seqs)), lr=cfg.learner.lr, batch_size=cfg.admission.batch_size,
            seed=ws + 1000 + self.o.seed, max_steps=max(1, steps), warmup=cfg.learner.warmup_steps, decay=False)
        return out

    def close(self) -> None:
        self.stopping.set()  # the pool's image builder stops after the image it is building
        if self.pool_images is not None:
            self.pool_images.join(30)
        self.procs.stop_all(30)
        if self.redis is not None:
            self.redis.stop()


def per_family(rows: list[dict[str, Any]], n: int | None) -> list[dict[str, Any]]:
    """The first `n` rows of each bug family (all with None), in the rows' order."""
    if n is None:
        return rows
    seen: dict[str, int] = {}
    out = []
    for r in rows:
        seen[r["swarl_family"]] = seen.get(r["swarl_family"], 0) + 1
        if seen[r["swarl_family"]] <= n:
            out.append(r)
    return out


def task_groups(rows: list[dict[str, Any]]) -> dict[str, dict[str, str]]:
    """task -> family and task -> code shape (family/form/layout; the hand-written suite has
    no shape: "-"), for the per-family and per-shape rows and the cluster bootstrap."""
    return {"family": {r["instance_id"]: r.get("swarl_family", "?") for r in rows},
            "shape": {r["instance_id"]: f"{r.get('swarl_family', '?')}:{r.get('swarl_shape', '-')}" for r in rows}}


def read_episodes(eval_dir: Path) -> list[dict[str, Any]]:
    """An evaluation's episodes (its results.jsonl, one JSON object a line)."""
    return [json.loads(x) for x in (eval_dir / "results.jsonl").read_text().splitlines() if x.strip()]


def _outcomes(results: list[dict[str, Any]]) -> list[tuple[str, int, bool]]:
    return sorted((r["instance_id"], int(r.get("sample", 0)), bool(r.get("resolved"))) for r in results)


def learning_report(before: dict[str, list[dict[str, Any]]], after: dict[str, list[dict[str, Any]]],
                    controls: dict[str, dict[str, list[dict[str, Any]]]] | None = None, seed: int = 0,
                    groups: dict[str, dict[str, str]] | None = None) -> dict[str, Any]:
    """Per split: rates before/after with 95% intervals (cluster bootstrap: families, then
    tasks), the change with its paired interval, per family and per code shape, each control's
    after and change (`controls`: name -> split -> episodes; "sft" in a demo run), and the
    outcome breakdowns."""
    from swarl.demo.stats import breakdown, by_group, change, rate

    fam = (groups or {}).get("family")
    shape = (groups or {}).get("shape", {})
    out: dict[str, Any] = {"seed": seed, "splits": {}}
    for split in before:
        b, a = before[split], after[split]
        d: dict[str, Any] = {
            "before": rate(b, seed, clusters=fam), "after": rate(a, seed, clusters=fam),
            "change": change(b, a, seed, clusters=fam),
            "per_family": by_group(b, a, fam or {}), "per_shape": by_group(b, a, shape),
            "outcomes": {"before": breakdown(b), "after": breakdown(a)}, "controls": {}}
        for name, ctrl in (controls or {}).items():
            d["controls"][name] = {"after": rate(ctrl[split], seed, clusters=fam),
                                   "change": change(b, ctrl[split], seed, clusters=fam),
                                   "per_family": by_group(b, ctrl[split], fam or {}),
                                   "outcomes": breakdown(ctrl[split])}
        out["splits"][split] = d
    return out


def flat_result(learning: dict[str, Any]) -> dict[str, Any]:
    """The JSON line's fields: `<split>_before` / `_after` (`heldout`: the held-out
    combinations), and per split the change's interval and each control's change."""
    out: dict[str, Any] = {}
    for split, d in learning["splits"].items():
        out[f"{split}_before"] = d["before"]["rate"]
        out[f"{split}_after"] = d["after"]["rate"]
        out[f"{split}_change"] = d["change"]["change"]
        out[f"{split}_change_ci"] = d["change"]["ci"]
        for name, c in d.get("controls", {}).items():
            out[f"{split}_{name}_change"] = c["change"]["change"]
            out[f"{split}_{name}_change_ci"] = c["change"]["ci"]
    if ch := learning.get("choice"):  # the train episodes' choice, first and last bin of versions
        out["choice_first"], out["choice_last"] = ch["first"]["share"], ch["last"]["share"]
    return out


def learning_lines(learning: dict[str, Any]) -> str:
    lines = [f"resolve rates, arm {learning.get('arm', 'rl')} (95% intervals, cluster bootstrap over families and tasks):"]
    for split, d in learning["splits"].items():
        ch = d["change"]
        line = (f"  {split:15s} {d['before']['rate']:.3f} -> {d['after']['rate']:.3f}  change {ch['change']:+.3f} "
                f"[{ch['ci'][0]:+.3f}, {ch['ci'][1]:+.3f}]")
        for name, c in d.get("controls", {}).items():
            line += f"  {name} control {c['change']['change']:+.3f} [{c['change']['ci'][0]:+.3f}, {c['change']['ci'][1]:+.3f}]"
        lines.append(line)
    if "choice" in learning:
        lines.append("  " + choice_line(learning["choice"]))
    ev = learning.get("eval_choice") or {}
    for split in learning["splits"]:
        evals = [(name, e) for name in ("before", "after", "sft") if (e := ev.get(f"{name}-{split}"))]
        shown = [f"{name} {e['share']:.2f}" for name, e in evals]
        named = [f"{name} {e['named']:.2f}" for name, e in evals if e.get("named") is not None]
        if shown:
            lines.append(f"  {split:15s} edit reads the line in the evaluation: {', '.join(shown)}"
                         + (f"; first reply names the issue's function: {', '.join(named)}" if named else ""))
    return "\n".join(lines)


def run_demo(opts: DemoOptions) -> dict[str, Any]:
    demo = Demo(opts)
    try:
        return asyncio.run(demo.run())
    finally:
        demo.close()


def run_seeds(opts: DemoOptions, seeds: list[int], arms: tuple[str, ...] = ARMS) -> dict[str, Any]:
    """Per seed, each arm (<run_dir>/seed-<s>/<arm>): the RL run (with its SFT control) and the
    shuffled-reward run, same seed, same warm start (cached), same minutes; then the summary
    across seeds: <run_dir>/learning-seeds.json and learning-seeds.png (swarl.demo.report)."""
    from swarl.demo.report import aggregate, plot

    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    base = Path(opts.run_dir or REPO_ROOT / "runs" / f"demo-seeds-{stamp}").resolve()
    runs: dict[str, list[dict[str, Any]]] = {arm: [] for arm in arms}
    for seed in seeds:
        for arm in arms:
            d = base / f"seed-{seed}" / arm
            first = base / f"seed-{seed}" / arms[0]
            result = run_demo(dataclasses.replace(opts, seed=seed, arm=arm, run_dir=str(d),
                                                  sft_control=opts.sft_control and arm == "rl",
                                                  before_from=str(first) if arm != arms[0] else None))
            print(json.dumps(result), flush=True)  # each run's line as it ends
            runs[arm].append({**json.loads((d / "learning.json").read_text()), "result": result})
    agg = aggregate(runs["rl"], runs.get("shuffled", []))
    (base / "learning-seeds.json").write_text(json.dumps({"aggregate": agg, "runs": runs}, indent=1) + "\n")
    plot(agg, base / "learning-seeds.png")
    out: dict[str, Any] = {"seeds": seeds, "run_dir": str(base)}
    for split, s in agg["splits"].items():
        out[f"{split}_before"] = s["before"]["mean"]
        out[f"{split}_after"] = s["after"]["mean"]
        for name in ("change", "sft_change", "shuffled_change"):
            if s.get(name):
                out[f"{split}_{name}"] = s[name]["mean"]
                out[f"{split}_{name}_ci"] = s[name]["ci"]
        out[f"{split}_change_ci_families"] = s["change_families"]["ci"]
    out["samples_trained"] = sum(r["result"]["samples_trained"] for r in runs["rl"]) // max(1, len(runs["rl"]))
    for arm, c in agg["choice"].items():  # the choice on the train episodes: rise, first bin to last
        out[f"choice_rise_{arm}"], out[f"choice_rise_{arm}_ci"] = c["rise"]["mean"], c["rise"]["ci"]
    out["goals"] = agg["goals"]
    return out
