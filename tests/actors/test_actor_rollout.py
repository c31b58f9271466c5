"""Episodes against the real services: Redis (admission, pins, replay), the envd pool on a real
Docker engine, and policies served over SGLang's HTTP API (scripted server, CPU tiny model)."""

from __future__ import annotations

import asyncio
import json
import time

import numpy as np
import pytest
from actor_services import actor_config, actor_sets, calc_row, payload, start_scripted

from actors.protocols import InfraError
from actors.rollout import Rollouts
from broker.connection import connect
from broker.keys import Keys
from broker.registry import ServerRegistry
from broker.replay import ReplayReader
from swarl.wiring import actor_runtime

pytestmark = [pytest.mark.docker]
KEYS = Keys("swarl", "test")


async def _replay(r) -> list:
    reader = ReplayReader(r, KEYS, group="check", consumer="t")
    await reader.ensure_group()
    out = []
    while batch := await reader.read(count=256, block_ms=50):
        out += batch
    return [e.sample for e in out]


async def test_scripted_fix_resolves_and_wrong_fix_is_minus_one(scripted, pool_server, redis_url,
                                                                tiny_model_dir, tmp_path, test_image):
    server, (fix_row, wrong_row) = scripted
    cfg = actor_config(actor_sets(redis_url, tmp_path / "run", pool_server.url, pool_server.token,
                                  tiny_model_dir, server.api_key))
    r = connect(redis_url)
    ro = Rollouts(actor_runtime(cfg), r, actor_id="actor-t")
    try:
        res_fix, res_wrong = await asyncio.gather(ro.run(payload(fix_row)), ro.run(payload(wrong_row)))
        assert res_fix["resolved"] and res_fix["reward"] == 1.0, res_fix
        assert not res_wrong["resolved"] and res_wrong["reward"] == -1.0, res_wrong
        samples = await _replay(r)
        assert len(samples) == 4  # two steps each: the edit, then the submission
        by_job = {}
        for s in samples:
            by_job.setdefault(s.episode_id, []).append(s)
        fix = sorted(by_job[payload(fix_row)["job_id"]], key=lambda s: s.step_index)
        assert [s.sample_id for s in fix] == [f"{payload(fix_row)['job_id']}:{k}" for k in (0, 1)]
        assert all(s.reward == 1.0 and s.policy_version == 0 and s.status == "completed" for s in fix)
        assert fix[1].weight_versions == ["0", "0"] and fix[0].metrics["eval_time"] > 0
        # pins and leases released, admission slots kept (samples were produced)
        reg = ServerRegistry(r, KEYS)
        (info,) = await reg.list()
        assert info.pins == 0
        status = await ro.pool.status()
        assert status["leases"] == 0
        assert int(await r.get(KEYS.admission_started)) == 2
        # trajectory artifacts
        dirs = sorted((tmp_path / "run" / "trajectories").iterdir())
        assert len(dirs) == 2 and all((d / "traj.json").exists() and (d / "patch.diff").exists()
                                      and (d / "meta.json").exists() for d in dirs)
        assert any("a + b" in (d / "patch.diff").read_text() for d in dirs)
        # a second run of a done job is skipped (at-least-once delivery)
        await r.sadd(KEYS.jobs_done, payload(fix_row)["job_id"])
        assert (await ro.run(payload(fix_row)))["skipped"]
    finally:
        await ro.aclose()
        await r.aclose()


