"""From replay entries to training batches: episodes, groups, staleness, dedupe.

An episode is complete when `steps_total` samples of its episode_id have arrived (dynamic
history: one sample per step, all sharing the episode's reward). A group is ready when
`n_samples_per_prompt` episodes are complete, or `group_timeout_s` after its first sample
(then `partial_groups` decides: use the complete episodes, or drop the group). Staleness is
judged when a group is taken for training, against the learner's version at that moment:
episodes with policy_version < version - max_staleness are dropped and counted per age.

A group waits for its slowest episode, and with heavy-tailed episodes that wait is what makes
whole groups stale: at version v + max_staleness (the last step that may train version v) its
finished episodes would be trained now or never. So a step takes, before anything else, the
groups at their last chance: complete ones beyond batch_size too, and (`salvage`, with
partial_groups "use") the finished episodes of open groups, at least two of them (fewer carry
no group-relative advantage). Their episodes still running arrive late and are dropped (their
slots given back then). The rest of the batch is filled oldest version first. At
max_staleness 0 no group is salvaged: a synchronous step trains complete groups of the current
version only.

Every entry ends *decided* (trained or dropped); decided stream ids and sample ids are handed
to the loop, which records them in the next checkpoint and only then acknowledges them.
Entries still held (incomplete groups) stay pending in Redis, so a restart re-reads them.

An episode that wrote trainable samples keeps its admission slot (broker.admission) until the
learner trains it; one the learner drops instead (stale, incomplete, too small a group, late)
is counted in `take_give_back()`, and the loop returns its slot. Otherwise every drop would
shrink the rollout capacity for the rest of the run, and (max_staleness + 1) x batch_size
dropped episodes would stop the actors for good. Masked episodes gave their slot back already.
So do the episodes of a step beyond batch_size (whole groups overshoot it): admission counts
batch_size per step. Admission reserves a group's slots when its first episode starts; a group
closed before all its episodes arrived is listed by `take_forfeits()`, and the loop hands back
what its members not yet started had reserved.
"""

from __future__ import annotations

import time
from collections import Counter, OrderedDict
from dataclasses import dataclass, field

from broker.replay import Entry
from broker.wire import Sample


@dataclass
class Episode:
    episode_id: str
    steps_total: int
    entries: dict[int, Entry] = field(default_factory=dict)  # step_index -> entry

    @property
    def complete(self) -> bool:
        return len(self.entries) >= self.steps_total

    @property
    def samples(self) -> list[Sample]:
        return [self.entries[k].sample for k in sorted(self.entries)]

    @property
    def first(self) -> Sample:
        return self.entries[min(self.entries)].sample

    @property
    def masked(self) -> bool:
        return any(e.sample.masked for e in self.entries.values())

    @property
    def policy_version(self) -> int:
        # the oldest trained token of any of its samples (weight_sync.rollout_mode in-flight:
        # versions change under an episode; pinned: all one version): the staleness bound's
        return min(e.sample.oldest_version for e in self.entries.values())


@dataclass
class Group:
    group_id: str
    first_seen: float
    episodes: dict[str, Episode] = field(default_factory=dict)

    def entries(self) -> list[Entry]:
        return [e for ep in self.episodes.values() for e in ep.entries.values()]

    def n_complete(self) -> int:
        return sum(ep.complete for ep in self.episodes.values())


@dataclass
class ReadyGroup:
    """A group taken for training: its usable episodes (fresh, complete, unmasked)."""

    group_id: str
    episodes: list[Episode]

    @property
    def oldest(self) -> int:
        return min(ep.policy_version for ep in self.episodes)


@dataclass
class Batch:
    groups: list[ReadyGroup]
    decided_ids: list[str]        # stream ids to ack after the checkpoint
    staleness: Counter[int]       # age (versions behind) -> trained samples
    version: int = 0              # the learner's policy version the batch is taken at

    @property
    def n_episodes(self) -> int:
        return sum(len(g.episodes) for g in self.groups)


