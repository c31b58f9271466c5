"""Assembly on the real replay stream: groups wait, time out by the rule, stale samples are
dropped and counted per age, duplicates are skipped."""

from __future__ import annotations

import pytest
from learner_helpers import make_sample

from broker.connection import connect
from broker.replay import ReplayReader, ReplayWriter
from learner.assembly import Assembler


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture
async def stream(redis_url, keys):
    r = connect(redis_url)
    reader = ReplayReader(r, keys)
    await reader.ensure_group()
    yield ReplayWriter(r, keys), reader
    await r.aclose()


async def read_all(reader: ReplayReader):
    out = []
    while True:
        got = await reader.read(count=100, block_ms=50)
        if not got:
            return out
        out += got


async def test_stale_samples_dropped_and_counted_per_age(stream) -> None:
    writer, reader = stream
    samples = []
    for g, version in [("a", 5), ("b", 3), ("c", 2), ("d", 4)]:
        samples += [make_sample(g, i, reward=float(i), version=version) for i in range(2)]
    await writer.add(samples)
    asm = Assembler(n_per_group=2, batch_size=4, max_staleness=1, group_timeout_s=60)
    asm.add(await read_all(reader))
    batch = asm.take_batch(version=5)
    assert batch is not None
    assert sorted(g.group_id for g in batch.groups) == ["a", "d"]
    assert dict(batch.staleness) == {0: 2, 1: 2}
    assert dict(asm.dropped_stale) == {2: 2, 3: 2}  # b is 2 versions behind, c 3
    assert asm.dropped["stale"] == 4
    # every entry is decided: the trained ones and the dropped ones are acked together
    assert len(batch.decided_ids) == 8 and len(asm.consumed) == 8


async def test_synchronous_mode_takes_only_current_version(stream) -> None:
    writer, reader = stream
    await writer.add([make_sample("old", i, version=0) for i in range(2)]
                     + [make_sample("new", i, version=1) for i in range(2)])
    asm = Assembler(n_per_group=2, batch_size=2, max_staleness=0, group_timeout_s=60)
    asm.add(await read_all(reader))
    batch = asm.take_batch(version=1)
    assert [g.group_id for g in batch.groups] == ["new"]
    assert asm.dropped_stale == {1: 2}


@pytest.mark.parametrize("rule", ["use", "drop"])
async def test_incomplete_group_waits_then_follows_the_timeout_rule(stream, rule: str) -> None:
    writer, reader = stream
    clock = Clock()
    asm = Assembler(n_per_group=4, batch_size=2, max_staleness=2, group_timeout_s=30,
                    partial_groups=rule, clock=clock)
    # 3 of 4 episodes; one of them a 2-step episode with only its first step arrived
    await writer.add([make_sample("g", 0, reward=1.0), make_sample("g", 1),
                      make_sample("g", 2, step_index=0, steps_total=2)])
    asm.add(await read_all(reader))
    assert asm.take_batch(0) is None  # waits
    clock.t += 29
    assert asm.take_batch(0) is None and asm.n_held == 3
    clock.t += 2
    batch = asm.take_batch(0)
    # closed with its fourth episode never seen: admission's reservation for it goes back
    assert asm.take_forfeits() == ["g"] and asm.take_forfeits() == []
    if rule == "use":
        assert batch is not None and [len(g.episodes) for g in batch.groups] == [2]
        assert asm.dropped["incomplete_episode"] == 1
    else:
        assert batch is None and asm.dropped["group_timeout"] == 3
    # the late step of the closed group is dropped, not started as a new group
    await writer.add([make_sample("g", 2, step_index=1, steps_total=2)])
    asm.add(await read_all(reader))
    assert asm.dropped["late"] == 1 and "g" not in asm.groups


async def test_duplicates_and_consumed_ids_are_skipped(stream) -> None:
    writer, reader = stream
    s = [make_sample("g", i) for i in range(2)]
    await writer.add([*s, s[0]])  # an actor retried and wrote sample 0 twice
    asm = Assembler(n_per_group=2, batch_size=2, max_staleness=0, group_timeout_s=60,
                    consumed={"old/0/0"})
    asm.add(await read_all(reader))
    await writer.add([make_sample("old", 0)])  # consumed before a restart
    asm.add(await read_all(reader))
    assert asm.dropped["duplicate"] == 2
    batch = asm.take_batch(0)
    assert sorted(s.sample_id for g in batch.groups for ep in g.episodes for s in ep.samples) \
        == ["g/0/0", "g/1/0"]
    assert asm.consumed == {"old/0/0", "g/0/0", "g/1/0"}
    assert len(batch.decided_ids) == 4  # duplicates are acked with the batch


