"""The demo trains both forms of a symptom in one learner group: paired rows, the queue they
make (real Redis), and what the learner does with such a group."""

from __future__ import annotations

import random
from collections import Counter

import numpy as np

from broker.keys import Keys
from broker.replay import Entry
from broker.tasks import arq_pool, load_job
from broker.wire import Sample
from learner.assembly import Assembler
from learner.config import LearnerConfig
from learner.train import batch_items
from swarl.demo.run import Demo, DemoOptions
from swe.tasks import load_tasks
from swe.tasks.generated import FAMILIES, form_pairs


def make_sample(group_id: str, k: int, reward: float) -> Sample:
    tokens = np.arange(1, 9, dtype=np.int32)
    mask = np.array([0, 0, 0, 1, 1, 1, 1, 1], np.uint8)
    return Sample(tokens=tokens, loss_mask=mask, rollout_logprobs=np.where(mask == 1, -1.0, 0.0).astype(np.float32),
                  prompt_len=3, reward=reward, group_id=group_id, sample_index=k, instance_id=f"{group_id}-{k % 2}",
                  policy_version=0, sample_id=f"{group_id}/{k}/0", episode_id=f"{group_id}/{k}")


def _form(row: dict) -> str:
    return str(row["swarl_shape"]).split("/")[0]


def test_every_row_is_paired_with_the_other_form_of_its_symptom():
    for split in ("train", "heldout", "heldout_family"):
        rows = load_tasks(split, suite="generated")
        units = form_pairs(rows)
        assert sorted(r["instance_id"] for u in units for r in u) == sorted(r["instance_id"] for r in rows)
        assert all(len(u) == 2 for u in units), split
        for a, b in units:
            assert (a["swarl_family"], a["swarl_wording"]) == (b["swarl_family"], b["swarl_wording"])
            assert {_form(a), _form(b)} == {f.name for f in FAMILIES[a["swarl_family"]].forms}
    # what has no partner stays alone, in order
    bundled = load_tasks("train", suite="bundled")[:3]
    odd = load_tasks("train", suite="generated")[:1]
    assert form_pairs([*bundled, *odd]) == [[bundled[0]], [bundled[1]], [bundled[2]], odd]


async def _queued(redis_url: str, keys: Keys) -> tuple[list[str], list[dict], dict[str, int]]:
    pool = await arq_pool(redis_url)
    try:
        ids = [i.decode() for i in await pool.zrange(keys.queue, 0, -1)]
        payloads = [load_job(await pool.get(f"arq:job:{i}"))["a"][0] for i in ids]
        sizes = {k.decode(): int(v) for k, v in (await pool.hgetall(keys.group_sizes)).items()}
    finally:
        await pool.aclose()
    return ids, payloads, sizes


async def test_the_demo_enqueues_each_pair_as_one_group_of_adjacent_jobs(redis_url, tmp_path):
    demo = Demo(DemoOptions(run_dir=str(tmp_path / "run"), train_pool=0))  # the fixed train split
    keys: Keys = demo.keys()
    await demo.enqueue(redis_url, range(2))
    ids, payloads, sizes = await _queued(redis_url, keys)
    assert len(ids) == 2 * 96 * 2  # two epochs, 96 train tasks, 2 samples each
    seen: Counter[str] = Counter()
    for start in range(0, len(ids), 4):  # a group's 4 jobs follow each other in the queue
        group = payloads[start:start + 4]
        assert len({p["group_id"] for p in group}) == 1 and [p["sample_index"] for p in group] == [0, 1, 2, 3]
        assert {keys.group_of(i) for i in ids[start:start + 4]} == {group[0]["group_id"]}
        assert sizes[group[0]["group_id"]] == 4 and all(p["n_samples"] == 4 for p in group)
        rows = [p["instance"] for p in group]
        assert len({_form(r) for r in rows}) == 2
        assert [r["instance_id"] for r in rows[:2]] == [r["instance_id"] for r in rows[2:]]  # A, B, A, B
        assert len({(r["swarl_family"], r["swarl_wording"]) for r in rows}) == 1
        seen.update(r["instance_id"] for r in rows)
    assert set(seen.values()) == {4}  # per task: 2 samples in each epoch's group
    # without pairing: one task per group, 4 samples
    demo = Demo(DemoOptions(run_dir=str(tmp_path / "run2"), train_pool=0, pair_forms=False))
    assert all(len(u) == 1 for u in demo.train_units())


