"""The GPU path on CPU stand-ins, assembled: `swarl learner --nproc-per-node 2` (torchrun, gloo)
trains from a replay stream that two `swarl actor` processes fill with episodes run in real
containers (envd + pool) against two CPU inference servers — one of them joining weight-update
groups as tensor-parallel size 2 — and publishes every version over the distributed transport.

Checked from Redis and the run's own files: the learner group has exactly one consumer, every
sample id is trained once (and is a sample the actors produced), and every weight version a
server reports carries exactly the checksum of the learner's checkpoint of that version; both
servers end at the last version, which differs from the base weights."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import pytest
import redis as redis_sync
from actor_services import actor_sets, calc_row, start_actor, write_config
from fixtures_envd import TEST_IMAGE
from system_helpers import start_swarl, swarl, trained

from broker.keys import Keys
from common.procs import terminate
from inference.weights import checksum, read_safetensors_dir

pytestmark = [pytest.mark.docker, pytest.mark.slow, pytest.mark.timeout(1200)]
KEY = "system-test-key"
STEPS = 3


async def _watch(urls: list[str], out: dict[str, set[tuple[str, str]]], stop: asyncio.Event) -> None:
    """Record every (weight version, checksum) each server reports, twice a second."""
    async with httpx.AsyncClient(timeout=30, headers={"Authorization": f"Bearer {KEY}"}) as http:
        while not stop.is_set():
            for url in urls:
                try:
                    got = (await http.get(f"{url}/swarl/weights_checksum")).json()
                    out[url].add((got["weight_version"], got["sha256"]))
                except (httpx.HTTPError, KeyError, ValueError):
                    pass  # a server busy loading answers on the next round
            await asyncio.sleep(0.5)


async def test_two_rank_learner_with_actors_and_a_tp2_server(
        redis_url, envd_factory, pool_factory, cpu_server_factory, tiny_model_dir, test_image,
        tmp_path) -> None:
    assert test_image == TEST_IMAGE
    envd_server = envd_factory()  # a node of this test's own: what it holds at the end is ours
    pool = pool_factory([envd_server.url], redis_url)
    servers = [cpu_server_factory.start(tiny_model_dir, redis_url=redis_url, run_id="test",
                                        api_key=KEY, extra_args=["--tp-size", str(tp)])
               for tp in (2, 1)]
    run_dir = tmp_path / "run"
    cfg = write_config(tmp_path / "swarl.yaml", actor_sets(
        redis_url, run_dir, pool.url, pool.token, tiny_model_dir, KEY,
        **{"actor.step_limit": 2, "actor.sampling.max_new_tokens": 24, "actor.max_context_len": 2048,
           "admission.batch_size": 4, "admission.max_staleness": 2, "inference.api_key": KEY,
           "learner.model_dir": str(tiny_model_dir), "learner.n_samples_per_prompt": 2,
           "learner.max_steps": STEPS, "learner.lr": 1e-3, "learner.entropy_coef": 0.01,
           "learner.threads": 1, "learner.tensorboard": False, "learner.group_timeout_s": 120,
           "weight_sync.transport": "distributed", "weight_sync.backend": "gloo",
           "weight_sync.api_key": KEY, "weight_sync.wait_rollout": True,
           "weight_sync.keep_versions": 50, "weight_sync.drain_timeout_s": 60,
           "weight_sync.drain_timeout_action": "proceed"}))
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps(calc_row(test_image, n)) + "\n" for n in range(1, 5)))
    enq = await asyncio.to_thread(swarl, "enqueue", "-c", str(cfg), "--data", str(rows), "--n-samples", "2",
                                  "--epochs", "3")
    assert enq.returncode == 0, enq.stderr
    log = tmp_path / "learner.log"
    learner = start_swarl(log, "learner", "-c", str(cfg), "--nproc-per-node", "2")
    actors = [start_actor(cfg, tmp_path / "actors", concurrency=2) for _ in range(2)]
    seen: dict[str, set[tuple[str, str]]] = {s.url: set() for s in servers}
    stop = asyncio.Event()
    watcher = asyncio.create_task(_watch([s.url for s in servers], seen, stop))
    try:
        deadline = time.monotonic() + 900
        while learner.poll() is None:
            assert time.monotonic() < deadline, log.read_text()[-4000:]
            for a in actors:
                assert a.proc.poll() is None, a.log()[-3000:]
            await asyncio.sleep(1)
        assert learner.returncode == 0, log.read_text()[-4000:]
        await asyncio.sleep(1.5)  # one more look at every server
    finally:
        stop.set()
        await watcher
        for a in actors:
            a.stop(60)
        terminate(learner, 60)

    keys = Keys("swarl", "test")
    r = redis_sync.Redis.from_url(redis_url)
    consumers = r.xinfo_consumers(keys.replay, "learner")
    assert [c["name"] for c in consumers] == [b"learner-0"]  # rank 0 alone read the stream
    steps = trained(run_dir)
    assert [s for s, _ in steps] == list(range(1, STEPS + 1))
    ids = [i for _, step_ids in steps for i in step_ids]
    assert len(ids) == len(set(ids))  # every sample once
    assert all(i.startswith("test:swarl-test__calc-") for i in ids), ids[:5]
    written = {k.decode(): float(v) for k, v in r.hgetall(keys.stats).items()}  # some are float totals
    assert written.get("samples_written", 0) >= len(ids)

    # every version a server reported is the learner's checkpoint of that version, bit for bit
    sums = {"0": checksum(read_safetensors_dir(tiny_model_dir))}
    for v in range(1, STEPS + 1):
        sums[str(v)] = checksum(read_safetensors_dir(run_dir / "weights" / f"v{v:06d}"))
    assert len(set(sums.values())) == STEPS + 1  # the weights moved at every step
    for url, pairs in seen.items():
        for version, sha in pairs:
            assert sums.get(version) == sha, (url, version)
        assert max(int(v) for v, _ in pairs) == STEPS, (url, sorted(pairs))
    async with httpx.AsyncClient(timeout=10) as http:
        info = (await http.get(f"{servers[0].url}/get_server_info",
                               headers={"Authorization": f"Bearer {KEY}"})).json()
        assert info.get("tp_size") == 2
        # no container left behind
        status = (await http.get(f"{envd_server.url}/status",
                                 headers={"Authorization": f"Bearer {envd_server.token}"})).json()
    assert status["active_containers"] == 0, status