async def test_masked_episodes_leave_group_statistics(stream) -> None:
    writer, reader = stream
    await writer.add([make_sample("g", 0, reward=1.0), make_sample("g", 1, reward=0.0),
                      make_sample("g", 2, reward=-1.0, masked=True)])
    asm = Assembler(n_per_group=3, batch_size=2, max_staleness=0, group_timeout_s=60)
    asm.add(await read_all(reader))
    batch = asm.take_batch(0)
    assert [ep.episode_id for ep in batch.groups[0].episodes] == ["g/0", "g/1"]
    assert asm.dropped["masked"] == 1


async def test_ready_groups_wait_for_a_full_batch_and_can_go_stale(stream) -> None:
    writer, reader = stream
    await writer.add([make_sample("a", i, version=0) for i in range(2)])
    asm = Assembler(n_per_group=2, batch_size=4, max_staleness=1, group_timeout_s=60)
    asm.add(await read_all(reader))
    assert asm.take_batch(0) is None  # complete group, but not a full batch
    await writer.add([make_sample("a", 5, version=0)])  # a group once closed takes no more
    asm.add(await read_all(reader))
    assert asm.dropped["late"] == 1
    await writer.add([make_sample(g, i, version=2) for g in ("b", "c") for i in range(2)])
    asm.add(await read_all(reader))
    batch = asm.take_batch(2)
    assert sorted(g.group_id for g in batch.groups) == ["b", "c"]
    assert asm.dropped_stale == {2: 2}


async def test_episodes_dropped_untrained_give_their_admission_slot_back(stream) -> None:
    """One slot per episode (not per sample) for every episode dropped after it wrote
    trainable samples; none for masked episodes (the actor gave theirs back) or duplicates, and
    an incomplete episode's late steps do not count it twice."""
    writer, reader = stream
    two_steps = {"steps_total": 2}
    samples = [make_sample("stale", i, version=0, step_index=k, **two_steps)
               for i in range(2) for k in range(2)]                             # 2 episodes
    samples += [make_sample("fresh", i, version=3) for i in range(2)]          # trained
    samples += [make_sample("masked", 0, version=3, masked=True),
                make_sample("masked", 1, version=0)]                           # 1 stale + 1 masked
    samples += [make_sample("partial", 0, version=3, step_index=0, **two_steps),  # incomplete
                make_sample("partial", 1, version=3)]
    await writer.add(samples)
    clock = Clock()
    asm = Assembler(n_per_group=2, batch_size=2, max_staleness=1, group_timeout_s=60, clock=clock)
    asm.add(await read_all(reader))
    batch = asm.take_batch(version=3)
    assert batch is not None and [g.group_id for g in batch.groups] == ["fresh"]
    assert asm.dropped["stale"] == 5 and asm.dropped["masked"] == 1
    assert asm.take_give_back() == 3   # stale: two episodes of "stale", one of "masked"
    assert asm.take_give_back() == 0
    # "partial" times out and is used without its incomplete episode
    clock.t += 61
    assert asm.take_batch(version=3) is None
    assert asm.dropped["incomplete_episode"] == 1 and asm.take_give_back() == 1
    # the incomplete episode's last step arrives late; a duplicate arrives: no more slots
    await writer.add([make_sample("partial", 0, version=3, step_index=1, **two_steps),
                      make_sample("fresh", 0, version=3)])
    asm.add(await read_all(reader))
    assert asm.dropped["late"] == 1 and asm.dropped["duplicate"] == 1
    assert asm.take_give_back() == 0
    # a straggler of a decided group, never seen before, gives its slot back once
    await writer.add([make_sample("fresh", 2, version=3)])
    asm.add(await read_all(reader))
    assert asm.take_give_back() == 1


async def test_a_step_beyond_batch_size_gives_the_excess_slots_back(stream) -> None:
    """Whole groups overshoot batch_size (3 here: two groups of 2 make 4); admission counts
    batch_size per step, so the excess episode's slot goes back."""
    writer, reader = stream
    await writer.add([make_sample(g, i, version=0) for g in ("a", "b") for i in range(2)])
    asm = Assembler(n_per_group=2, batch_size=3, max_staleness=0, group_timeout_s=60)
    asm.add(await read_all(reader))
    batch = asm.take_batch(version=0)
    assert batch is not None and batch.n_episodes == 4
    assert asm.take_give_back() == 1