async def test_the_demo_trains_on_the_pool_in_pairs(redis_url, tmp_path, monkeypatch):
    """--train-pool N (the default): RL's queue holds the pool's fresh instances, never a row of the
    fixed splits, each pair of forms one group; an epoch meets each pool task once."""
    import swarl.demo.run as demo_run

    monkeypatch.setattr(demo_run, "CACHE", tmp_path / "cache")  # the pool's row cache
    demo = Demo(DemoOptions(run_dir=str(tmp_path / "run"), train_pool=64))
    keys: Keys = demo.keys()
    rows = demo.train_rows()
    assert len(rows) == 64 and {r["swarl_split"] for r in rows} == {"pool"}
    assert (tmp_path / "cache" / "pool").is_dir()
    await demo.enqueue(redis_url, range(1))
    ids, payloads, sizes = await _queued(redis_url, keys)
    assert len(ids) == 64 * 2 and set(sizes.values()) == {4}  # one epoch, 2 samples of each
    fixed = {r["instance_id"] for s in ("train", "heldout", "heldout_family") for r in load_tasks(s, suite="generated")}
    seen: Counter[str] = Counter()
    for start in range(0, len(ids), 4):
        rows4 = [p["instance"] for p in payloads[start:start + 4]]
        assert len({p["group_id"] for p in payloads[start:start + 4]}) == 1
        assert len({_form(r) for r in rows4}) == 2 and len({(r["swarl_family"], r["swarl_wording"]) for r in rows4}) == 1
        seen.update(r["instance_id"] for r in rows4)
    assert set(seen.values()) == {2} and len(seen) == 64 and not set(seen) & fixed
    # a few per family (the system test's --train-per-family): the pool's first ones, still in pairs
    small = Demo(DemoOptions(run_dir=str(tmp_path / "run3"), train_pool=64, train_per_family=2))
    assert [r["instance_id"] for r in small.train_rows()] == [r["instance_id"] for r in rows[:8]]
    assert all(len(u) == 2 for u in small.train_units())


def test_a_learner_batch_trains_a_pair_whole_with_one_baseline():
    """Groups arrive interleaved; every batch holds whole groups, so both forms of a symptom are in
    the same step. A policy that ignores the code — one edit for the symptom, which fixes form A and
    breaks form B — gets advantages +1 / -1 from a pair (the code is all that differs between the
    samples), where a group per task would give it nothing to learn from (all rewards equal)."""
    rng = random.Random(0)
    samples = []
    for g in range(8):
        for k in range(4):
            reward = 1.0 if k % 2 == 0 else -1.0  # A, B, A, B: A resolved, B not
            samples.append(make_sample(f"pair{g}", k, reward))
    rng.shuffle(samples)
    asm = Assembler(n_per_group=4, batch_size=16, max_staleness=2, group_timeout_s=600)
    batches = []
    for i in range(0, len(samples), 5):
        asm.add([Entry(f"1-{i + j}", s) for j, s in enumerate(samples[i:i + 5])])
        while (b := asm.take_batch(0)) is not None:
            batches.append(b)
    assert len(batches) == 2
    for b in batches:
        assert all(len(g.episodes) == 4 for g in b.groups)
        items, _ = batch_items(b, LearnerConfig())
        assert sorted({it.adv for it in items}) == [-1.0, 1.0]
    # the same episodes as a group per task: equal rewards, zero advantages
    alone = [make_sample(f"task{k % 2}", k // 2, 1.0 if k % 2 == 0 else -1.0) for k in range(4)]
    asm = Assembler(n_per_group=2, batch_size=4, max_staleness=0, group_timeout_s=600)
    asm.add([Entry(f"2-{i}", s) for i, s in enumerate(alone)])
    b = asm.take_batch(0)
    assert b is not None and {it.adv for it in batch_items(b, LearnerConfig())[0]} == {0.0}
