"""broker.running on a real redis-server: what the learner reads before a step that would make
a running episode stale (how long each has run, whether it grades, its tokens, and the run's
durations), and a dead actor's entries lapsing instead of holding it forever."""

import asyncio

from broker.running import RunningEpisodes


async def test_episodes_at_risk_by_their_oldest_version(aredis, keys) -> None:
    running = RunningEpisodes(aredis, keys)
    assert await running.at_risk(5) == (0, None)
    await running.add("j1", 3)
    await running.add("j2", 5)
    await running.add("j3", 6)
    assert await running.at_risk(2) == (0, 3)
    assert await running.at_risk(5) == (2, 3)  # j1 and j2: oldest version <= 5
    await running.remove("j1")
    assert await running.at_risk(5) == (1, 5)
    assert await running.count() == 2
    # the keys an operator reads with redis-cli: job id -> version
    assert await aredis.zrange(keys.running_oldest, 0, -1, withscores=True) == [(b"j2", 5.0), (b"j3", 6.0)]


async def test_a_dead_actors_entries_lapse_and_refresh_keeps_the_live_ones(aredis, keys) -> None:
    running = RunningEpisodes(aredis, keys, ttl_s=0.6)
    await running.add("alive", 1)
    await running.add("dead", 1)
    for _ in range(4):  # the live actor refreshes; the dead one's entry ages past ttl_s
        await asyncio.sleep(0.25)
        assert await running.refresh(["alive"]) == 1
    assert await running.at_risk(1) == (1, 1)
    assert await aredis.zrange(keys.running_seen, 0, -1) == [b"alive"]
    # a refresh after the episode was removed does not bring it back
    await running.remove("alive")
    assert await running.refresh(["alive"]) == 0
    assert await running.at_risk(10) == (0, None)
    assert await aredis.exists(keys.running_oldest, keys.running_seen, keys.running_started,
                               keys.running_last_turn, keys.running_tokens) == 0


async def test_a_snapshot_says_how_far_each_episode_is_and_removal_records_its_durations(aredis, keys) -> None:
    running = RunningEpisodes(aredis, keys, ttl_s=5.0)
    await running.add("gen", 2)
    await running.add("grading", 1)
    await running.add("stopped", 1)
    await running.refresh(["gen", "grading", "gone"], {"gen": 120, "grading": 300})
    await asyncio.sleep(0.3)
    assert await running.last_turn("grading") and not await running.last_turn("gone")
    await asyncio.sleep(0.3)
    snap = {e.job_id: e for e in await running.snapshot()}
    assert set(snap) == {"gen", "grading", "stopped"}
    gen, grading = snap["gen"], snap["grading"]
    assert (gen.version, gen.tokens, gen.graded_for_s) == (2, 120, None) and 0.5 <= gen.elapsed_s < 3
    assert grading.tokens == 300 and grading.graded_for_s is not None
    assert 0.2 <= grading.graded_for_s < grading.elapsed_s
    assert snap["stopped"].tokens == 0  # its actor reported none yet
    await running.remove("grading")  # ran to its end
    await running.remove("stopped", ended=False)  # stopped stale: censored, not short
    await running.remove("never-listed")  # nothing to record
    (stopped, graded) = await running.ended()  # newest first
    assert stopped[1] is None and stopped[2] is False and stopped[0] >= 0.5
    assert graded[2] is True and 0.2 <= graded[1] < graded[0]
    assert [e.job_id for e in await running.snapshot()] == ["gen"]
    assert await aredis.zrange(keys.running_tokens, 0, -1) == [b"gen"]


async def test_status_shows_running_episodes_by_version(aredis, keys) -> None:
    import json
    import re

    from rich.console import Console

    from broker.config import AdmissionConfig, ReplayConfig
    from broker.status import gather, render, to_json

    running = RunningEpisodes(aredis, keys)
    for job, v in (("a", 9), ("b", 10), ("c", 10)):
        await running.add(job, v)
    await aredis.zadd(keys.running_seen, {"c": 0})  # c's actor died long ago: not shown
    await aredis.hset(keys.learner_state, mapping={
        "step": 3, "version": 3, "holding": 1, "hold_held_s": 2.5, "hold_at_risk": 1, "hold_why": "worth",
        "hold_saved_tokens": 180, "hold_cost_tokens": 20, "hold_for_s": 4.0, "hold_blocked_slots": 0.0})
    st = await gather(aredis, keys, ReplayConfig(), AdmissionConfig())
    assert st["running_by_version"] == {9: 1, 10: 1}
    console = Console(record=True, width=200)
    console.print(render(json.loads(to_json(st))))  # as `swarl status --json` readers get it
    text = console.export_text()
    assert re.search(r"episodes running +v9: 1, v10: 1", text)
    assert re.search(r"step held for +1 running episodes \(2.5 s so far\)", text)
    # the hold rule and its inputs (learner.hold)
    assert re.search(r"hold rule +hold: 1 episodes would be left behind; waiting up to 4.0 s saves ~180 "
                     r"tokens, costs ~20 \(0.0 actor slots blocked now\)", text)
