"""The whole loop, assembled: a real redis-server, envd + pool with real containers, two
inference servers, two `swarl actor` processes and `swarl learner` with rolling weight sync.

Checked from Redis (the replay stream as the actors wrote it, the job sets, the registry) and
the learner's own records (trained.jsonl, metrics.jsonl), never from one component's counters:
versions advance; every trained sample's policy version is within max_staleness of the step
that trained it; no sample id is trained twice; every episode's turns carry one weight_version;
every enqueued job ends (done, or failed with its reason); every server ends at the newest
version; no container is left.

Two runs: CPU servers on the tiny model at max_staleness 1 (the learning path: real logprobs
and weights), and scripted servers with a latency profile at max_staleness 0, where the system
must be synchronous: exactly batch_size rollouts per version, each step trains on the complete
batch of the version before it.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis.asyncio as aioredis
from actor_services import actor_sets, calc_row, start_actor, write_config
from fixtures_inference import wait_for
from system_helpers import (
    StreamWatch,
    job_ids,
    metrics,
    start_swarl,
    swarl,
    trained,
    wait_jobs_ended,
)

from broker.keys import Keys
from broker.registry import ServerRegistry
from broker.status import _number, tokens
from broker.tasks import epoch_order
from common.procs import terminate
from inference.latency import ROW_FIELD, LatencyProfile

pytestmark = [pytest.mark.docker, pytest.mark.slow, pytest.mark.timeout(900)]
KEY = "system-loop-key"
KEYS = Keys("swarl", "test")


@dataclass
class Outcome:
    run_dir: Path
    watch: StreamWatch
    done: set[str]
    failed: dict[str, str]
    servers: list[Any]
    envd: Any
    current: int
    stats: dict[str, Any] = field(default_factory=dict)   # the stats hash at the end
    tokens: dict[str, Any] = field(default_factory=dict)  # broker.status.tokens of it


async def run_loop(tmp_path: Path, redis_url: str, envd_factory: Any, pool_factory: Any, servers: list[Any],
                   tokenizer: Path, rows: list[dict[str, Any]], n: int, epochs: int,
                   **sets: object) -> Outcome:
    envd = envd_factory()  # a node of this test's own: what it holds at the end is ours
    pool = pool_factory([envd.url], redis_url)
    run_dir = tmp_path / "run"
    cfg = write_config(tmp_path / "swarl.yaml", actor_sets(
        redis_url, run_dir, pool.url, pool.token, tokenizer, KEY,
        **{"actor.step_limit": 4, "actor.max_context_len": 2048, "inference.api_key": KEY,
           "learner.model_dir": str(tokenizer), "learner.n_samples_per_prompt": n,
           "learner.lr": 1e-3, "learner.threads": 1, "learner.tensorboard": False,
           "learner.group_timeout_s": 300, "learner.heartbeat_s": 1, "weight_sync.transport": "disk",
           "weight_sync.api_key": KEY, "weight_sync.keep_versions": 50,
           "weight_sync.poll_interval_s": 0.2, **sets}))
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    enq = await asyncio.to_thread(swarl, "enqueue", "-c", str(cfg), "--data", str(data), "--n-samples", str(n),
                                  "--epochs", str(epochs))
    assert enq.returncode == 0, enq.stderr
    ids = job_ids(KEYS, rows, n, epochs)
    watch = await StreamWatch(redis_url, KEYS).start()
    log = tmp_path / "learner.log"
    learner = start_swarl(log, "learner", "-c", str(cfg))
    actors = [start_actor(cfg, tmp_path / "actors", concurrency=2) for _ in range(2)]
    r = aioredis.Redis.from_url(redis_url, decode_responses=True)
    try:
        done, failed = await wait_jobs_ended(redis_url, KEYS, ids, [learner, *actors], within_s=600)

        async def settled() -> bool:
            # the learner has read every sample (each one consumed or held for a batch that
            # will not fill; not holding a step for running episodes: learner.hold)
            # and every server reports the newest version
            st = await r.hgetall(KEYS.learner_state)
            if int(st.get("consumed", 0)) + int(st.get("held", 0)) < len(watch.samples):
                return False
            if int(st.get("holding", 0)):
                return False
            current = int(await r.get(KEYS.policy_current) or 0)
            return all(s.version == current and s.state == "ready"
                       for s in await ServerRegistry(r, KEYS).list(alive_only=True))

        await wait_for(settled, within_s=180, every=0.5)
        assert learner.poll() is None, log.read_text()[-3000:]
        assert terminate(learner, 120) == 0, log.read_text()[-3000:]  # SIGTERM: a clean stop
    finally:
        await watch.stop()
        for a in actors:
            a.stop(60)
        terminate(learner, 60)
        current = int(await r.get(KEYS.policy_current) or 0)
        stats = {k: _number(v) for k, v in (await r.hgetall(KEYS.stats)).items()}
        listed = await r.zrange(KEYS.running_oldest, 0, -1)
        await r.aclose()
    assert not listed, listed  # every episode listed as running (broker.running) was unlisted
    return Outcome(run_dir, watch, done, failed, servers, envd, current, stats, tokens(stats))


async def check_invariants(o: Outcome, max_staleness: int, pinned: bool = True) -> list[tuple[int, list[str]]]:
    steps = trained(o.run_dir)
    assert len(steps) >= 2, steps
    # versions advance: one per step (update_every 1), published in order
    assert [s for s, _ in steps] == list(range(1, len(steps) + 1))
    assert [m["version"] for m in metrics(o.run_dir)] == list(range(1, len(steps) + 1))
    assert o.current == len(steps)
    # no sample trained twice; each one is a sample the actors wrote to the stream
    ids = [i for _, step_ids in steps for i in step_ids]
    assert len(ids) == len(set(ids))
    assert set(ids) <= set(o.watch.samples), sorted(set(ids) - set(o.watch.samples))[:5]
    # staleness: step k trains at learner version k - 1; the bound holds for every trained token
    for step, step_ids in steps:
        for i in step_ids:
            s = o.watch.samples[i]
            age = (step - 1) - s.policy_version
            assert 0 <= age <= max_staleness, (step, i, age)
            assert s.token_versions is not None
            gen = s.token_versions[(s.token_versions >= 0) & (s.loss_mask == 1)]
            if gen.size:  # (a sample whose only turn was a format error trains no token)
                assert (step - 1) - int(gen.min()) <= max_staleness, (step, i, gen.tolist())
                assert int(gen.min()) == s.policy_version, (i, gen.tolist(), s.policy_version)
    if not pinned:
        check_accounting(o, steps)
        return steps
    # one policy per episode: every turn's weight_version is the pinned version
    for ep_id, samples in o.watch.episodes().items():
        for s in samples:
            if s.masked:
                continue
            assert set(s.weight_versions) <= {str(s.policy_version)}, (ep_id, s.weight_versions)
        assert len({s.policy_version for s in samples}) == 1, ep_id
    # every job ended: done (its episode reached the stream) or failed for good with a reason
    assert o.done <= {s.episode_id for s in o.watch.samples.values()}
    for job, doc in o.failed.items():
        assert json.loads(doc).get("reason") or json.loads(doc).get("error"), (job, doc)
    # every server ends at the newest version; no container left on our envd node
    async with httpx.AsyncClient(timeout=10, headers={"Authorization": f"Bearer {KEY}"}) as http:
        for s in o.servers:
            got = (await http.get(f"{s.url}/model_info")).json()["weight_version"]
            assert str(got) == str(o.current), (s.url, got, o.current)
        status = (await http.get(f"{o.envd.url}/status",
                                 headers={"Authorization": f"Bearer {o.envd.token}"})).json()
    assert status["active_containers"] == 0, status
    return steps


def check_accounting(o: Outcome, steps: list[tuple[int, list[str]]]) -> None:
    """Every generated token accounted for (broker.status.tokens): the actors' side adds up
    exactly once every episode has ended; the learner's trained count is the trained samples'
    tokens in the loss, and what it has not decided is what it still holds."""
    st, t = o.stats, o.tokens
    actor_causes = ("stale_stopped", "group_closed", "masked", "infra", "interrupted", "error", "unsampled")
    assert t["generated"] > 0
    assert t["generated"] == t["written"] + sum(t["wasted"].get(c, 0) for c in actor_causes), t
    trained_ids = {i for _, ids in steps for i in ids}
    in_loss = sum(int(((s.token_versions >= 0) & (s.loss_mask == 1)).sum())
                  for i, s in o.watch.samples.items() if i in trained_ids and s.token_versions is not None)
    assert t["trained"] == in_loss, (t, in_loss)
    learner_side = t["trained"] + sum(v for k, v in t["wasted"].items() if k not in actor_causes)
    held = t["written"] - learner_side
    assert held >= 0, t
    assert t["in_flight"] == held, t  # nothing left in an episode: only what the learner holds
    assert st["tokens_generated"] == t["generated"]


@pytest.mark.long  # make test keeps the synchronous whole loop below
async def test_whole_loop_tiny_model(redis_url, envd_factory, pool_factory, cpu_server_factory,
                                     tiny_model_dir, test_image, tmp_path) -> None:
    """CPU servers on the tiny model (real sampling, real weight loads), max_staleness 1."""
    servers = [cpu_server_factory.start(tiny_model_dir, redis_url=redis_url, run_id="test", api_key=KEY)
               for _ in range(2)]
    rows = [calc_row(test_image, n) for n in range(1, 4)]
    o = await run_loop(tmp_path, redis_url, envd_factory, pool_factory, servers, tiny_model_dir, rows,
                       n=2, epochs=2, **{"actor.step_limit": 2, "actor.sampling.max_new_tokens": 24,
                                         "admission.batch_size": 4, "admission.max_staleness": 1,
                                         "learner.entropy_coef": 0.01})
    await check_invariants(o, max_staleness=1)


async def test_max_staleness_zero_is_synchronous(redis_url, envd_factory, pool_factory, cpu_server_factory,
                                                 tiny_model_dir, test_image, tmp_path) -> None:
    """Scripted servers with a heavy-tailed latency profile; max_staleness 0, 4 actor slots, batch 4:
    every version gets exactly one batch of rollouts, and the learner steps on that batch whole.

    One episode's first request fails (server 0 answers HTTP 500 once): its job goes back to the
    queue behind the next version's jobs. It used to wait there forever: its admission slot went
    back, the next version's jobs took every actor slot waiting for admission, and the batch
    only ended at learner.group_timeout_s. The retry must run, and the batch complete, well
    before that."""
    rows = [calc_row(test_image, n, "fix" if n % 2 else "wrong") for n in range(1, 5)]
    profile = json.dumps({"turns_median": 2, "turns_sigma": 0.5, "max_turns": 4,
                          "token_s_median": 0.01, "token_s_sigma": 0.75})
    servers = [cpu_server_factory.start_scripted(tiny_model_dir, rows, redis_url=redis_url, run_id="test",
                                                 api_key=KEY, server_id=f"scripted-{i}",
                                                 extra_args=["--latency-profile", profile,
                                                             "--fail-episodes", "1" if i == 0 else "0"])
               for i in range(2)]
    batch = 4
    t0 = time.monotonic()
    o = await run_loop(tmp_path, redis_url, envd_factory, pool_factory, servers, tiny_model_dir, rows,
                       n=2, epochs=1, **{"actor.step_limit": 6, "admission.batch_size": batch,
                                         "admission.max_staleness": 0, "learner.group_timeout_s": 600})
    assert time.monotonic() - t0 < 300, "a batch waited for its group timeout"
    async with httpx.AsyncClient(timeout=10, headers={"Authorization": f"Bearer {KEY}"}) as http:
        faults = (await http.get(f"{servers[0].url}/swarl/faults")).json()["failed"]
    assert len(faults) == 1 and faults[0] in o.done, (faults, o.done)  # it failed, ran again, ended
    assert not o.failed, o.failed
    steps = await check_invariants(o, max_staleness=0)
    assert len(steps) == len(o.done) // batch  # every rollout trained: nothing stale, nothing left
    assert len(steps) >= 2  # a version boundary was crossed (8 episodes, batch 4)
    by_version: dict[int, set[str]] = {}
    for s in o.watch.samples.values():
        by_version.setdefault(s.policy_version, set()).add(s.episode_id)
    # exactly one batch of rollouts per version, and step k trains the whole batch of version k-1
    assert {v: len(eps) for v, eps in by_version.items()} == {v: batch for v in range(len(steps))}
    for step, step_ids in steps:
        assert {o.watch.samples[i].episode_id for i in step_ids} == by_version[step - 1]
    assert all(not k.startswith("dropped/stale") for m in metrics(o.run_dir) for k in m)
    # the profile was applied: episodes of several lengths, with delays drawn per episode
    async with httpx.AsyncClient(timeout=10, headers={"Authorization": f"Bearer {KEY}"}) as http:
        drawn = {k: v for s in servers for k, v in (await http.get(f"{s.url}/swarl/latency")).json()["episodes"].items()}
    assert set(drawn) >= o.done
    assert len({len(eps) for eps in o.watch.episodes().values()}) > 1


async def test_in_flight_versions_change_under_running_episodes(redis_url, envd_factory, pool_factory,
                                                                cpu_server_factory, tiny_model_dir,
                                                                test_image, tmp_path) -> None:
    """weight_sync.rollout_mode in-flight, max_staleness 2, scripted servers: servers are updated
    under running episodes (no drain), so episodes see the version change between turns. No
    trained token is staler than the bound, nothing is trained twice, and every generated token
    is accounted for.

    The overlap is built, not hoped for (make test once failed here: with episodes about as long
    as a loaded machine's learner step, every update landed between episodes). In queue order
    the groups are A, B, C, D; the four slots take A and B. A and C answer fast (2 turns at
    0.01 s a token); B and D fix a slow draw of their own (inference.latency.ROW_FIELD: 6 turns
    at 0.2 s a token, some 30 s of generation). A's step publishes version 1 while B runs: it
    trains two short episodes (6 s on this machine under a demo's load, and the servers have it
    a few seconds later). B, at version 0, is left behind only by version 3, which needs B's own
    group or D's, and D starts after A's step. So B sees the change and is trained (at
    max_staleness 1, C's step would stop it first). Pinned rollout would fail this.
    """
    rows = [calc_row(test_image, n, "fix" if n % 2 else "wrong") for n in range(1, 5)]
    order = [r["instance_id"] for r, _ in epoch_order(rows, [0])]  # swarl enqueue's order
    slow = {order[1], order[3]}
    for r in rows:
        if r["instance_id"] in slow:
            r[ROW_FIELD] = {"turns": 6, "token_s": 0.2}
    profile = LatencyProfile(turns_median=2, turns_sigma=0, token_s_median=0.01, token_s_sigma=0)
    servers = [cpu_server_factory.start_scripted(tiny_model_dir, rows, redis_url=redis_url, run_id="test",
                                                 api_key=KEY, server_id=f"scripted-{i}",
                                                 extra_args=["--latency-profile", profile.model_dump_json()])
               for i in range(2)]
    o = await run_loop(tmp_path, redis_url, envd_factory, pool_factory, servers, tiny_model_dir, rows,
                       n=2, epochs=1, **{"actor.step_limit": 10, "admission.batch_size": 2,
                                         "admission.max_staleness": 2, "weight_sync.rollout_mode": "in-flight"})
    steps = await check_invariants(o, max_staleness=2, pinned=False)
    assert len(steps) >= 2
    seen: dict[str, list[int]] = {}
    for ep_id, samples in o.watch.episodes().items():
        for s in samples:
            versions = [int(v) for v in s.weight_versions]
            assert versions == sorted(versions), (ep_id, versions)  # a turn never older than the last
            seen[ep_id] = max(seen.get(ep_id, []), versions, key=len)
    b = {e: v for e, v in seen.items() if KEYS.group_of(e) == KEYS.group_id(order[1], 0)}
    step_s = [round(m["step_time_s"], 1) for m in metrics(o.run_dir) if "step_time_s" in m]
    assert len(b) == 2 and all(len(set(v)) > 1 for v in b.values()), \
        f"B's episodes did not see the version change: {seen}; steps took {step_s} s"
