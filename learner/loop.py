"""The learner loop: read -> assemble -> train -> (checkpoint) -> (publish) -> ack.

Order of one step, and why it trains each sample exactly once across kill -9 + --resume:
1. train on the batch (optimizer step);
2. append the batch's sample ids to trained.jsonl (fsync) with the step number;
3. every `update_every` steps: version + 1;
4. every `checkpoint_every` steps: checkpoint (model, optimizer, RNG, step, version, consumed
   ids) — on its own cadence: a checkpoint holds the optimizer state (several times the
   weights), a published version only the weights;
5. publish the version, if the step made one (weights only);
6. after a checkpoint: XACK every entry decided up to it.
Nothing is acknowledged that no checkpoint records: a kill at any point loses the steps since
the last checkpoint (the model reverts to it, trained.jsonl lines after its step are dropped),
their entries are still pending, and resume claims them (XAUTOCLAIM) and trains them again. A
kill after 4 but before 6 re-delivers entries whose ids the checkpoint lists as consumed: they
are skipped and acknowledged. Entries dropped untrained while steps are not yet checkpointed
wait for the next checkpoint's acknowledgement too (the decision rests on state a kill loses).
Versions only go forward: the versions published after the checkpoint (of steps now lost) stay
published, so on resume the checkpoint's weights are published again as the next version after
the newest in the registry (never under a number servers already hold); a kill between a
checkpoint and its publish leaves the registry behind, and resume publishes the checkpointed
version. A clean stop checkpoints the steps since the last checkpoint.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from broker.admission import Admission
from broker.registry import PolicyRegistry
from broker.replay import ReplayReader
from broker.running import RunningEpisodes
from common.files import atomic_write_text
from common.logs import get_logger
from learner import checkpoint
from learner.assembly import Assembler, Batch
from learner.checkpoint import LearnerState
from learner.diagnostics import STATE_PREFIX, MismatchWatch, diagnostics
from learner.metrics_log import MetricsLog, TrainedIds, truncate_after
from learner.runtime import LearnerRuntime
from learner.train import batch_items
from learner.trainer import Trainer
from weight_sync.protocols import WeightPublisher

# Per-episode counts also logged as their batch total, agent/<name> (e.g. reward-hack attempts).
COUNTED_METRICS = ("reward_hack_attempts",)
log = get_logger("learner")


class Learner:
    def __init__(self, rt: LearnerRuntime, redis: Any, trainer: Trainer,
                 publisher: WeightPublisher | None, state: LearnerState | None = None,
                 consumer: str = "learner-0") -> None:
        self.rt, self.lcfg = rt, rt.learner
        self.redis, self.keys = redis, rt.keys
        keys = rt.keys
        self.trainer, self.publisher = trainer, publisher
        self.state = state or LearnerState()
        self.run_dir = Path(rt.run_dir)
        self.reader = ReplayReader(redis, keys, group=rt.replay.group, consumer=consumer)
        self.policy = PolicyRegistry(redis, keys)
        self.admission = Admission(redis, keys, rt.admission)
        self.running = RunningEpisodes(redis, keys)
        # straggler grace (learner.straggler_grace_s): since when the next step is held for
        # running episodes it would make stale; the seconds the last step waited
        self._hold_since: float | None = None
        self._holding = 0  # running episodes the held step waits for (learner_state `holding`)
        self._waited_s = 0.0
        self._grace_ran_out = 0
        self.asm = Assembler(
            n_per_group=self.lcfg.n_samples_per_prompt, batch_size=rt.admission.batch_size,
            max_staleness=rt.admission.max_staleness, group_timeout_s=self.lcfg.group_timeout_s,
            partial_groups=self.lcfg.partial_groups, min_group_episodes=self.lcfg.min_group_episodes,
            salvage=self.lcfg.salvage_groups,
            consumed=set(self.state.consumed), closed_groups=set(self.state.closed_groups))
        self.asm.dropped.update(self.state.dropped)
        self.asm.dropped_stale.update({int(k): v for k, v in self.state.dropped_stale.items()})
        self.tokens_path = self.run_dir / "learner" / "tokens.json"
        self.asm.tokens_total.update(self._restored_tokens())
        self.metrics = MetricsLog(self.run_dir, tensorboard=self.lcfg.tensorboard)
        self.trained = TrainedIds(self.run_dir / "learner" / "trained.jsonl")
        self._to_ack: list[str] = []
        self._last_ack = ""
        self._saved_step = self.state.step  # the step the newest checkpoint records
        self._stop = asyncio.Event()
        self._last_beat = 0.0
        self._diag: dict[str, float] = {}  # the last step's diagnostics (learner.diagnostics)
        self._warning = ""  # what the last step's diagnostics warn of, for `swarl status`
        self._mismatch = MismatchWatch(self.lcfg.mismatch_kl_bound, self.lcfg.mismatch_kl_steps)

    def stop(self) -> None:
        self._stop.set()

    async def run(self) -> LearnerState:
        # lines written after the checkpoint we start from describe steps that are lost
        truncate_after(self.trained.path, self.state.step)
        truncate_after(self.metrics.path, self.state.step)
        await self.reader.ensure_group()
        await self.admission.set_per_version(self.lcfg.update_every)
        pending = await self.reader.claim_pending(min_idle_ms=0)
        self.asm.add(pending)
        log.info("learner_start", step=self.state.step, version=self.state.version,
                 reclaimed=len(pending), consumed=len(self.asm.consumed))
        await self._ensure_published()
        last_arrival = time.monotonic()
        try:
            while not self._stop.is_set():
                if self.lcfg.max_steps is not None and self.state.step >= self.lcfg.max_steps:
                    break
                # asked before the read: an episode unlisted by then wrote its samples before,
                # so this read has them (never a step that just misses a straggler's samples)
                at_risk = await self._stragglers()
                entries = await self.reader.read(self.rt.replay.read_count, self.rt.replay.block_ms)
                if entries:
                    last_arrival = time.monotonic()
                    self.asm.add(entries)
                was_holding = self._hold_since is not None
                held = self._hold_for_stragglers(at_risk, full_read=len(entries) >= self.rt.replay.read_count)
                if held and not was_holding:  # tell at once: samples read and held wait for a step
                    await self._heartbeat(force=True)
                batch = None if held else self.asm.take_batch(self.state.version)
                await self._give_back()
                if batch is not None:
                    await self._train(batch)
                    last_arrival = time.monotonic()  # a step is not idle time: count from its end
                else:
                    # entries dropped while no step happens (stale, late, duplicates) need no
                    # checkpoint: they will never train, so acknowledge them now
                    dropped = self.asm.take_decided()
                    if self.state.step > self._saved_step:
                        self._to_ack += dropped  # decided on state a kill would lose
                    elif dropped:  # their tokens were counted by _give_back above
                        await self.reader.ack(dropped)
                        await asyncio.to_thread(self._save_acked_tokens)
                    if held:  # a batch is ready: waiting for stragglers is not idleness
                        last_arrival = time.monotonic()
                    elif (self.lcfg.idle_exit_s is not None
                            and time.monotonic() - last_arrival > self.lcfg.idle_exit_s):
                        log.info("learner_idle_exit", idle_s=self.lcfg.idle_exit_s)
                        break
                if await asyncio.to_thread(self.trainer.poll):  # a signal to any rank stops all
                    self.stop()
                await self._heartbeat()
            if self.state.step > self._saved_step:  # a clean stop keeps every step
                await self._checkpoint()
                await self._ack()
        finally:
            await self._heartbeat(force=True, status="stopped")
            self.metrics.close()
        return self.state

    async def _stragglers(self) -> tuple[int, int | None] | None:
        """(running episodes the next step would make stale, the oldest running version), or
        None when the next step cannot hold (no grace, it publishes no version, Redis away). A
        step that publishes version v + 1 leaves behind every episode whose oldest token is
        older than v + 1 - max_staleness: the actors stop it, or the learner drops its samples."""
        if self.lcfg.straggler_grace_s <= 0 or (self.state.step + 1) % max(1, self.lcfg.update_every):
            return None
        try:
            return await self.running.at_risk(self.state.version - self.rt.admission.max_staleness)
        except Exception as e:  # Redis away: no grace rather than no steps
            log.warning("straggler_check_failed", error=str(e))
            return None

    def _hold_for_stragglers(self, at_risk: tuple[int, int | None] | None, full_read: bool) -> bool:
        """True while the next step waits (learner.straggler_grace_s) for the running episodes
        it would make stale (`at_risk`, asked before this round's read). The grace runs from
        when a batch is ready; the loop reads on meanwhile. A read that filled its page may have
        left a straggler's samples unread: one more round then."""
        if at_risk is None or not self.asm.batch_ready(self.state.version):
            return False
        now = time.monotonic()
        if self._hold_since is not None and now - self._hold_since >= self.lcfg.straggler_grace_s:
            return False  # grace spent: step anyway
        n, oldest = at_risk
        if n == 0:
            return self._hold_since is not None and full_read
        self._holding = n
        if self._hold_since is None:
            self._hold_since = now
            log.info("step_held_for_stragglers", version=self.state.version, episodes=n,
                     oldest=oldest, grace_s=self.lcfg.straggler_grace_s)
        return True

    def _end_hold(self) -> None:
        """A step is taken: how long it waited for stragglers, for its metrics."""
        if self._hold_since is None:
            self._waited_s = 0.0
            return
        self._waited_s = time.monotonic() - self._hold_since
        if self._waited_s >= self.lcfg.straggler_grace_s:
            self._grace_ran_out += 1
        self._hold_since, self._holding = None, 0

    async def _give_back(self) -> None:
        """Admission slots of the episodes just dropped untrained (learner.assembly). Not
        checkpointed: after a crash the re-read drops give their slots back again, which only
        lets a few more rollouts start; the staleness bound is the learner's drop rule."""
        groups = self.asm.take_forfeits()
        for i, gid in enumerate(groups):
            try:
                await self.admission.forfeit(gid)
            except Exception as e:  # Redis away: these groups are tried again next round
                self.asm.owe_forfeits(groups[i:])
                log.warning("admission_forfeit_failed", groups=len(groups) - i, error=str(e))
                break
        n = self.asm.take_give_back()
        if n:
            try:
                await self.admission.release(n)
            except Exception as e:  # Redis away past its retries: the slots are retried next round
                self.asm.owe_give_back(n)
                log.warning("admission_give_back_failed", episodes=n, error=str(e))
        await self._count_tokens()

    async def _count_tokens(self) -> None:
        """The generated tokens decided (trained, or wasted by cause) into the stats hash, beside
        the actors' counts (actors.rollout): `swarl status` sums them. The learner's fields are
        written as the run's totals (HSET, not HINCRBY) from counts the checkpoint keeps, so a
        kill does not count the entries it re-reads twice: the totals go back to the checkpoint's
        with the steps, and the entries decided since are decided (and counted) again. Drops
        acknowledged without a checkpoint are kept in learner/tokens.json."""
        tokens = self.asm.take_tokens()
        if not tokens:
            return
        total = self.asm.tokens_total
        fields = {("tokens_trained" if w == "trained" else f"tokens_wasted/{w}"): total[w] for w in tokens}
        try:
            await self.redis.hset(self.keys.stats, mapping=fields)
        except Exception as e:  # Redis away: written with the next ones
            self.asm.tokens.update(tokens)
            log.warning("token_counts_failed", error=str(e))

    def _restored_tokens(self) -> dict[str, int]:
        """The decided token counts to resume from: the checkpoint's, or learner/tokens.json's
        when it was written at the checkpoint's step (drops acknowledged since it, which the
        restart will not read again)."""
        tokens = dict(self.state.tokens)
        with contextlib.suppress(FileNotFoundError, ValueError, KeyError):
            saved = json.loads(self.tokens_path.read_text())
            if int(saved["step"]) == self.state.step:
                tokens = {str(k): int(v) for k, v in saved["tokens"].items()}
        return tokens

    def _save_acked_tokens(self) -> None:
        """Drops acknowledged with no step since the checkpoint: their counts outlive a kill."""
        atomic_write_text(self.tokens_path, json.dumps({"step": self.state.step,
                                                        "tokens": dict(self.asm.tokens_total)}))

    async def _train(self, batch: Batch) -> None:
        self._end_hold()
        items, rstats = batch_items(batch, self.lcfg)
        m = await asyncio.to_thread(self.trainer.train, items)
        st = self.state
        st.step += 1
        st.trained_samples += len(items)
        st.trained_tokens += int(m["tokens"])
        self._to_ack += batch.decided_ids
        self._to_ack += self.asm.take_decided()
        if self.lcfg.log_trained_ids:
            await asyncio.to_thread(self.trained.append, st.step, [it.sample_id for it in items])
        publish = st.step % max(1, self.lcfg.update_every) == 0
        if publish:
            st.version += 1
        save = st.step % max(1, self.lcfg.checkpoint_every) == 0
        t_ckpt = t_pub = 0.0
        if save:
            t0 = time.perf_counter()
            await self._checkpoint()
            t_ckpt = time.perf_counter() - t0
        if publish:
            t0 = time.perf_counter()
            await self._publish(st.version)
            t_pub = time.perf_counter() - t0
        if save:
            await self._ack()
        # wall clock at the step's end, with step_time_s + checkpoint_s + publish_s: how long
        # the learner was busy, and so idle (benchmarks/async_vs_sync.py)
        self.metrics.log(st.step, {**self._step_metrics(batch, m, rstats), "time": time.time(),
                                   "checkpoint_s": t_ckpt, "publish_s": t_pub})
        log.info("step", step=st.step, version=st.version, loss=round(m["loss"], 5),
                 reward=round(rstats["reward_mean"], 4), samples=len(items),
                 tokens_per_s=round(m["tokens_per_s"], 1))
        self._diag = diagnostics({**m, **rstats})
        self._warning = ""
        if self._mismatch.over(m.get("mismatch_kl")):
            self._warning = (f"mismatch KL {m['mismatch_kl']:.3g} > {self.lcfg.mismatch_kl_bound:g} for "
                             f"{self._mismatch.run} steps: weight sync, temperature or tokenisation?")
            log.warning("mismatch_kl_high", step=st.step, mismatch_kl=round(m["mismatch_kl"], 5),
                        bound=self.lcfg.mismatch_kl_bound, steps=self._mismatch.run,
                        hint="the actors' logprobs differ from the learner's on the same tokens: "
                             "a weight-sync, sampling-temperature or tokenisation bug")

    async def _checkpoint(self) -> None:
        st = self.state
        self._to_ack += self.asm.take_decided()
        st.consumed = sorted(self.asm.consumed)
        st.closed_groups = sorted(self.asm.closed_groups)
        st.dropped = dict(self.asm.dropped)
        st.dropped_stale = {str(k): v for k, v in self.asm.dropped_stale.items()}
        st.tokens = dict(self.asm.tokens_total)
        await asyncio.to_thread(checkpoint.save, self.run_dir, self.trainer, st,
                                self.lcfg.keep_checkpoints)
        self._saved_step = st.step

    async def _ack(self) -> None:
        if self._to_ack:
            await self.reader.ack(self._to_ack)
            self._last_ack = max(self._to_ack, key=_id_key)
            self._to_ack = []
            await self.reader.trim_acked()

    async def _publish(self, version: int) -> None:
        if self.publisher is None:
            return
        t0 = time.perf_counter()
        # the publisher pulls the tensors as it writes or snapshots them (Trainer.weights
        # streams them from the ranks): the model is never gathered whole for it
        await self.publisher.publish(version, self.state.step, self.trainer.weights)
        log.info("published", version=version, step=self.state.step,
                 seconds=round(time.perf_counter() - t0, 3))

    async def _ensure_published(self) -> None:
        """At start, the registry and the checkpoint agree on the version: a crash between
        checkpoint and publish left the registry behind (publish the checkpointed version); a
        crash after weights-only publishes left it ahead with versions of lost steps (publish
        the checkpoint's weights as the version after the newest)."""
        if self.publisher is None:
            return
        current, st = await self.policy.current(), self.state
        if current == st.version:
            return
        if current > st.version:
            log.info("versions_after_checkpoint_lost", checkpoint_version=st.version, registry=current,
                     step=st.step, republish=current + 1)
            st.version = current + 1
        else:
            log.info("republish_after_resume", version=st.version, registry=current)
        await self._publish(st.version)

    async def _heartbeat(self, force: bool = False, status: str = "running") -> None:
        now = time.time()
        if not force and now - self._last_beat < self.lcfg.heartbeat_s:
            return
        self._last_beat = now
        await self.redis.hset(self.keys.learner_state, mapping={
            "step": self.state.step, "version": self.state.version,
            "consumed": len(self.asm.consumed), "held": self.asm.n_held,
            "last_ack_id": self._last_ack, "heartbeat": now, "status": status,
            "holding": self._holding if self._hold_since is not None else 0,
            "warning": self._warning,
            **{f"{STATE_PREFIX}{k}": round(v, 6) for k, v in self._diag.items()}})

    def _step_metrics(self, batch: Batch, m: dict[str, float], rstats: dict[str, float]) -> dict[str, Any]:
        out: dict[str, Any] = {"version": self.state.version, **rstats,
                               **{k: v for k, v in m.items()}}
        out["episodes"] = batch.n_episodes
        out["straggler_wait_s"] = round(self._waited_s, 3)  # this step held for running episodes
        out["straggler_grace_ran_out"] = self._grace_ran_out  # steps taken with some still running
        out["groups"] = len(batch.groups)
        out["samples_held"] = self.asm.n_held
        for age, n in sorted(batch.staleness.items()):
            out[f"staleness/age_{age}"] = n
        ages = [a for a, n in batch.staleness.items() for _ in range(n)]
        out["staleness/mean"] = sum(ages) / len(ages) if ages else 0.0
        out["staleness/max"] = max(ages) if ages else 0
        for reason, n in sorted(self.asm.dropped.items()):
            out[f"dropped/{reason}"] = n
        out["dropped/total"] = sum(self.asm.dropped.values())
        out["groups_salvaged"] = self.asm.salvaged  # since this learner process started
        for age, n in sorted(self.asm.dropped_stale.items()):
            out[f"dropped_stale/age_{age}"] = n
        for what, n in sorted(self.asm.tokens_total.items()):  # the run's (restored on resume)
            out[f"tokens/{what}"] = n
        out.update(agent_metrics(batch))
        return out


def agent_metrics(batch: Batch) -> dict[str, float]:
    """agent/<name>_mean and _max over the batch's episodes of the actors' per-episode metrics
    (Sample.metrics; an `agent/` prefix on the name is not repeated)."""
    values: dict[str, list[float]] = defaultdict(list)
    for g in batch.groups:
        for ep in g.episodes:
            merged: dict[str, float] = {}
            for s in ep.samples:
                merged.update(s.metrics)
            for k, v in merged.items():
                values[k.removeprefix("agent/")].append(float(v))
    out: dict[str, float] = {}
    for k, vs in values.items():
        out[f"agent/{k}_mean"] = sum(vs) / len(vs)
        out[f"agent/{k}_max"] = max(vs)
        if k in COUNTED_METRICS:
            out[f"agent/{k}"] = sum(vs)
    return out


def _id_key(sid: str) -> tuple[int, int]:
    ms, _, seq = sid.partition("-")
    return int(ms), int(seq or 0)