async def test_the_pin_holds_the_turns_not_the_grading(scripted, pool_server, redis_url,
                                                       tiny_model_dir, tmp_path, test_image):
    """A draining server waits for its pins to end: an episode lets go of its server once its
    last turn is generated, and grades its patch (a fresh container, the repo's tests) after."""

    server, (fix_row, _) = scripted
    # tests that take 2 s: on a quiet machine grading alone can take under 0.5 s, too close to
    # the registry polls' own jitter to tell "after" from "during"
    fix_row = {**fix_row, "eval_script": fix_row["eval_script"].replace("cd /testbed\n", "cd /testbed\nsleep 2\n", 1)}
    assert "sleep 2" in fix_row["eval_script"]
    cfg = actor_config(actor_sets(redis_url, tmp_path / "run", pool_server.url, pool_server.token,
                                  tiny_model_dir, server.api_key))
    r = connect(redis_url)
    reg = ServerRegistry(r, KEYS)
    ro = Rollouts(actor_runtime(cfg), r, actor_id="actor-t")
    try:
        task = asyncio.create_task(ro.run(payload(fix_row)))
        pinned_at = unpinned_at = None
        while not task.done():
            (info,) = await reg.list()
            if info.pins and pinned_at is None:
                pinned_at = time.monotonic()
            if not info.pins and pinned_at is not None and unpinned_at is None:
                unpinned_at = time.monotonic()
            await asyncio.sleep(0.02)
        done_at = time.monotonic()
        assert (await task)["resolved"]
        assert pinned_at is not None and unpinned_at is not None
        eval_time = (await _replay(r))[0].metrics["eval_time"]
        assert eval_time > 2.0
        # before this, the pin lasted until the samples were written: milliseconds from the end
        assert done_at - unpinned_at >= 0.8 * eval_time, (done_at - unpinned_at, eval_time)
        assert (await reg.list())[0].pins == 0
        # its listing's durations (broker.running, for the learner's hold rule): to its end, the
        # grading part from its last turn
        from broker.running import RunningEpisodes

        ((total, grading, ended),) = await RunningEpisodes(r, KEYS).ended()
        assert ended and grading is not None and 0.8 * eval_time <= grading < total
    finally:
        await ro.aclose()
        await r.aclose()


async def test_the_next_episode_generates_while_one_grades(scripted, pool_server, redis_url,
                                                          tiny_model_dir, tmp_path, test_image):
    """One generation slot, two jobs (arq's max_jobs is concurrency + grading_concurrency): the
    second takes the slot once the first has written its last turn, not once it has graded; two
    never generate at once; the slot's busy seconds leave grading out."""
    server, (fix_row, _) = scripted
    fix_row = {**fix_row, "eval_script": fix_row["eval_script"].replace("cd /testbed\n", "cd /testbed\nsleep 3\n", 1)}
    cfg = actor_config(actor_sets(redis_url, tmp_path / "run", pool_server.url, pool_server.token,
                                  tiny_model_dir, server.api_key))
    r = connect(redis_url)
    reg = ServerRegistry(r, KEYS)
    ro = Rollouts(actor_runtime(cfg), r, actor_id="actor-t", slots=1)
    try:
        t0 = time.monotonic()
        first = asyncio.create_task(ro.run(payload(fix_row, group=0)))
        await asyncio.sleep(0.2)  # the first job takes the slot
        second = asyncio.create_task(ro.run(payload(fix_row, group=1)))
        ended: dict[str, float] = {}
        first.add_done_callback(lambda _: ended.setdefault("first", time.monotonic()))
        pins: list[tuple[float, list[str]]] = []  # (when, the server's pin ids)
        while not (first.done() and second.done()):
            (info,) = await reg.list()
            held = await r.zrange(KEYS.server_pins(info.id), 0, -1)
            pins.append((time.monotonic(), [p.decode() for p in held]))
            await asyncio.sleep(0.02)
        assert (await first)["resolved"] and (await second)["resolved"]
        samples = await _replay(r)
        eval_time = min(s.metrics["eval_time"] for s in samples)
        assert eval_time > 3.0
        assert max(len(ids) for _, ids in pins) == 1, "two episodes generated at once on one slot"
        # the second episode's pin came while the first graded: well before the first ended
        second_pinned = min(t for t, ids in pins if any(":g1:" in i for i in ids))
        assert second_pinned < ended["first"] - 0.5 * eval_time, (
            second_pinned - t0, ended["first"] - t0, eval_time)
        busy = float(await r.hget(KEYS.stats, "rollout_busy_s"))
        walls = sum(s.metrics["total_time"] for s in samples)
        assert busy < walls - 2 * 0.8 * eval_time, (busy, walls, eval_time)
    finally:
        await ro.aclose()
        await r.aclose()


