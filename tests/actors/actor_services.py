"""Helpers for the actors' service tests: the scripted policy server and `swarl actor` as real
subprocesses, a task row for the envd test image, and a config pointing at all of it."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from common.procs import Child
from common.services import free_port
from swarl.config import load_config

REPO = Path(__file__).resolve().parents[2]
# beside this interpreter, not <repo>/.venv: a worktree has no .venv of its own
SWARL = str(Path(sys.executable).parent / "swarl")

EVAL_SCRIPT = """cd /testbed
echo '>>>>> Start Test Output'
if python3 -c 'from calc import add; assert add(2, 3) == 5'; then echo 'PASSED test_calc.py::test_add'; else echo 'FAILED test_calc.py::test_add'; fi
echo '>>>>> End Test Output'
"""


def calc_row(image: str, n: int = 1, mode: str | None = None) -> dict:
    row = {
        "instance_id": f"swarl-test__calc-{n}", "repo": "swarl-test/calc", "image_name": image,
        "base_commit": "HEAD", "version": "0",
        "problem_statement": f"[calc-{n}] add(2, 3) returns -1: add() subtracts instead of adding.",
        "FAIL_TO_PASS": '["test_calc.py::test_add"]', "PASS_TO_PASS": "[]",
        "eval_script": EVAL_SCRIPT,
        "swarl_fix_command": "sed -i 's/a - b/a + b/' calc.py",
        "swarl_wrong_commands": ["sed -i 's/a - b/a * b/' calc.py"],
    }
    if mode:
        row["swarl_scripted_mode"] = mode
    return row


def payload(row: dict, group: int = 0, index: int = 0, n: int = 1) -> dict:
    iid = row["instance_id"]
    return {"instance": row, "group_id": f"{iid}:g{group}", "sample_index": index, "n_samples": n,
            "data_source": "swarl-test", "job_id": f"test:{iid}:g{group}:s{index}"}


@dataclass
class Proc(Child):
    url: str = ""
    api_key: str = ""


def start_scripted(tokenizer: Path, rows: list[dict], redis_url: str, log_dir: Path,
                   mode: str = "fix", version: str = "0", sleep_s: int = 30,
                   extra_args: list[str] | None = None) -> Proc:
    port, key = free_port(), secrets.token_hex(8)
    log_dir.mkdir(parents=True, exist_ok=True)
    tasks = log_dir / f"tasks-{port}.jsonl"
    tasks.write_text("".join(json.dumps(r) + "\n" for r in rows))
    log_path = log_dir / f"scripted-{port}.log"
    with open(log_path, "wb") as logf:
        proc = subprocess.Popen(
            [sys.executable, "-m", "swarl.cli", "scripted-policy", "serve", "--tokenizer", str(tokenizer),
             "--mode", mode, "--port", str(port), "--weight-version", version,
             "--tasks", str(tasks), "--redis-url", redis_url, "--run-id", "test",
             "--sleep-s", str(sleep_s), *(extra_args or [])],
            stdout=logf, stderr=subprocess.STDOUT, cwd=REPO, start_new_session=True,
            env={**os.environ, "SWARL_INFERENCE_API_KEY": key, "TOKENIZERS_PARALLELISM": "false"})
    p = Proc(proc, log_path, url=f"http://127.0.0.1:{port}", api_key=key)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"scripted server exited:\n{p.log()}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{p.url}/health", headers={"Authorization": f"Bearer {key}"},
                         timeout=2).status_code == 200:
                return p
        time.sleep(0.1)
    p.kill()
    raise RuntimeError(f"scripted server not healthy:\n{p.log()}")


def start_actor(config_path: Path, log_dir: Path, concurrency: int = 1) -> Proc:
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"actor-{time.time_ns()}.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("SWARL_")}
    with open(log_path, "wb") as logf:
        proc = subprocess.Popen([SWARL, "actor", "--config", str(config_path), "-k", str(concurrency)],
                                stdout=logf, stderr=subprocess.STDOUT, cwd=REPO,
                                start_new_session=True, env={**env, "TOKENIZERS_PARALLELISM": "false"})
    return Proc(proc, log_path)


def actor_sets(redis_url: str, run_dir: Path, pool_url: str, pool_token: str, tokenizer: Path,
               api_key: str, **extra: object) -> list[str]:
    sets = {
        "redis.url": redis_url, "run.id": "test", "run.dir": str(run_dir), "pool.url": pool_url,
        "envd.token": pool_token, "actor.tokenizer": str(tokenizer),
        "actor.inference_api_key": api_key, "actor.step_limit": 4, "actor.exec_timeout_s": 30,
        "actor.pin_wait_s": 10, "actor.allocate_wait_s": 30, "actor.max_context_len": 4096,
        "actor.heartbeat_s": 1, "queue.max_tries": 2, "queue.claim_ttl_s": 10,
        "queue.claim_renew_s": 1, "queue.poll_delay_s": 0.2, "admission.batch_size": 64,
        **extra,
    }
    return [f"{k}={json.dumps(v) if isinstance(v, str) else v}" for k, v in sets.items()]


def actor_config(sets: list[str]):
    return load_config(None, sets, environ={})


def write_config(path: Path, sets: list[str]) -> Path:
    import yaml

    cfg = actor_config(sets)
    path.write_text(yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False))
    return path
