"""broker.running on a real redis-server: what the learner reads before a step that would make
a running episode stale, and a dead actor's entries lapsing instead of holding it forever."""

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
    assert await aredis.exists(keys.running_oldest, keys.running_seen) == 0


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
    await aredis.hset(keys.learner_state, mapping={"step": 3, "version": 3, "holding": 1})
    st = await gather(aredis, keys, ReplayConfig(), AdmissionConfig())
    assert st["running_by_version"] == {9: 1, 10: 1}
    console = Console(record=True, width=200)
    console.print(render(json.loads(to_json(st))))  # as `swarl status --json` readers get it
    text = console.export_text()
    assert re.search(r"episodes running +v9: 1, v10: 1", text)
    assert re.search(r"step held for +1 running episodes \(straggler grace\)", text)