@pytest.mark.parametrize("eta", [0, 2])
async def test_an_episode_the_learner_can_no_longer_train_is_stopped(
        redis_url, tiny_model_dir, pool_server, tmp_path, test_image, eta: int) -> None:
    """Its policy is at version 0; once version max_staleness + 1 is published its samples could
    only be dropped. The episode (a 20 s command) is stopped within seconds: one masked sample
    (its group completes), the job done, slot, pin and container given back. At version
    max_staleness it runs on: its samples may still be trained."""

    from broker.registry import PolicyRegistry
    from broker.running import RunningEpisodes

    row = calc_row(test_image, 3, "sleep")
    server = start_scripted(tiny_model_dir, [row], redis_url, tmp_path / "logs", mode="sleep", sleep_s=20)
    cfg = actor_config(actor_sets(redis_url, tmp_path / "run", pool_server.url, pool_server.token,
                                  tiny_model_dir, server.api_key, **{"admission.max_staleness": eta}))
    r = connect(redis_url)
    reg, policies = ServerRegistry(r, KEYS), PolicyRegistry(r, KEYS)
    ro = Rollouts(actor_runtime(cfg), r, actor_id="actor-t")
    try:
        task = asyncio.create_task(ro.run(payload(row)))
        while not (await reg.list())[0].pins:
            assert not task.done(), task.result()
            await asyncio.sleep(0.05)
        # listed as running from its version (broker.running: the learner's straggler grace)
        running = RunningEpisodes(r, KEYS)
        assert await running.at_risk(0) == (1, 0)
        if eta:
            await policies.publish(eta, {})  # still trainable: nothing happens
            await asyncio.sleep(2.5)
            assert not task.done()
            # refreshed while it runs: a listing older than 2 s would be a dead actor's
            assert (await RunningEpisodes(r, KEYS, ttl_s=2.0).at_risk(0))[0] == 1
            # with the tokens its server generated so far, still generating
            (ep,) = await running.snapshot()
            assert ep.tokens > 0 and ep.graded_for_s is None and ep.elapsed_s >= 2.0
        await policies.publish(eta + 1, {})
        t0 = time.monotonic()
        res = await asyncio.wait_for(task, 15)
        assert time.monotonic() - t0 < 5, "not stopped: it ran its 20 s command"
        assert res == {"masked": True, "reason": "stale", "version": 0}
        (s,) = await _replay(r)
        assert s.masked and s.mask_reason == "abandoned:stale" and s.policy_version == 0
        assert s.loss_mask.sum() == 0 and s.steps_total == 1
        assert await r.sismember(KEYS.jobs_done, payload(row)["job_id"])
        assert int(await r.get(KEYS.admission_started) or 0) == 0
        assert (await reg.list())[0].pins == 0
        assert (await ro.pool.status())["leases"] == 0
        assert ro.totals["episodes_abandoned_stale"] == 1
        assert await running.count() == 0  # unlisted once its masked sample was written
        ((_, grading, ended),) = await running.ended()
        assert grading is None and not ended  # stopped: a censored duration, not a short one
    finally:
        await ro.aclose()
        await r.aclose()
        server.stop()


async def test_a_member_of_a_group_the_learner_closed_is_stopped_or_never_starts(
        redis_url, tiny_model_dir, pool_server, tmp_path, test_image) -> None:
    """The learner trained (or dropped) a group without its straggler and marked it closed
    (Admission.forfeit): the straggler still running (a 20 s command) is stopped within seconds,
    and a member not started yet never starts. Each ends as one masked sample, the job done,
    slot, pin and container given back; a member of another group runs on."""
    from broker.admission import Admission

    row = calc_row(test_image, 6, "sleep")
    server = start_scripted(tiny_model_dir, [row], redis_url, tmp_path / "logs", mode="sleep", sleep_s=20)
    cfg = actor_config(actor_sets(redis_url, tmp_path / "run", pool_server.url, pool_server.token,
                                  tiny_model_dir, server.api_key, **{"admission.max_staleness": 2}))
    r = connect(redis_url)
    reg = ServerRegistry(r, KEYS)
    ro = Rollouts(actor_runtime(cfg), r, actor_id="actor-t")
    straggler, other = payload(row, group=1, index=0, n=2), payload(row, group=2, index=0, n=2)
    try:
        tasks = [asyncio.create_task(ro.run(p)) for p in (straggler, other)]
        while (await reg.list())[0].pins < 2:
            assert not any(t.done() for t in tasks), [t.result() for t in tasks if t.done()]
            await asyncio.sleep(0.05)
        await Admission(r, KEYS, cfg.admission).forfeit(straggler["group_id"])
        t0 = time.monotonic()
        res = await asyncio.wait_for(tasks[0], 15)
        assert time.monotonic() - t0 < 5, "not stopped: it ran its 20 s command"
        assert res == {"masked": True, "reason": "group_closed", "version": 0}
        assert not tasks[1].done()  # another group's member runs on
        tasks[1].cancel()
        with pytest.raises(asyncio.CancelledError):
            await tasks[1]
        # its sibling, not started yet, never starts: no admission slot, no container
        late = await asyncio.wait_for(ro.run(payload(row, group=1, index=1, n=2)), 15)
        assert late == {"masked": True, "reason": "group_closed", "version": 0}
        samples = await _replay(r)
        assert sorted(s.episode_id for s in samples) == sorted(
            [straggler["job_id"], payload(row, group=1, index=1, n=2)["job_id"]])
        assert all(s.masked and s.mask_reason == "abandoned:group_closed" and s.loss_mask.sum() == 0
                   for s in samples)
        for p in (straggler, payload(row, group=1, index=1, n=2)):
            assert await r.sismember(KEYS.jobs_done, p["job_id"])
        # each group's first member reserved 2 slots; group 1's forfeit handed back its unstarted
        # sibling's, the straggler gave its own back, and the late sibling took none; group 2's
        # cancelled member (arq runs it again) keeps its slot, and one stays reserved for group
        # 2's second member
        assert int(await r.get(KEYS.admission_started) or 0) == 2
        assert await r.exists(KEYS.admission_job(other["job_id"]))
        assert not await r.exists(KEYS.admission_job(straggler["job_id"]))
        assert (await reg.list())[0].pins == 0
        assert (await ro.pool.status())["leases"] == 0
        assert ro.totals["episodes_abandoned_group_closed"] == 2
    finally:
        await ro.aclose()
        await r.aclose()
        server.stop()


