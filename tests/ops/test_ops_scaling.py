"""Scaling with real processes: a second `swarl actor` joins a running run (nothing restarts,
twice the episodes run at once), and stopping it mid-episode loses no work.

Real parts: redis-server, dockerd + envd + pool (fixtures), the scripted policy server
(SGLang API, registered in Redis), `swarl enqueue` and two `swarl actor` processes.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import redis
import yaml
from polling import wait_until

from broker.keys import ARQ_IN_PROGRESS_PREFIX, Keys
from common.procs import Child
from common.services import free_port
from swarl.config import load_config

REPO = Path(__file__).resolve().parents[2]
SWARL = str(Path(sys.executable).parent / "swarl")
N_INSTANCES, N_SAMPLES = 3, 2

pytestmark = [pytest.mark.docker, pytest.mark.slow]

EVAL_SCRIPT = """cd /testbed
echo '>>>>> Start Test Output'
if python3 -c 'from calc import add; assert add(2, 3) == 5'; then echo 'PASSED test_calc.py::test_add'; else echo 'FAILED test_calc.py::test_add'; fi
echo '>>>>> End Test Output'
"""


def calc_row(image: str, n: int) -> dict:
    """A task on the envd test image (calc.py subtracts instead of adding)."""
    return {
        "instance_id": f"swarl-test__calc-{n}", "repo": "swarl-test/calc", "image_name": image,
        "base_commit": "HEAD", "version": "0", "patch": "", "test_patch": "",
        "problem_statement": f"[calc-{n}] add(2, 3) returns -1: add() subtracts instead of adding.",
        "FAIL_TO_PASS": '["test_calc.py::test_add"]', "PASS_TO_PASS": "[]",
        "eval_script": EVAL_SCRIPT, "swarl_fix_command": "sed -i 's/a - b/a + b/' calc.py",
    }


def spawn(args: list[str], log: Path, env: dict[str, str]) -> Child:
    return Child.spawn(args, log, env, cwd=REPO)


def wait_for(pred, timeout: float, what: str, procs: list[Child]) -> None:
    """polling.wait_until, failing at once with its log when a child process exits."""
    def alive() -> None:
        for p in procs:
            if p.proc.poll() is not None:
                raise AssertionError(f"{p.proc.args[:3]} exited {p.proc.returncode} while waiting "
                                     f"for {what}:\n{p.log()[-3000:]}")
    wait_until(pred, timeout, lambda: what + "\n" + "\n".join(p.log()[-2000:] for p in procs), check=alive)


def test_actor_joins_and_leaves_mid_run(redis_url, pool_server, test_image, tiny_model_dir, tmp_path):
    keys = Keys("swarl", "test")
    r = redis.Redis.from_url(redis_url, decode_responses=True)
    rows = [calc_row(test_image, n) for n in range(1, N_INSTANCES + 1)]
    data = tmp_path / "tasks.jsonl"
    data.write_text("".join(json.dumps(x) + "\n" for x in rows))
    base_env = {k: v for k, v in os.environ.items() if not k.startswith("SWARL_")}
    base_env["TOKENIZERS_PARALLELISM"] = "false"
    procs: list[Child] = []
    try:
        # the policy: scripted SGLang-API server, registered in Redis as ready
        key, port = secrets.token_hex(8), free_port()
        server = spawn([sys.executable, "-m", "swarl.cli", "scripted-policy", "serve", "--tokenizer",
                       str(tiny_model_dir), "--mode", "fix", "--port", str(port), "--tasks", str(data),
                       "--redis-url", redis_url, "--run-id", "test"], tmp_path / "server.log",
                      {**base_env, "SWARL_INFERENCE_API_KEY": key})
        procs.append(server)
        wait_for(lambda: _healthy(f"http://127.0.0.1:{port}", key), 60, "the scripted server", procs)

        sets = {"redis.url": redis_url, "run.id": "test", "run.dir": str(tmp_path / "run"),
                "pool.url": pool_server.url, "envd.token": pool_server.token,
                "actor.tokenizer": str(tiny_model_dir), "actor.inference_api_key": key,
                "actor.step_limit": 4, "actor.exec_timeout_s": 30, "actor.pin_wait_s": 20,
                "actor.allocate_wait_s": 60, "actor.heartbeat_s": 1, "actor.shutdown_grace_s": 0,
                "actor.save_trajectories": False, "queue.max_tries": 3, "queue.claim_ttl_s": 5,
                "queue.claim_renew_s": 1, "queue.poll_delay_s": 0.2, "admission.batch_size": 64,
                # no episode grades past its slot: an actor's jobs (counted below by arq's
                # claims) are then its concurrency, and a second actor is what adds one
                "actor.grading_concurrency": 0}
        cfg = load_config(None, [f"{k}={json.dumps(v) if isinstance(v, str) else v}"
                                 for k, v in sets.items()], environ={})
        cfg_path = tmp_path / "run.yaml"
        cfg_path.write_text(yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False))

        def enqueue(rows_: list[dict]) -> None:
            part = tmp_path / f"part-{rows_[0]['instance_id']}.jsonl"
            part.write_text("".join(json.dumps(x) + "\n" for x in rows_))
            p = subprocess.run([SWARL, "enqueue", "--data", str(part), "--n-samples",
                                str(N_SAMPLES), "--config", str(cfg_path)], capture_output=True,
                               text=True, timeout=120, env=base_env, cwd=REPO)
            assert p.returncode == 0, p.stderr

        total = N_INSTANCES * N_SAMPLES
        enqueue(rows[:1])
        assert r.zcard(keys.queue) == N_SAMPLES

        def in_flight() -> int:
            return sum(1 for _ in r.scan_iter(f"{ARQ_IN_PROGRESS_PREFIX}test:*", count=500))

        def done() -> int:
            return r.scard(keys.jobs_done)

        actor = [SWARL, "actor", "--config", str(cfg_path), "-k", "1"]
        a = spawn(actor, tmp_path / "actor-a.log", base_env)
        procs.append(a)
        wait_for(lambda: in_flight() == 1, 120, "actor A's first job", procs)
        alone = []
        for _ in range(10):
            alone.append(in_flight())
            time.sleep(0.1)
        assert max(alone) <= 1, "one actor with concurrency 1 ran more than one job"

        # a second actor joins the running run and more work arrives: nothing restarts, and
        # two jobs run at once (enqueued after B is up, so A cannot have drained the queue)
        b = spawn(actor, tmp_path / "actor-b.log", base_env)
        procs.append(b)
        wait_for(lambda: len(r.smembers(keys.actors)) == 2, 120, "actor B registered", procs)
        enqueue(rows[1:])
        wait_for(lambda: in_flight() == 2, 120, "two jobs in flight", procs)
        assert a.proc.poll() is None and server.proc.poll() is None

        # stop B while it holds a job: the job goes back to the queue and A finishes everything
        rc = b.stop()
        procs.remove(b)
        assert rc in (0, -signal.SIGTERM), b.log()[-3000:]
        wait_for(lambda: done() == total, 300, f"all {total} jobs done", procs)
        assert r.hlen(keys.jobs_failed) == 0, r.hgetall(keys.jobs_failed)
        # a job is marked done with its samples, and arq removes its queue entry and claim a
        # moment later (its finish): the queue drains just after the last done mark, not with it
        wait_for(lambda: r.zcard(keys.queue) == 0 and in_flight() == 0, 60, "the queue drained", procs)
        assert a.proc.poll() is None, "actor A was restarted or died"

        # every job reached the replay stream
        from broker.wire import decode

        raw = redis.Redis.from_url(redis_url)
        samples = [decode(f[b"s"]) for _, f in raw.xrange(keys.replay)]
        raw.close()
        episodes = {(s.group_id, s.sample_index) for s in samples}
        assert len(episodes) == total
        assert {s.reward for s in samples} == {1.0}  # the scripted fix resolves every task
    finally:
        for p in reversed(procs):
            p.stop()
        r.close()


def _healthy(url: str, key: str) -> bool:
    try:
        return httpx.get(f"{url}/health", headers={"Authorization": f"Bearer {key}"},
                         timeout=2).status_code == 200
    except httpx.HTTPError:
        return False
