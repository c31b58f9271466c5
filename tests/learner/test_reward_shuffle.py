"""The shuffled-reward control (learner.reward_shuffle): the episodes' rewards are permuted
across the whole batch before the advantages, so a group's advantages no longer follow what
its episodes did, while the batch's rewards (and so its reward statistics) stay the same."""

from __future__ import annotations

from collections import Counter

from learner_helpers import make_sample

from broker.replay import Entry
from learner.advantages import shuffle_episode_rewards
from learner.assembly import Assembler
from learner.config import LearnerConfig
from learner.train import batch_items


def test_a_permutation_of_the_episode_rewards_fixed_by_its_key() -> None:
    rewards = [[[1.0], [0.0]], [[-1.0, -1.0, -1.0], [0.5]], [[2.0], [3.0]]]
    out = shuffle_episode_rewards(rewards, "batch-1")
    assert [[len(r) for r in g] for g in out] == [[1, 1], [3, 1], [1, 1]]  # the shape stays
    assert all(len(set(r)) == 1 for g in out for r in g)  # an episode's steps share its reward
    flat = Counter(r[0] for g in out for r in g)
    assert flat == Counter([1.0, 0.0, -1.0, 0.5, 2.0, 3.0])  # the same rewards, moved
    assert out == shuffle_episode_rewards(rewards, "batch-1")  # a resumed learner repeats it
    keys = [shuffle_episode_rewards(rewards, f"batch-{k}") for k in range(20)]
    assert len({str(k) for k in keys}) > 10 and any(k != rewards for k in keys)


def _batch(groups: dict[str, tuple[float, float]]):
    samples = [make_sample(g, i, reward=r, seed=hash((g, i)) % 1000)
               for g, rs in groups.items() for i, r in enumerate(rs)]
    asm = Assembler(n_per_group=2, batch_size=2 * len(groups), max_staleness=0, group_timeout_s=60)
    asm.add([Entry(f"1-{i}", s) for i, s in enumerate(samples)])
    return asm.take_batch(0)


def test_batch_items_trains_on_shuffled_rewards_only_when_asked() -> None:
    # groups whose episodes agree: real GRPO advantages are all 0 (nothing to learn); with the
    # rewards shuffled across groups, episodes get advantages unrelated to what they did
    groups = {f"g{k}": ((1.0, 1.0) if k % 2 else (-1.0, -1.0)) for k in range(8)}
    items, stats = batch_items(_batch(groups), LearnerConfig())
    assert all(it.adv == 0.0 for it in items)
    items_s, stats_s = batch_items(_batch(groups), LearnerConfig(reward_shuffle=True))
    assert any(it.adv != 0.0 for it in items_s)
    assert sum(it.adv for it in items_s) == 0.0  # still GRPO: advantages centred per group
    assert stats_s["reward_mean"] == stats["reward_mean"] and stats_s["resolve_rate"] == stats["resolve_rate"]
