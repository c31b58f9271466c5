"""What the learner loop asks of the model, on one rank or on many.

`Trainer` is rank 0's handle: `train(items)` takes one optimizer step on a batch, `save`/`load`
a checkpoint's model part, `weights()` the policy to publish as a stream, `poll()` whether any
rank was asked to stop. On a single process it drives the backend directly; under torchrun it splits each
step's items into one shard per data-parallel index (tensor/pipeline peers get the same shard),
sends every rank its command (learner/ranks.py), does its own share, and merges the answers.
`follow` is the loop of every other rank.

Publishing never sends the model through the command channel: WEIGHTS only starts every rank's
`publish_tensors` (a collective that brings the tensors to rank 0 over tensor collectives, one
bucket at a time), rank 0 hands each tensor to the consumer as it arrives, and every rank
answers with a count.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from common.logs import get_logger
from learner.backends.base import TrainBackend
from learner.config import LearnerConfig
from learner.packing import TrainItem
from learner.ranks import LOAD, SAVE, STOP, TICK, TRAIN, WEIGHTS, Channel, Ranks
from learner.spike_clip import SpikeClip
from learner.train import by_minibatch, finish_stats, train_step

log = get_logger("learner.trainer")

Weights = Iterator[tuple[str, torch.Tensor]]
# statistics that are not sums over the step's samples
_MAX = ("imp_weight_max", "step_time_s")
_SAME = ("grad_norm", "grad_norm_max", "spike_clipped", "update_backtracked", "update_alpha_min", "lr",
         "skipped", "updates")


class RankWorker:
    """Carries out rank 0's commands on this rank."""

    def __init__(self, backend: TrainBackend, cfg: LearnerConfig) -> None:
        self.backend, self.cfg = backend, cfg
        self.spikes = SpikeClip(cfg.spike_clip)

    def handle(self, cmd: str, payload: Any) -> Any:
        if cmd == TRAIN:
            return train_step(self.backend, payload, self.cfg, spikes=self.spikes)
        if cmd == SAVE:
            self.backend.save(Path(payload))
            return None
        if cmd == LOAD:
            self.backend.load(Path(payload))
            return None
        if cmd == WEIGHTS:  # rank 0 streams its own share (Trainer.weights); this is a follower's
            return sum(1 for _ in self.backend.publish_tensors())
        if cmd == TICK:
            return None
        raise ValueError(f"unknown learner command {cmd!r}")


class Trainer:
    """Rank 0's handle on the model (one rank: the backend itself)."""

    def __init__(self, worker: RankWorker, ranks: Ranks) -> None:
        self.worker, self.ranks = worker, ranks
        self.channel = Channel(ranks) if ranks.distributed else None
        self.dp_of_rank: list[int] = [0]
        self.dp_size = 1
        if self.channel is not None:
            facts = self.channel.all_gather((worker.backend.dp_rank, worker.backend.dp_size))
            self.dp_of_rank = [dp for dp, _ in facts]
            self.dp_size = facts[0][1]

    @classmethod
    def single(cls, backend: TrainBackend, cfg: LearnerConfig) -> Trainer:
        """One process, no torchrun."""
        return cls(RankWorker(backend, cfg), Ranks(0, 1, 0))

    # -- commands ------------------------------------------------------------------------
    def _run(self, cmd: str, per_rank: list[Any]) -> list[Any]:
        """Every rank carries out `cmd` with its payload; their results in rank order."""
        if self.channel is None:
            return [self.worker.handle(cmd, per_rank[0])]
        mine = self.channel.send(cmd, per_rank)
        replies = self.channel.collect(self.worker.handle(cmd, mine))
        if any(r.stop for r in replies):
            self.ranks.stop_requested.set()
        return [r.result for r in replies]

    def train(self, items: list[TrainItem]) -> dict[str, float]:
        """One training step on `items` (all ranks: learner.train.train_step's optimizer
        updates); the merged statistics."""
        t0 = time.perf_counter()
        if self.channel is None:
            return finish_stats(self._run(TRAIN, [items])[0])
        shards = shard_step(items, self.dp_size)
        results = self._run(TRAIN, [shards[dp] for dp in self.dp_of_rank])
        # one answer per data-parallel index: tensor/pipeline peers report the same samples
        first: dict[int, dict[str, float]] = {}
        for dp, res in zip(self.dp_of_rank, results, strict=True):
            first.setdefault(dp, res)
        return finish_stats(merge_stats(list(first.values()), time.perf_counter() - t0))

    def _everyone(self, x: Any) -> list[Any]:
        return [x] * self.ranks.world

    def save(self, path: Path) -> None:
        self._run(SAVE, self._everyone(str(path)))

    def load(self, path: Path) -> None:
        self._run(LOAD, self._everyone(str(path)))

    def weights(self) -> Weights:
        """The policy in HF naming, as CPU tensors on rank 0, streamed: each comes over tensor
        collectives as the consumer asks for it, so rank 0 holds what the consumer keeps plus
        one bucket. The stream is one collective of every rank: consume it to the end in one
        thread, with no other command in between; a consumer that stops early (an error) has
        the rest drained when the generator is closed, so the ranks stay in step."""
        stream = self.worker.backend.publish_tensors()
        if self.channel is None:
            yield from stream
            return
        self.channel.send(WEIGHTS, self._everyone(None))
        n = 0
        try:
            for named in stream:
                n += 1
                yield named
        finally:
            for _ in stream:  # the followers are in the same collective until its end
                pass
            replies = self.channel.collect(n)
            if any(r.stop for r in replies):
                self.ranks.stop_requested.set()

    def poll(self) -> bool:
        """Between steps: True when any rank has been asked to stop."""
        if self.channel is not None:
            self._run(TICK, self._everyone(None))
        return self.ranks.stop_requested.is_set()

    def close(self) -> None:
        """Let every other rank leave its loop."""
        if self.channel is not None:
            self.channel.send(STOP, self._everyone(None))
            self.channel.collect(None)