async def test_a_group_at_its_last_chance_is_trained_without_its_straggler(stream) -> None:
    """max_staleness 1: at version 3 the version-2 episodes are trained now or never. The
    finished episodes of an open version-2 group are taken before anything else (beyond
    batch_size); an open group that can still wait, and one with a single finished episode, wait.
    The straggler arrives late: dropped, its slot given back once."""
    writer, reader = stream
    await writer.add([make_sample("old", i, version=2) for i in range(3)]      # 3 of 4 finished
                     + [make_sample("lone", 0, version=2)]                      # 1 of 4
                     + [make_sample("young", i, version=3) for i in range(3)]   # can wait
                     + [make_sample(g, i, version=3) for g in ("a", "b") for i in range(4)])
    asm = Assembler(n_per_group=4, batch_size=8, max_staleness=1, group_timeout_s=600)
    asm.add(await read_all(reader))
    batch = asm.take_batch(version=3)
    assert batch is not None
    assert [g.group_id for g in batch.groups] == ["old", "a", "b"]  # the oldest version first
    assert batch.n_episodes == 11 and asm.salvaged == 1
    assert asm.take_give_back() == 3  # 11 trained, 8 counted by admission for this step
    assert asm.take_forfeits() == ["old"]  # not the complete groups
    assert set(asm.groups) == {"lone", "young"}
    await writer.add([make_sample("old", 3, version=2)])
    asm.add(await read_all(reader))
    assert asm.dropped["late"] == 1 and asm.take_give_back() == 1


@pytest.mark.parametrize("setting", ["synchronous", "salvage off", "partial groups dropped"])
async def test_no_salvage_when_a_group_must_be_whole(stream, setting: str) -> None:
    """max_staleness 0 (a synchronous step trains complete groups), salvage off, or
    partial_groups drop: the open group is not trained without its straggler."""
    writer, reader = stream
    eta = 0 if setting == "synchronous" else 1
    await writer.add([make_sample("old", i, version=3 - eta) for i in range(3)]
                     + [make_sample(g, i, version=3) for g in ("a", "b") for i in range(4)])
    asm = Assembler(n_per_group=4, batch_size=8, max_staleness=eta, group_timeout_s=600,
                    salvage=setting != "salvage off",
                    partial_groups="drop" if setting == "partial groups dropped" else "use")
    asm.add(await read_all(reader))
    batch = asm.take_batch(version=3)
    assert batch is not None and [g.group_id for g in batch.groups] == ["a", "b"]
    assert asm.salvaged == 0 and "old" in asm.groups


async def test_staleness_is_the_oldest_trained_tokens_and_every_token_is_counted(stream) -> None:
    """weight_sync.rollout_mode in-flight: a sample's tokens may come from several versions.
    The bound applies to its oldest trained token whatever its policy_version says; the
    generated tokens it decides are counted trained, out of the loss, or dropped by reason."""
    import numpy as np

    writer, reader = stream

    def versioned(g: str, i: int, versions: list[int], train: list[int] | None = None):
        s = make_sample(g, i, version=max(versions), length=5 + len(versions), prompt_len=5)
        s.token_versions = np.asarray([-1] * 5 + versions, np.int32)
        if train is not None:
            s.loss_mask = np.asarray([0] * 5 + train, np.uint8)
        return s

    await writer.add([
        versioned("fresh", 0, [4, 5, 5]), versioned("fresh", 1, [4, 4, 5], train=[0, 1, 1]),
        # claims version 5, but a trained token is from 2: stale at version 5, max_staleness 1
        versioned("mixed", 0, [2, 5, 5]), versioned("mixed", 1, [5, 5, 5]),
        # the token from 2 is out of the loss (a format error): the sample is as old as 4
        versioned("untrained", 0, [2, 4, 4], train=[0, 1, 1]), versioned("untrained", 1, [5, 5]),
    ])
    asm = Assembler(n_per_group=2, batch_size=4, max_staleness=1, group_timeout_s=60, partial_groups="drop")
    asm.add(await read_all(reader))
    batch = asm.take_batch(version=5)
    assert batch is not None
    assert sorted(g.group_id for g in batch.groups) == ["fresh", "untrained"]
    assert asm.dropped["stale"] == 1 and dict(asm.dropped_stale) == {3: 1}
    tokens = asm.take_tokens()
    # fresh: 3 + 2 in the loss, 1 out; untrained: 2 + 2 in, 1 out; mixed's stale member: 3
    assert dict(tokens) == {"trained": 9, "loss_masked": 2, "dropped_stale": 3}
    assert not asm.take_tokens() and asm.tokens_total == tokens  # the total stays (metrics)