@pytest.mark.timeout(60)  # the failure this guards against is a hang
async def test_a_cancellation_lost_in_a_redis_call_does_not_hang_the_episodes_end(
        redis_url, tiny_model_dir, tmp_path) -> None:
    """redis-py now and then swallows a cancellation that lands inside a command (#2028/#2551).
    The watch for staleness is cancelled when its episode ends, so it must not read Redis
    itself (it once did, and a job hung after its episode was done): one poller per process
    reads the version and is stopped by an event."""
    cfg = actor_config(actor_sets(redis_url, tmp_path / "run", "http://127.0.0.1:9", "tok",
                                  tiny_model_dir, "key", **{"admission.max_staleness": 1}))
    r = connect(redis_url)
    ro = Rollouts(actor_runtime(cfg), r, actor_id="actor-t")
    real = ro.policies.current

    async def swallowing() -> int:  # a slow read that loses a cancellation, as redis-py can
        while True:
            try:
                await asyncio.sleep(1.0)
                return await real()
            except asyncio.CancelledError:
                continue

    async def episode() -> str:
        await asyncio.sleep(0.2)
        return "done"

    ro.policies.current = swallowing  # type: ignore[method-assign]
    try:
        for _ in range(3):
            assert await asyncio.wait_for(ro._unless_stale(0, "g", episode()), 5) == ("done", "")
    finally:
        await asyncio.wait_for(ro.aclose(), 5)
        await r.aclose()


SLOW_TURNS = json.dumps({"turns_median": 1, "turns_sigma": 0, "token_s_median": 0.1, "token_s_sigma": 0})


def _record_calls(monkeypatch, events: list) -> None:
    """Record when the real policy and pool clients are called (the calls themselves go through)."""
    from actors.backends import ServerPolicy
    from envd.client import EnvdClient

    def timed(name, fn):
        async def call(*a, **k):
            t0 = time.monotonic()
            try:
                return await fn(*a, **k)
            finally:
                events.append((name, t0, time.monotonic()))
        return call

    monkeypatch.setattr(ServerPolicy, "generate", timed("generate", ServerPolicy.generate))
    monkeypatch.setattr(EnvdClient, "allocate", timed("allocate", EnvdClient.allocate))


@pytest.mark.parametrize("ahead", [True, False])
async def test_the_container_is_leased_while_the_first_turn_is_written(
        redis_url, tiny_model_dir, pool_server, tmp_path, test_image, monkeypatch, ahead: bool) -> None:
    """actor.lease_ahead: the first turn needs only the issue, so the pool creates the episode's
    container while the policy writes it (a slow server: 0.1 s a token); off, the turn waits."""
    row = calc_row(test_image, 4)
    server = start_scripted(tiny_model_dir, [row], redis_url, tmp_path / "logs",
                            extra_args=["--latency-profile", SLOW_TURNS])
    events: list = []
    _record_calls(monkeypatch, events)
    cfg = actor_config(actor_sets(redis_url, tmp_path / "run", pool_server.url, pool_server.token,
                                  tiny_model_dir, server.api_key, **{"actor.lease_ahead": ahead}))
    r = connect(redis_url)
    ro = Rollouts(actor_runtime(cfg), r, actor_id="actor-t")
    try:
        assert (await ro.run(payload(row)))["resolved"]
        (alloc,) = [e for e in events if e[0] == "allocate"]
        first = min((e for e in events if e[0] == "generate"), key=lambda e: e[1])
        assert first[2] - first[1] > 1.0, first   # the slow turn the lease hides behind
        if ahead:
            assert alloc[1] < first[1] + 0.5, (alloc, first)
        else:
            assert alloc[2] <= first[1], (alloc, first)
        assert (await ro.pool.status())["leases"] == 0
    finally:
        await ro.aclose()
        await r.aclose()
        server.kill()