def follow(worker: RankWorker, ranks: Ranks) -> None:
    """The loop of every rank but 0: carry out commands until told to stop. An exception ends
    the process (and so the job): a rank that cannot do its part must not answer as if it had."""
    channel = Channel(ranks)
    channel.all_gather((worker.backend.dp_rank, worker.backend.dp_size))
    while True:
        cmd, payload = channel.receive()
        if cmd == STOP:
            channel.answer(None)
            log.info("rank_stopped", rank=ranks.rank)
            return
        channel.answer(worker.handle(cmd, payload))


def shard_step(items: list[TrainItem], n: int) -> list[list[TrainItem]]:
    """A step's `n` data-parallel shards: each minibatch sharded on its own (shard_items), so
    every rank takes part in every optimizer update."""
    shards: list[list[TrainItem]] = [[] for _ in range(n)]
    for part in by_minibatch(items):
        for dp, shard in enumerate(shard_items(part, n)):
            shards[dp] += shard
    return shards


def shard_items(items: list[TrainItem], n: int) -> list[list[TrainItem]]:
    """`n` shards with about the same number of tokens (longest first, each to the lightest
    shard). A shard that would be empty gets a copy of a sample that trains nothing (weight and
    advantage 0; its loss slots are kept, so it has a micro-batch), so every data-parallel rank
    still takes part in the step."""
    shards: list[list[TrainItem]] = [[] for _ in range(n)]
    load = [0] * n
    for it in sorted(items, key=lambda it: -len(it.tokens)):
        k = min(range(n), key=lambda i: (load[i], i))
        shards[k].append(it)
        load[k] += len(it.tokens)
    for s in shards:
        if not s and items:
            it = items[0]
            s.append(TrainItem(f"{it.sample_id}#idle", it.tokens, it.loss_mask, it.behav_logp,
                               0.0, 0.0, minibatch=it.minibatch))
    return shards


def merge_stats(parts: list[dict[str, float]], wall_s: float) -> dict[str, float]:
    """One step's statistics from each data-parallel shard's: sums add up, maxima take the
    largest, and what the optimizer step reports is the same everywhere."""
    out: dict[str, float] = {}
    for k in parts[0]:
        vals = [p[k] for p in parts if k in p]
        if k in _SAME:
            out[k] = vals[0]
        elif k in _MAX:
            out[k] = max(vals)
        else:
            out[k] = sum(vals)
    out["step_time_s"] = wall_s
    out["tokens_per_s"] = out.get("tokens", 0.0) / wall_s if wall_s > 0 else 0.0
    return out
