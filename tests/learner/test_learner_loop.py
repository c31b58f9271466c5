"""The learner loop on real Redis: synchronous rounds publish versions, everything is acked,
metrics and plots are written, a checkpointed-but-unpublished version is published on resume."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from pathlib import Path

import torch
from learner_helpers import DirPublisher, make_sample

from broker.connection import connect
from broker.registry import PolicyRegistry
from broker.replay import ReplayWriter
from learner import checkpoint
from learner.backends.torch_backend import TorchBackend
from learner.checkpoint import LearnerState
from learner.loop import Learner
from learner.plot import plot_run
from learner.trainer import Trainer
from swarl.wiring import learner_runtime


def configure(cfg, model_dir, **learner):
    cfg.admission.max_staleness = 0
    cfg.admission.batch_size = 4
    cfg.replay.block_ms = 100
    for k, v in {"model_dir": str(model_dir), "n_samples_per_prompt": 2, "idle_exit_s": 2.0,
                 "update_every": 1, "lr": 1e-3, "heartbeat_s": 0.2, **learner}.items():
        setattr(cfg.learner, k, v)
    return cfg


async def test_synchronous_rounds_publish_ack_and_log(cfg, keys, small_model_dir, tmp_path) -> None:
    cfg = configure(cfg, small_model_dir)
    r = connect(cfg.redis.url)
    writer = ReplayWriter(r, keys)
    pub = DirPublisher(r, keys, tmp_path / "weights")
    learner = Learner(learner_runtime(cfg), r, Trainer.single(TorchBackend(cfg.learner, small_model_dir), cfg.learner), pub)
    task = asyncio.create_task(learner.run())
    registry = PolicyRegistry(r, keys)
    for v in range(3):  # like synchronous actors: roll out only the current version
        for _ in range(1200):  # polls the registry like an actor would (bounded: 60 s)
            if await registry.current() >= v:
                break
            await asyncio.sleep(0.05)
        await writer.add([make_sample(f"r{v}g{g}", i, reward=float(i), version=v,
                                      metrics={"turns": 3.0 + i, "agent/tool_calls": 2.0})
                          for g in range(2) for i in range(2)])
    state = await asyncio.wait_for(task, 60)
    assert (state.step, state.version) == (3, 3)
    assert pub.published == [1, 2, 3] and await registry.current() == 3
    pending = await r.xpending(keys.replay, cfg.replay.group)
    assert pending["pending"] == 0
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows] == [1, 2, 3]
    for k in ("loss", "reward_mean", "resolve_rate", "adv_std", "clip_frac", "imp_weight_mean",
              "entropy", "grad_norm", "tokens_per_s", "staleness/age_0", "dropped/total",
              "agent/turns_mean", "agent/turns_max", "agent/tool_calls_mean",
              # the diagnostics people read to judge RL (learner.diagnostics)
              "zero_spread_groups_frac", "mismatch_kl", "update_kl", "adv_abs_mean", "updates"):
        assert k in rows[-1], k
    assert rows[-1]["agent/turns_mean"] == 3.5 and rows[-1]["agent/turns_max"] == 4.0 and rows[-1]["reward_mean"] == 0.5
    st = await r.hgetall(keys.learner_state)
    assert st[b"step"] == b"3" and st[b"version"] == b"3" and st[b"status"] == b"stopped"
    # the last step's diagnostics for `swarl status`; rewards 0, 1 in each group: all spread
    assert float(st[b"diag/zero_spread_groups_frac"]) == 0.0 and float(st[b"diag/entropy"]) > 0
    # the samples' logprobs (-2 on every token) are not the model's: after 3 such steps the
    # learner warns of a trainer/inference mismatch
    assert all(row["mismatch_kl"] > cfg.learner.mismatch_kl_bound for row in rows)
    assert st[b"warning"].startswith(b"mismatch KL "), st[b"warning"]
    assert {p.name for p in plot_run(tmp_path / "run")} >= {"reward.png", "staleness.png",
                                                          "throughput.png", "resolve_rate.png",
                                                          "signal.png", "kl.png", "entropy.png"}
    assert (tmp_path / "run" / "tb").is_dir()
    await r.aclose()


async def test_resume_publishes_a_checkpointed_version_the_registry_lacks(cfg, keys, small_model_dir,
                                                                         tmp_path) -> None:
    cfg = configure(cfg, small_model_dir, idle_exit_s=0.3)
    backend = TorchBackend(cfg.learner, small_model_dir)
    checkpoint.save(cfg.run.dir, backend, LearnerState(step=2, version=2))
    r = connect(cfg.redis.url)
    registry = PolicyRegistry(r, keys)
    await registry.publish(1, {"path": "x"})
    pub = DirPublisher(r, keys, tmp_path / "weights")
    b2 = TorchBackend(cfg.learner, small_model_dir)
    state = checkpoint.load(checkpoint.latest(cfg.run.dir), b2)
    await Learner(learner_runtime(cfg), r, Trainer.single(b2, cfg.learner), pub, state).run()
    assert pub.published == [2] and await registry.current() == 2
    await r.aclose()


async def test_dropped_entries_are_acked_without_a_step(cfg, keys, small_model_dir) -> None:
    cfg = configure(cfg, small_model_dir, idle_exit_s=0.5)
    r = connect(cfg.redis.url)
    await ReplayWriter(r, keys).add([make_sample("old", i, version=1) for i in range(2)])
    learner = Learner(learner_runtime(cfg), r, Trainer.single(TorchBackend(cfg.learner, small_model_dir), cfg.learner), None,
                      LearnerState(step=4, version=4))
    state = await learner.run()
    assert state.step == 4
    assert learner.asm.dropped_stale == {3: 2}
    assert (await r.xpending(keys.replay, cfg.replay.group))["pending"] == 0
    await r.aclose()


async def test_dropped_episodes_give_their_admission_slots_back(cfg, keys, small_model_dir) -> None:
    """Episodes the learner drops untrained must not hold rollout capacity: without this, every
    stale drop shrank it for the rest of the run, and (max_staleness + 1) x batch_size drops
    stopped the actors for good."""
    from broker.admission import Admission

    cfg = configure(cfg, small_model_dir, idle_exit_s=0.5)
    r = connect(cfg.redis.url)
    admission = Admission(r, keys, cfg.admission)
    await r.set(keys.policy_current, 4)
    await r.set(keys.admission_started, 4 * 4 + 4)  # version 4's batch full: 4 rollouts running
    assert (await admission.capacity())["free"] == 0
    # two of those rollouts (one group) finish on version 1: too stale for version 4
    await ReplayWriter(r, keys).add([make_sample("old", i, version=1) for i in range(2)])
    learner = Learner(learner_runtime(cfg), r, Trainer.single(TorchBackend(cfg.learner, small_model_dir), cfg.learner), None,
                      LearnerState(step=4, version=4))
    await learner.run()
    assert learner.asm.dropped["stale"] == 2
    assert (await admission.capacity())["free"] == 2  # their two slots are free again
    await r.aclose()


async def test_a_group_closed_before_its_members_started_hands_their_reservation_back(
        cfg, keys, small_model_dir) -> None:
    """Admission reserves a whole group's slots when its first episode starts. A group the
    learner closes (timed out, here) with members that never started must give their slots back,
    or capacity leaks for the rest of the run."""
    from broker.admission import Admission

    cfg = configure(cfg, small_model_dir, idle_exit_s=1.0, n_samples_per_prompt=4,
                    group_timeout_s=0.2, partial_groups="drop")
    r = connect(cfg.redis.url)
    admission = Admission(r, keys, cfg.admission)
    assert await admission.try_start("g", 4) and await admission.try_start("g", 4)
    assert (await admission.capacity())["started"] == 4  # two running, two reserved
    await ReplayWriter(r, keys).add([make_sample("g", i, version=0) for i in range(2)])
    learner = Learner(learner_runtime(cfg), r, Trainer.single(TorchBackend(cfg.learner, small_model_dir), cfg.learner), None)
    await learner.run()
    assert learner.asm.dropped["group_timeout"] == 2
    # the two unstarted members' reservation and the two dropped episodes' slots
    assert (await admission.capacity())["started"] == 0
    await r.aclose()


async def test_publishes_through_weight_sync(cfg, keys, small_model_dir) -> None:
    """The real publisher (weight_sync.make_publisher, coordinator off): versions land on disk
    with a manifest in the registry, loadable as the HF model the learner trains."""
    from safetensors.torch import load_file

    # weight_sync.publisher, not weight_sync: under pytest, tests/weight_sync (no __init__.py)
    # shadows the package name as a namespace package
    from weight_sync.publisher import make_publisher

    cfg = configure(cfg, small_model_dir, idle_exit_s=0.5, update_every=1)
    cfg.admission.max_staleness = 4
    r = connect(cfg.redis.url)
    await ReplayWriter(r, keys).add([make_sample(g, i, reward=float(i)) for g in "ghij" for i in range(2)])
    cfg.admission.batch_size = 2
    pub = make_publisher(cfg.weight_sync, r, keys, cfg.run.dir, str(small_model_dir),
                         start_coordinator=False)
    backend = TorchBackend(cfg.learner, small_model_dir)
    try:
        state = await Learner(learner_runtime(cfg), r, Trainer.single(backend, cfg.learner), pub).run()
    finally:
        await pub.close()
    assert state.version == 4  # 8 episodes in groups of 2, one group (2 episodes) per step
    registry = PolicyRegistry(r, keys)
    assert await registry.current() == 4
    manifest = await registry.manifest(4)
    assert manifest is not None and manifest["step"] == 4
    files = sorted(Path(manifest["path"]).glob("*.safetensors"))
    got = {}
    for f in files:
        got.update(load_file(str(f)))
    for name, t in backend.named_tensors():
        assert torch.equal(got[name], t), name
    await r.aclose()


async def test_idle_exit_counts_from_the_end_of_a_step(cfg, keys, small_model_dir, tmp_path) -> None:
    """A step longer than idle_exit_s is not idleness: a batch that arrives soon after the step
    ends is still trained."""
    cfg = configure(cfg, small_model_dir, idle_exit_s=1.0)
    r = connect(cfg.redis.url)
    writer = ReplayWriter(r, keys)
    trainer = Trainer.single(TorchBackend(cfg.learner, small_model_dir), cfg.learner)
    real_train = trainer.train

    def slow_train(items):  # the step itself outlasts idle_exit_s
        time.sleep(1.5)
        return real_train(items)

    trainer.train = slow_train  # type: ignore[method-assign]
    learner = Learner(learner_runtime(cfg), r, trainer, None)
    task = asyncio.create_task(learner.run())
    await writer.add([make_sample(f"a{g}", i, version=0) for g in range(2) for i in range(2)])
    trained = tmp_path / "run" / "learner" / "trained.jsonl"
    for _ in range(600):
        if trained.exists() and trained.read_text().strip():
            break
        await asyncio.sleep(0.02)
    # the second batch comes 0.6 s after the first step: within idle_exit_s of the step's end,
    # though 2 s after the last arrival
    await asyncio.sleep(0.6)
    await writer.add([make_sample(f"b{g}", i, version=1) for g in range(2) for i in range(2)])
    state = await asyncio.wait_for(task, 60)
    assert state.step == 2
    await r.aclose()


async def run_figures(r, keys, durations_s=range(5, 30)) -> None:
    """The run's own figures the hold rule weighs: episodes that took 5-29 s to their end
    (broker.running's record), 10 generated tokens per busy slot second (the actors' stats)."""
    await r.lpush(keys.running_ended, *(f"{int(d * 1000)} 1000 1" for d in durations_s))
    await r.hset(keys.stats, mapping={"tokens_generated": 10_000, "rollout_busy_s": 1000.0})


async def test_a_step_waits_for_a_running_episode_it_would_leave_behind_while_nothing_waits_on_it(
        cfg, keys, small_model_dir, tmp_path) -> None:
    """At max_staleness 0 the first step (publishing version 1) would make every version-0
    episode stale; one still runs, with episodes of this run taking 5-29 s. No actor slot waits
    on admission and the learner has nothing else to do: the step waits, trains the straggler's
    group whole, and says why (the rule's inputs in the state hash for `swarl status`, and in the
    step's metrics)."""
    from broker.running import RunningEpisodes

    cfg = configure(cfg, small_model_dir, idle_exit_s=1.0)  # learner.straggler_grace_s: its default
    r = connect(cfg.redis.url)
    writer, running = ReplayWriter(r, keys), RunningEpisodes(r, keys)
    await run_figures(r, keys)
    await running.add("straggler", 0)
    await running.refresh(["straggler"], {"straggler": 400})
    # two complete groups (a batch) and one of the third group's two episodes
    await writer.add([make_sample(g, i, version=0) for g in ("a", "b") for i in range(2)]
                     + [make_sample("c", 0, version=0)])
    learner = Learner(learner_runtime(cfg), r, Trainer.single(TorchBackend(cfg.learner, small_model_dir),
                                                              cfg.learner), None)
    task = asyncio.create_task(learner.run())
    await asyncio.sleep(2.0)
    assert learner.state.step == 0  # held: the batch is ready, the straggler runs
    st = await r.hgetall(keys.learner_state)
    assert st[b"holding"] == b"1" and st[b"hold_why"] == b"worth" and st[b"hold_at_risk"] == b"1"
    assert int(st[b"hold_saved_tokens"]) > 0 and float(st[b"hold_blocked_slots"]) == 0
    await writer.add([make_sample("c", 1, version=0)])  # it finishes: samples, then unlisted
    await running.remove("straggler")
    state = await asyncio.wait_for(task, 60)
    assert (state.step, state.trained_samples) == (1, 6) and not learner.asm.dropped
    row = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[0])
    assert row["episodes"] == 6 and 1.8 <= row["straggler_wait_s"] < 30
    assert row["hold/left_behind"] == 0 and row["hold/why"] == "none"  # none left when it stepped
    await r.aclose()