class Assembler:
    def __init__(self, n_per_group: int, batch_size: int, max_staleness: int,
                 group_timeout_s: float, partial_groups: str = "use", min_group_episodes: int = 1,
                 consumed: set[str] | None = None, closed_groups: set[str] | None = None,
                 clock=time.monotonic, salvage: bool = True) -> None:
        self.n_per_group = n_per_group
        self.batch_size = batch_size
        self.max_staleness = max_staleness
        self.group_timeout_s = group_timeout_s
        self.partial_groups = partial_groups
        self.min_group_episodes = min_group_episodes
        self.salvage = salvage and partial_groups == "use" and max_staleness > 0
        self.salvaged = 0  # open groups trained at their last chance without their stragglers
        self.consumed: set[str] = set(consumed or ())
        self.closed_groups: set[str] = set(closed_groups or ())
        self.clock = clock
        self.groups: dict[str, Group] = {}
        self.held: set[str] = set()  # sample ids held in open groups
        self._ready: list[ReadyGroup] = []  # closed to new samples, waiting for a full batch
        self._ready_ids: set[str] = set()
        # decided but not yet handed out in a Batch (drops between training steps)
        self.pending_ids: list[str] = []
        self.dropped: Counter[str] = Counter()       # reason -> samples
        self.dropped_stale: Counter[int] = Counter()  # age -> samples
        # episodes dropped while holding an admission slot, not yet handed back (see above);
        # the ids already counted, so an episode's late steps are not counted twice (bounded)
        self._give_back = 0
        self._given_back: OrderedDict[str, None] = OrderedDict()
        self._forfeits: list[str] = []  # groups closed with episodes missing (see above)
        # generated tokens of unmasked samples decided since the last take_tokens(): "trained"
        # (in the loss), "loss_masked" (in a trained sample, out of the loss: a format error),
        # "dropped_<reason>". Masked samples' tokens are counted wasted by their actor.
        self.tokens: Counter[str] = Counter()
        self.tokens_total: Counter[str] = Counter()  # the same, for the run (the loop restores it)

    # -- intake ------------------------------------------------------------------------
    def add(self, entries: list[Entry]) -> None:
        now = self.clock()
        for e in entries:
            s = e.sample
            if s.sample_id in self.consumed or s.sample_id in self.held:
                self._drop([e], "duplicate", mark_consumed=False)
                continue
            ep_id = s.episode_id or f"{s.group_id}/{s.sample_index}"
            if s.group_id in self.closed_groups or s.group_id in self._ready_ids:
                self._drop([e], "late")
                if not s.masked:
                    self._count_give_back(ep_id)
                continue
            g = self.groups.get(s.group_id)
            if g is None:
                g = self.groups[s.group_id] = Group(s.group_id, now)
            ep = g.episodes.get(ep_id)
            if ep is None:
                ep = g.episodes[ep_id] = Episode(ep_id, max(1, s.steps_total))
            if s.step_index in ep.entries:  # same step twice under another sample id
                self._drop([e], "duplicate")
                continue
            ep.entries[s.step_index] = e
            self.held.add(s.sample_id)

    def _drop(self, entries: list[Entry], reason: str, mark_consumed: bool = True) -> None:
        for e in entries:
            self.dropped[reason] += 1
            if not e.sample.masked:
                self._count(f"dropped_{reason}", e.sample.generated_tokens)
            self.pending_ids.append(e.id)
            self.held.discard(e.sample.sample_id)
            if mark_consumed:
                self.consumed.add(e.sample.sample_id)

    def _drop_episode(self, ep: Episode, reason: str, age: int | None = None) -> None:
        """Drop all of `ep` (never trained): its admission slot goes back unless it was masked;
        `age`: versions behind, for a stale episode."""
        if age is not None:
            self.dropped_stale[age] += len(ep.entries)
        self._drop(list(ep.entries.values()), reason)
        if not ep.masked:
            self._count_give_back(ep.episode_id)

    def _count_give_back(self, episode_id: str) -> None:
        if episode_id in self._given_back:
            return
        self._given_back[episode_id] = None
        if len(self._given_back) > 100_000:
            self._given_back.popitem(last=False)
        self._give_back += 1

    def take_give_back(self) -> int:
        """Episodes dropped since the last call that still held an admission slot."""
        n, self._give_back = self._give_back, 0
        return n

    def take_forfeits(self) -> list[str]:
        """Groups closed since the last call before all their episodes arrived."""
        out, self._forfeits = self._forfeits, []
        return out

    def owe_forfeits(self, group_ids: list[str]) -> None:
        """Forfeits not done (Redis away): handed out again with the next ones."""
        self._forfeits.extend(group_ids)

    def owe_give_back(self, n: int) -> None:
        """Slots taken but not handed back (Redis away): handed back with the next ones."""
        self._give_back += n

    def _close(self, g: Group, decided: bool) -> None:
        """No more samples join `g`; once decided (dropped or trained) the checkpoint records it."""
        self.groups.pop(g.group_id, None)
        if len(g.episodes) < self.n_per_group:
            self._forfeits.append(g.group_id)
        if decided:
            self.closed_groups.add(g.group_id)
        else:
            self._ready_ids.add(g.group_id)

    def _decide(self, group_id: str) -> None:
        self._ready_ids.discard(group_id)
        self.closed_groups.add(group_id)

    # -- output ------------------------------------------------------------------------
    def ready_groups(self, version: int) -> list[ReadyGroup]:
        """Close every ready group (oldest first); return those with enough usable episodes."""
        now = self.clock()
        out: list[ReadyGroup] = []
        for g in sorted(self.groups.values(), key=lambda g: g.first_seen):
            complete = g.n_complete() >= self.n_per_group
            timed_out = now - g.first_seen >= self.group_timeout_s
            if not (complete or timed_out):
                continue
            if not complete and self.partial_groups == "drop":
                self._close(g, decided=True)
                for ep in g.episodes.values():
                    self._drop_episode(ep, "group_timeout")
                continue
            usable = self._usable(g, version)
            self._drop_unusable(g, usable, version)
            if len(usable) < max(1, self.min_group_episodes):
                self._close(g, decided=True)
                for ep in usable:
                    self._drop_episode(ep, "small_group")
                continue
            self._close(g, decided=False)
            out.append(ReadyGroup(g.group_id, usable))
        return out

    def _usable(self, g: Group, version: int) -> list[Episode]:
        """The episodes of `g` a step at `version` may train: complete, unmasked, fresh."""
        return [ep for ep in g.episodes.values() if ep.complete and not ep.masked
                and ep.policy_version >= version - self.max_staleness]

    def _drop_unusable(self, g: Group, usable: list[Episode], version: int) -> None:
        """Drop every episode of `g` not in `usable`, counted by why."""
        keep = {id(ep) for ep in usable}
        for ep in g.episodes.values():
            if id(ep) in keep:
                continue
            if not ep.complete:
                self._drop_episode(ep, "incomplete_episode")
            elif ep.masked:
                self._drop_episode(ep, "masked")
            else:
                self._drop_episode(ep, "stale", age=version - ep.policy_version)

    def batch_ready(self, version: int) -> bool:
        """Whether `take_batch(version)` would return a batch now (ready groups are closed and
        stale episodes dropped as it would; nothing is taken)."""
        self._refresh_ready(version)
        return sum(len(g.episodes) for g in self._ready) >= self.batch_size

    def _refresh_ready(self, version: int) -> None:
        self._ready = self._ready + self.ready_groups(version)
        # groups already closed may have gone stale while waiting for the batch to fill
        fresh: list[ReadyGroup] = []
        for rg in self._ready:
            keep = [ep for ep in rg.episodes if ep.policy_version >= version - self.max_staleness]
            for ep in rg.episodes:
                if ep not in keep:
                    self._drop_episode(ep, "stale", age=version - ep.policy_version)
            if len(keep) >= max(1, self.min_group_episodes):
                fresh.append(ReadyGroup(rg.group_id, keep))
            else:
                self._decide(rg.group_id)
                for ep in keep:
                    self._drop_episode(ep, "small_group")
        self._ready = fresh

    def take_batch(self, version: int) -> Batch | None:
        """Ready groups totalling >= batch_size usable episodes, or None (they keep waiting)."""
        if not self.batch_ready(version):
            return None  # nothing goes stale while the learner waits: the version stays
        fresh = self._ready
        last = version - self.max_staleness  # the oldest version this step may train, and the last
        if self.salvage:
            fresh += self._salvage(version)
        fresh.sort(key=lambda rg: rg.oldest)  # stable: arrival order within a version
        taken: list[ReadyGroup] = []
        n = 0
        while fresh and (n < self.batch_size or fresh[0].oldest <= last):
            rg = fresh.pop(0)
            taken.append(rg)
            n += len(rg.episodes)
        self._ready = fresh
        # admission counts batch_size episodes per step; whole groups can overshoot it, and the
        # episodes beyond it would otherwise be charged to the capacity of the steps to come
        self._give_back += n - self.batch_size
        ids, self.pending_ids = self.pending_ids, []
        stale: Counter[int] = Counter()
        for rg in taken:
            self._decide(rg.group_id)
            for ep in rg.episodes:
                stale[max(0, version - ep.policy_version)] += len(ep.entries)
                for e in ep.entries.values():
                    ids.append(e.id)
                    self.held.discard(e.sample.sample_id)
                    self.consumed.add(e.sample.sample_id)
                    self._count_trained(e.sample)
        return Batch(taken, ids, stale, version)

    def _count_trained(self, s: Sample) -> None:
        if s.masked:
            return
        gen = s.generated_tokens
        in_loss = gen if s.token_versions is None else int(((s.token_versions >= 0) & (s.loss_mask == 1)).sum())
        self._count("trained", in_loss)
        if gen > in_loss:
            self._count("loss_masked", gen - in_loss)

    def take_tokens(self) -> Counter[str]:
        """Token counts decided since the last call (see `tokens`)."""
        out, self.tokens = self.tokens, Counter()
        return out

    def _count(self, what: str, n: int) -> None:
        self.tokens[what] += n
        self.tokens_total[what] += n

    def _salvage(self, version: int) -> list[ReadyGroup]:
        """Open groups whose finished episodes go stale after this step (see the module doc)."""
        out: list[ReadyGroup] = []
        for g in sorted(self.groups.values(), key=lambda g: g.first_seen):
            usable = self._usable(g, version)
            if len(usable) < max(2, self.min_group_episodes):
                continue
            if min(ep.policy_version for ep in usable) > version - self.max_staleness:
                continue  # it can still wait for its stragglers
            self._drop_unusable(g, usable, version)
            self._close(g, decided=False)
            self.salvaged += 1
            out.append(ReadyGroup(g.group_id, usable))
        return out

    @property
    def ready_episodes(self) -> int:
        """Usable episodes closed for training and waiting (as of the last batch_ready)."""
        return sum(len(g.episodes) for g in self._ready)

    def at_stake(self, version: int) -> dict[str, int | None]:
        """What the step at `version` means for open groups with finished episodes at their last
        chance (nothing is changed): group id -> None when the step salvages the group (its
        members still running are then stopped), else the generated tokens of those finished
        episodes, which go stale with the group's running stragglers (learner.hold)."""
        last = version - self.max_staleness
        out: dict[str, int | None] = {}
        for g in self.groups.values():
            usable = self._usable(g, version)
            due = [ep for ep in usable if ep.policy_version <= last]
            if not due:
                continue
            if self.salvage and len(usable) >= max(2, self.min_group_episodes):
                out[g.group_id] = None
            else:
                out[g.group_id] = sum(s.generated_tokens for ep in due for s in ep.samples)
        return out

    def take_decided(self) -> list[str]:
        """Stream ids of the drops decided since the last batch (acked with the next checkpoint)."""
        ids, self.pending_ids = self.pending_ids, []
        return ids

    @property
    def n_held(self) -> int:
        return len(self.held)