async def test_an_episode_stopped_while_its_lease_is_made_closes_it(
        redis_url, tiny_model_dir, pool_server, tmp_path, test_image) -> None:
    """Cancelled during its first (slow) turn, with the allocation under way or done: the lease
    is still closed and its container removed."""
    row = calc_row(test_image, 5)
    server = start_scripted(tiny_model_dir, [row], redis_url, tmp_path / "logs",
                            extra_args=["--latency-profile", SLOW_TURNS])
    cfg = actor_config(actor_sets(redis_url, tmp_path / "run", pool_server.url, pool_server.token,
                                  tiny_model_dir, server.api_key))
    r = connect(redis_url)
    ro = Rollouts(actor_runtime(cfg), r, actor_id="actor-t")
    try:
        for delay in (0.05, 1.5):
            task = asyncio.create_task(ro.run(payload(row, group=int(delay * 100))))
            await asyncio.sleep(delay)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            status = await ro.pool.status()
            assert status["leases"] == 0, (delay, status)
    finally:
        await ro.aclose()
        await r.aclose()
        server.kill()


async def test_envd_outage_gives_no_minus_one(scripted, redis_url, tiny_model_dir, tmp_path):
    from common.services import free_port

    server, (fix_row, _) = scripted
    dead_pool = f"http://127.0.0.1:{free_port()}"
    cfg = actor_config(actor_sets(redis_url, tmp_path / "run", dead_pool, "tok", tiny_model_dir,
                                  server.api_key, **{"queue.max_tries": 2}))
    r = connect(redis_url)
    ro = Rollouts(actor_runtime(cfg), r, actor_id="actor-t")
    try:
        with pytest.raises(InfraError, match="allocate_failed"):
            await ro.run(payload(fix_row), job_try=1)   # arq will retry it
        assert await _replay(r) == []
        # the job keeps its slot for the retry (no other job may take it meanwhile)
        assert int(await r.get(KEYS.admission_started) or 0) == 1
        assert await r.exists(KEYS.admission_job(payload(fix_row)["job_id"]))
        res = await ro.run(payload(fix_row), job_try=2)                # the last try
        assert res["masked"]
        # the last try took the kept slot, wrote a masked sample and gave the slot back
        assert int(await r.get(KEYS.admission_started) or 0) == 0
        (s,) = await _replay(r)
        assert s.masked and s.mask_reason == "infra:allocate_failed" and s.reward == 0.0
        assert s.status == "failed" and s.loss_mask.sum() == 0
        assert ro.totals["infra_failures"] == 2 and ro.totals["episodes_masked_infra"] == 1
        (info,) = await ServerRegistry(r, KEYS).list()
        assert info.pins == 0
    finally:
        await ro.aclose()
        await r.aclose()