async def test_a_step_waits_for_a_member_of_a_group_it_would_train_without_it(cfg, keys, small_model_dir,
                                                                             tmp_path) -> None:
    """At max_staleness 1 and version 1, group g has two episodes of version 0 done (this step is
    their last chance: it trains them, salvaged) and its third still running, from version 1: not
    stale itself, but the step would train g without it and the actors would stop it. With
    nothing waiting on the learner the step waits for it (the old grace looked at versions only)."""
    from broker.running import RunningEpisodes

    cfg = configure(cfg, small_model_dir, idle_exit_s=1.0, n_samples_per_prompt=3)
    cfg.admission.max_staleness, cfg.admission.batch_size = 1, 3
    r = connect(cfg.redis.url)
    writer, running = ReplayWriter(r, keys), RunningEpisodes(r, keys)
    await run_figures(r, keys)
    member = f"{keys.run}:g:s2"
    assert keys.group_of(member) == "g"
    await running.add(member, 1)
    await running.refresh([member], {member: 400})
    await writer.add([make_sample("a", i, version=1) for i in range(3)]  # a batch
                     + [make_sample("g", i, version=0) for i in range(2)])
    learner = Learner(learner_runtime(cfg), r, Trainer.single(TorchBackend(cfg.learner, small_model_dir),
                                                              cfg.learner), None, LearnerState(step=1, version=1))
    task = asyncio.create_task(learner.run())
    await asyncio.sleep(2.0)
    assert learner.state.step == 1, "stepped: g trained without its running member"
    assert (await r.hget(keys.learner_state, "hold_at_risk")) == b"1"
    await writer.add([make_sample("g", 2, version=1)])
    await running.remove(member)
    state = await asyncio.wait_for(task, 60)
    # g whole (its version-0 episodes first, at their last chance), then a
    assert (state.step, state.trained_samples) == (3, 6) and not learner.asm.dropped
    await r.aclose()


