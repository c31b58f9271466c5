"""Evaluation during training on the whole loop: a real redis-server, envd + pool with real
containers, a CPU policy server and a CPU eval server (role eval) on the tiny model, two `swarl
actor` processes, `swarl learner` with rolling weight sync, and `swarl eval-worker`.

Every published version is evaluated (eval.every_versions 1) while the learner trains on. Each
result is tagged with the version it ran on, and the test proves the tag from outside the worker:
the eval server's /model_info weight_version, polled by the test all along, equals the tag at
every moment between the version's first and last episode, and every turn of every eval episode
was answered at that version (the server's own weight_version per /generate). Meanwhile training
is not blocked: every enqueued job ends, actors write samples while an evaluation is under way, the eval server is never pinned nor updated by weight sync, and each
result is in metrics.jsonl keyed by its version."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import httpx
import pytest
import redis.asyncio as aioredis
from actor_services import actor_sets, calc_row, start_actor, write_config
from fixtures_inference import wait_for
from system_helpers import StreamWatch, job_ids, metrics, start_swarl, trained, wait_jobs_ended

from broker.evals import EvalBoard
from broker.keys import Keys
from broker.registry import PolicyRegistry, ServerRegistry
from common.procs import terminate

pytestmark = [pytest.mark.docker, pytest.mark.slow, pytest.mark.timeout(900)]
KEY = "system-eval-key"
KEYS = Keys("swarl", "test")


async def test_versions_are_evaluated_on_exactly_their_weights_while_training_goes_on(
        redis_url, envd_factory, pool_factory, cpu_server_factory, tiny_model_dir, test_image, tmp_path) -> None:
    envd = envd_factory()
    pool = pool_factory([envd.url], redis_url)
    policy_server = cpu_server_factory.start(tiny_model_dir, redis_url=redis_url, run_id="test", api_key=KEY,
                                             server_id="policy-0")
    eval_server = cpu_server_factory.start(tiny_model_dir, redis_url=redis_url, run_id="test", api_key=KEY,
                                           server_id="eval-0", extra_args=["--role", "eval"])
    run_dir = tmp_path / "run"
    eval_rows = tmp_path / "eval-rows.jsonl"
    eval_set = [calc_row(test_image, n) for n in range(11, 15)]
    eval_rows.write_text("".join(json.dumps(r) + "\n" for r in eval_set))
    cfg = write_config(tmp_path / "swarl.yaml", actor_sets(
        redis_url, run_dir, pool.url, pool.token, tiny_model_dir, KEY,
        **{"actor.step_limit": 2, "actor.sampling.max_new_tokens": 24, "actor.max_context_len": 2048,
           "inference.api_key": KEY, "learner.model_dir": str(tiny_model_dir), "learner.n_samples_per_prompt": 2,
           "learner.lr": 1e-3, "learner.threads": 1, "learner.tensorboard": False, "learner.group_timeout_s": 300,
           "learner.heartbeat_s": 1, "weight_sync.transport": "disk", "weight_sync.api_key": KEY,
           "weight_sync.keep_versions": 50, "weight_sync.poll_interval_s": 0.2, "admission.batch_size": 4,
           "admission.max_staleness": 1,
           # the eval set runs one episode at a time: an evaluation outlasts a training step
           "eval.every_versions": 1, "eval.rows": str(eval_rows), "eval.n_samples": 1,
           "eval.max_concurrent": 1, "eval.poll_interval_s": 0.5}))
    rows = [calc_row(test_image, n) for n in range(1, 4)]
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    enq = start_swarl(tmp_path / "enqueue.log", "enqueue", "-c", str(cfg), "--data", str(data),
                      "--n-samples", "2", "--epochs", "2")
    assert await asyncio.to_thread(enq.wait, 120) == 0, (tmp_path / "enqueue.log").read_text()
    ids = job_ids(KEYS, rows, 2, 2)

    r = aioredis.Redis.from_url(redis_url, decode_responses=True)
    # (time, the eval server's weight_version, the published version, samples the actors wrote)
    seen: list[tuple[float, str, int, int]] = []
    stop = asyncio.Event()

    async def poll() -> None:
        async with httpx.AsyncClient(timeout=5, headers={"Authorization": f"Bearer {KEY}"}) as http:
            while not stop.is_set():
                try:
                    got = str((await http.get(f"{eval_server.url}/model_info")).json()["weight_version"])
                except httpx.HTTPError:
                    got = "?"  # busy: no sample this round
                seen.append((time.time(), got, int(await r.get(KEYS.policy_current) or 0),
                             int(await r.hget(KEYS.stats, "samples_written") or 0)))
                await asyncio.sleep(0.1)

    poller = asyncio.create_task(poll())
    watch = await StreamWatch(redis_url, KEYS).start()
    learner = start_swarl(tmp_path / "learner.log", "learner", "-c", str(cfg))
    evaler = start_swarl(tmp_path / "eval-worker.log", "eval-worker", "-c", str(cfg))
    actors = [start_actor(cfg, tmp_path / "actors", concurrency=2) for _ in range(2)]
    board = EvalBoard(r, KEYS)
    try:
        done, failed = await wait_jobs_ended(redis_url, KEYS, ids, [learner, evaler, *actors], within_s=600)
        assert done == ids, failed

        async def settled() -> bool:
            # the learner has read every sample and the policy server is at the newest version
            st = await r.hgetall(KEYS.learner_state)
            if int(st.get("consumed", 0)) + int(st.get("held", 0)) < len(watch.samples):
                return False
            if int(st.get("holding", 0)):  # a step waits for running episodes (straggler grace)
                return False
            cur = int(await r.get(KEYS.policy_current) or 0)
            return all(s.version == cur and s.state == "ready"
                       for s in await ServerRegistry(r, KEYS).list(alive_only=True, role="policy"))

        await wait_for(settled, within_s=180, every=0.5)
        current = await PolicyRegistry(r, KEYS).current()
        assert current >= 2, current

        async def all_evaluated() -> bool:
            return set(await board.results()) >= set(range(1, current + 1))

        await wait_for(all_evaluated, within_s=300, every=1.0)
        assert evaler.poll() is None, (tmp_path / "eval-worker.log").read_text()[-3000:]
        results = await board.results()
        eval_pins = await ServerRegistry(r, KEYS).pin_count("eval-0")
        eval_entry = await ServerRegistry(r, KEYS).get("eval-0")
    finally:
        stop.set()
        await poller
        await watch.stop()
        for a in actors:
            a.stop(60)
        code = terminate(evaler, 60)
        terminate(learner, 120)
        await r.aclose()
    assert code == 0, (tmp_path / "eval-worker.log").read_text()[-3000:]  # SIGTERM: a clean stop

    evaluated = {v: res for v, res in results.items() if res["status"] == "done"}
    assert len(evaluated) >= 2, results
    manifests = {v: json.loads((run_dir / "weights" / f"v{v:06d}" / "manifest.json").read_text())
                 for v in evaluated}
    overlapped = False
    for v, res in evaluated.items():
        # the tag: loaded, checked before and after, and every turn at v
        assert res["weight_version_before"] == res["weight_version_after"] == str(v), res
        assert res["turn_versions"] == [str(v)], res
        out = Path(res["out_dir"])
        ep_rows = [json.loads(x) for x in (out / "results.jsonl").read_text().splitlines()]
        assert len(ep_rows) == len(eval_set) and res["summary"]["episodes"] == len(eval_set)
        for row in ep_rows:
            assert not row.get("error"), row
            assert row["weight_versions"] == [str(v)], row
        # the proof from outside: the eval server reported v all through the episodes
        window = [x for x in seen if res["started"] <= x[0] <= res["finished"]]
        assert len(window) >= 3, (v, res["started"], res["finished"])
        assert {x[1] for x in window} <= {str(v), "?"}, (v, sorted({x[1] for x in window}))
        assert any(x[1] == str(v) for x in window)
        # training went on meanwhile: actors wrote samples (or the learner published) during it
        overlapped |= any(max(x[i] for x in window) > min(x[i] for x in window) for i in (2, 3))
        assert res["step"] == manifests[v]["step"]
    assert overlapped, ("no sample written, no version published while an evaluation ran: training waited",
                        {v: (res["started"], res["finished"]) for v, res in evaluated.items()},
                        [x for x in seen if x is seen[0] or x[2:] != seen[seen.index(x) - 1][2:]])
    # the policy server went on to the newest version; the eval server was never pinned, and
    # weight sync never touched it (only the eval worker's loads moved it)
    async with httpx.AsyncClient(timeout=10, headers={"Authorization": f"Bearer {KEY}"}) as http:
        assert (await http.get(f"{policy_server.url}/model_info")).json()["weight_version"] == str(current)
    assert eval_pins == 0 and eval_entry is not None and eval_entry.role == "eval"
    assert "server_updated server=eval-0" not in (tmp_path / "learner.log").read_text()
    # every step trained; the eval rows sit in metrics.jsonl keyed by version
    assert len(trained(run_dir)) == current
    rows_by_version = {m["eval_version"]: m for m in metrics(run_dir) if "eval_version" in m}
    assert set(rows_by_version) == set(evaluated)
    for v, res in evaluated.items():
        assert rows_by_version[v]["eval/resolve_rate"] == res["summary"]["resolve_rate"]
        assert rows_by_version[v]["step"] == res["step"]
    assert [m["version"] for m in metrics(run_dir) if "eval_version" not in m] == list(range(1, current + 1))