async def test_failed_episode_writes_its_trajectory_with_the_error(tiny_model_dir, redis_url,
                                                                     pool_server, test_image, tmp_path):
    """The server changes weights in the middle of an episode: the actor gives the job back (the
    weight version no longer matches its pin), and the trajectory holds the step it ran and why."""
    import json

    import httpx

    row = calc_row(test_image, 4, "sleep")
    server = start_scripted(tiny_model_dir, [row], redis_url, tmp_path / "logs", sleep_s=6)
    cfg = actor_config(actor_sets(redis_url, tmp_path / "run", pool_server.url, pool_server.token,
                                  tiny_model_dir, server.api_key))
    r = connect(redis_url)
    ro = Rollouts(actor_runtime(cfg), r, actor_id="actor-t")
    try:
        job = asyncio.create_task(ro.run(payload(row), job_try=1))
        deadline = time.monotonic() + 60
        while (await ro.pool.status())["leases"] == 0:   # the episode holds its container
            assert time.monotonic() < deadline and not job.done(), job
            await asyncio.sleep(0.1)
        await asyncio.sleep(2.0)                          # its first command (sleep 6) is running
        async with httpx.AsyncClient(headers={"Authorization": f"Bearer {server.api_key}"}) as c:
            (await c.post(f"{server.url}/update_weight_version", json={"new_version": "1"},
                          timeout=10)).raise_for_status()
        with pytest.raises(InfraError, match="weight_version_mismatch"):
            await job
        (d,) = (tmp_path / "run" / "trajectories").iterdir()
        traj = json.loads((d / "traj.json").read_text())
        assert traj["error"]["reason"] == "weight_version_mismatch" and traj["ending"] == "error"
        assert "pinned 0" in traj["error"]["detail"] and traj["job_id"] == payload(row)["job_id"]
        (step,) = traj["step_debug"]
        assert step["action"].startswith("sleep 6") and step["returncode"] == 0
        assert [m["role"] for m in traj["messages"]] == ["system", "user", "assistant", "user"]
        meta = json.loads((d / "meta.json").read_text())
        assert meta["server_id"] and meta["job_try"] == 1 and meta["weight_versions"] == ["0"]
        assert "inference_api_key" not in meta["config"]
        # nothing written, nothing held but the admission slot, kept for the job's retry
        assert await _replay(r) == []
        assert (await ro.pool.status())["leases"] == 0
        (info,) = await ServerRegistry(r, KEYS).list()
        assert info.pins == 0
        assert int(await r.get(KEYS.admission_started) or 0) == 1
        assert await r.exists(KEYS.admission_job(payload(row)["job_id"]))
    finally:
        await ro.aclose()
        await r.aclose()
        server.stop()


async def test_tiny_model_episode_logprobs_match_transformers(cpu_server_factory, pool_server, redis_url,
                                                              tiny_model_dir, test_image, tmp_path):
    import torch
    from transformers import AutoModelForCausalLM

    from inference.logprobs import token_logprobs

    srv = cpu_server_factory.start(tiny_model_dir, redis_url=redis_url, run_id="test")
    row = calc_row(test_image, 3)
    cfg = actor_config(actor_sets(
        redis_url, tmp_path / "run", pool_server.url, pool_server.token, tiny_model_dir, srv.api_key,
        **{"actor.step_limit": 2, "actor.sampling.max_new_tokens": 24, "actor.pin_wait_s": 30}))
    r = connect(redis_url)
    ro = Rollouts(actor_runtime(cfg), r, actor_id="actor-t")
    try:
        res = await ro.run(payload(row))
        assert res["ending"] in ("step", "submitted") and res["samples"] >= 1
        samples = await _replay(r)
    finally:
        await ro.aclose()
        await r.aclose()
    torch.set_num_threads(1)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    for s in samples:
        assert s.weight_versions and set(s.weight_versions) == {"0"}
        tokens = torch.tensor(np.asarray(s.tokens, dtype=np.int64))[None]
        with torch.no_grad():
            logits = model(tokens).logits[0, :-1].float()
        lp = token_logprobs(logits, tokens[0, 1:], 1.0).numpy()
        mask = np.asarray(s.loss_mask[1:], dtype=bool)
        assert mask.sum() > 0
        np.testing.assert_allclose(lp[mask], np.asarray(s.rollout_logprobs[1:])[mask], atol=1e-4)
        assert (np.asarray(s.rollout_logprobs)[~np.asarray(s.loss_mask, dtype=bool)] == 0).all()


@pytest.mark.slow
async def test_bundled_tasks_gold_fix_plus_one_wrong_fix_minus_one(task_images, pool_server, redis_url,
                                                                  tiny_model_dir, tmp_path):
    """The bundled suite through the pool: evaluation in a fresh container, SWE-bench grading."""
    from swe.tasks import load_tasks

    a, b = load_tasks("train")[:2]
    rows = [{**a, "swarl_scripted_mode": "fix"}, {**b, "swarl_scripted_mode": "wrong"}]
    server = start_scripted(tiny_model_dir, rows, redis_url, tmp_path / "logs")
    cfg = actor_config(actor_sets(redis_url, tmp_path / "run", pool_server.url, pool_server.token,
                                  tiny_model_dir, server.api_key))
    r = connect(redis_url)
    ro = Rollouts(actor_runtime(cfg), r, actor_id="actor-t")
    try:
        good, bad = await asyncio.gather(ro.run(payload(rows[0])), ro.run(payload(rows[1])))
        assert good["resolved"] and good["reward"] == 1.0, good
        assert not bad["resolved"] and bad["reward"] == -1.0, bad
    finally:
        await ro.aclose()
        await r.aclose()
        server.stop()