async def test_a_step_does_not_wait_when_actors_are_blocked_behind_it(cfg, keys, small_model_dir,
                                                                    tmp_path) -> None:
    """The same straggler, but admission is full while an actor has 7 of its 8 slots idle and
    jobs are queued: each second of a hold would cost 7 slot-seconds, more than the straggler
    (early in its episode) is worth. The step goes at once, leaving it behind, and says why."""
    from broker.admission import Admission
    from broker.registry import ActorRegistry
    from broker.running import RunningEpisodes

    cfg = configure(cfg, small_model_dir, idle_exit_s=1.0)
    r = connect(cfg.redis.url)
    running = RunningEpisodes(r, keys)
    await run_figures(r, keys)
    await ActorRegistry(r, keys).register("actor-0", "host", 1, concurrency=8)
    await r.zadd(keys.queue, {f"job-{i}": i for i in range(8)})
    await r.set(keys.admission_started, cfg.admission.batch_size)  # version 0's rollouts all started
    await running.add("straggler", 0)
    await running.refresh(["straggler"], {"straggler": 400})
    await ReplayWriter(r, keys).add([make_sample(g, i, version=0) for g in ("a", "b") for i in range(2)])
    learner = Learner(learner_runtime(cfg), r, Trainer.single(TorchBackend(cfg.learner, small_model_dir),
                                                              cfg.learner), None)
    assert (await Admission(r, keys, cfg.admission).capacity())["free"] == 0
    state = await asyncio.wait_for(learner.run(), 60)  # not 60 s: the old fixed grace's default
    assert state.step == 1
    row = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[0])
    assert row["straggler_wait_s"] == 0 and row["hold/left_behind"] == 1 and row["hold/why"] == "not_worth"
    assert row["hold/blocked_slots"] == 7 and row["hold/cost_tokens"] > row["hold/saved_tokens"]
    await r.aclose()


async def test_the_cap_bounds_a_hold(cfg, keys, small_model_dir, tmp_path) -> None:
    """learner.straggler_grace_s caps a hold: a straggler the rule waits for (nothing is blocked,
    it could end within the cap) that does not end delays the step by the cap at most; its group
    is then decided as without the hold."""
    from broker.running import RunningEpisodes

    cfg = configure(cfg, small_model_dir, idle_exit_s=1.0, straggler_grace_s=1.5)
    r = connect(cfg.redis.url)
    await run_figures(r, keys, durations_s=[5 + i / 10 for i in range(250)])
    running = RunningEpisodes(r, keys)
    await running.add("never-ends", 0)
    await running.refresh(["never-ends"], {"never-ends": 400})
    # listed 4.5 s ago: it could end within the cap (this run's episodes took 5-30 s)
    sec, usec = await r.time()
    await r.zadd(keys.running_started, {"never-ends": sec * 1000 + usec // 1000 - 4500})
    await ReplayWriter(r, keys).add([make_sample(g, i, version=0) for g in ("a", "b") for i in range(2)])
    learner = Learner(learner_runtime(cfg), r, Trainer.single(TorchBackend(cfg.learner, small_model_dir),
                                                              cfg.learner), None)
    state = await asyncio.wait_for(learner.run(), 60)
    assert state.step == 1
    row = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[0])
    # a round reads for up to replay.block_ms (0.1 s here) between decisions
    assert 1.0 <= row["straggler_wait_s"] < 2.0 and row["hold/left_behind"] == 1
    assert row["hold/why"] in ("capped", "not_worth")  # not_worth: it could no longer end in time
    await r.aclose()


async def test_token_counts_survive_a_kill_without_counting_twice(cfg, keys, small_model_dir) -> None:
    """The learner's token fields in the stats hash are the run's totals: a learner killed
    after an unrecorded step re-trains its entries on restart without counting their tokens
    again, and stale drops acknowledged before the kill stay counted."""
    cfg = configure(cfg, small_model_dir, idle_exit_s=0.5, checkpoint_every=100)
    cfg.admission.max_staleness = 1
    r = connect(cfg.redis.url)
    writer = ReplayWriter(r, keys)
    await r.set(keys.policy_current, 3)

    def learner() -> Learner:
        state = checkpoint.load(checkpoint.latest(cfg.run.dir), TorchBackend(cfg.learner, small_model_dir)) \
            if checkpoint.latest(cfg.run.dir) else LearnerState(step=3, version=3)
        return Learner(learner_runtime(cfg), r, Trainer.single(TorchBackend(cfg.learner, small_model_dir),
                                                               cfg.learner), None, state)

    first = learner()
    task = asyncio.create_task(first.run())
    await writer.add([make_sample("old", i, version=0, length=20, prompt_len=5) for i in range(2)])
    for _ in range(200):  # dropped stale and acknowledged (no step since the checkpoint)
        if (await r.xpending(keys.replay, cfg.replay.group))["pending"] == 0 and first.asm.dropped:
            break
        await asyncio.sleep(0.05)
    await writer.add([make_sample(g, i, version=3, length=12, prompt_len=5) for g in "ab" for i in range(2)])
    for _ in range(600):
        if first.state.step == 4:
            break
        await asyncio.sleep(0.05)
    await asyncio.sleep(0.3)
    task.cancel()  # killed: step 4 is in no checkpoint, its entries stay pending
    with contextlib.suppress(asyncio.CancelledError):
        await task
    stats = await r.hgetall(keys.stats)
    assert int(stats[b"tokens_wasted/dropped_stale"]) == 2 * 15 and int(stats[b"tokens_trained"]) == 4 * 7
    state = await asyncio.wait_for(learner().run(), 60)  # re-trains step 4 from the pending entries
    assert state.step == 4
    stats = await r.hgetall(keys.stats)
    assert int(stats[b"tokens_wasted/dropped_stale"]) == 2 * 15 and int(stats[b"tokens_trained"]) == 4 * 7
    await r.aclose()
