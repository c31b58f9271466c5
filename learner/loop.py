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
from broker.running import Running, RunningEpisodes
from common.files import atomic_write_text
from common.logs import get_logger
from learner import checkpoint
from learner.assembly import Assembler, Batch
from learner.checkpoint import LearnerState
from learner.diagnostics import STATE_PREFIX, MismatchWatch, diagnostics
from learner.hold import HoldDecision, Straggler, decide
from learner.hold_inputs import HoldProbe
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
        # the hold rule (learner.hold): since when the next step is held for running episodes it
        # would leave behind; its latest decision; the seconds the last step waited
        self.hold_probe = HoldProbe(redis, keys, self.running, self.admission)
        self._hold_since: float | None = None
        self._holding = 0  # running episodes the held step waits for (learner_state `holding`)
        self._hold_dec = HoldDecision(False, "none")
        self._hold_at_risk = 0  # episodes the step would leave behind, at its latest decision
        self._step_hold: dict[str, Any] = {}  # the last step's hold figures (its metrics)
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
                held = await self._hold_for_stragglers(at_risk, full_read=len(entries) >= self.rt.replay.read_count)
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

    async def _stragglers(self) -> list[Running] | None:
        """The running episodes (broker.running), or None when the next step cannot hold (it
        publishes no version, holds are off, Redis away). Asked before the round's read: an
        episode unlisted by then wrote its samples before, so the read has them."""
        if self.lcfg.straggler_grace_s == 0 or (self.state.step + 1) % max(1, self.lcfg.update_every):
            return None
        try:
            return await self.running.snapshot()
        except Exception as e:  # Redis away: no hold rather than no steps
            log.warning("straggler_check_failed", error=str(e))
            return None

    def _left_behind(self, running: list[Running]) -> list[Straggler]:
        """The running episodes a step publishing version v + 1 leaves behind: those whose oldest
        token is older than v + 1 - max_staleness (the actors stop them, or the learner drops
        their samples), and those of groups it trains without them (salvaged at their last
        chance: the actors stop them). Each carries the tokens of its group's finished episodes
        that go stale with it (a group too small to salvage)."""
        v = self.state.version
        stake = self.asm.at_stake(v)
        out: list[tuple[str | None, Running]] = []
        for r in running:
            gid = self.keys.group_of(r.job_id)
            if gid is not None and gid in self.asm.closed_groups:
                continue  # its group was decided already: the actors stop it, whatever the step
            salvaged = gid in stake and stake[gid] is None
            if r.version <= v - self.rt.admission.max_staleness or salvaged:
                out.append((gid, r))
        per_group: dict[str | None, int] = {}
        for gid, _ in out:
            per_group[gid] = per_group.get(gid, 0) + 1
        return [Straggler(r.tokens, r.elapsed_s, r.graded_for_s,
                          (stake.get(gid) or 0) // per_group[gid] if gid is not None else 0)
                for gid, r in out]

    async def _hold_for_stragglers(self, running: list[Running] | None, full_read: bool) -> bool:
        """True while the next step waits for the running episodes it would leave behind
        (`running`, asked before this round's read), as long as the hold rule finds the wait
        worth its cost (learner.hold: decided afresh each round). The loop reads on meanwhile.
        A read that filled its page may have left a straggler's samples unread: one more round
        then."""
        if running is None or not self.asm.batch_ready(self.state.version):
            self._hold_dec, self._hold_at_risk = HoldDecision(False, "none"), 0
            return False
        stragglers = self._left_behind(running)
        self._hold_at_risk = len(stragglers)
        if not stragglers:
            self._hold_dec = HoldDecision(False, "none")
            return self._hold_since is not None and full_read
        now = time.monotonic()
        held_s = now - self._hold_since if self._hold_since is not None else 0.0
        try:
            inputs = await self.hold_probe.inputs(
                running, stragglers, backlog=self.asm.ready_episodes >= 2 * self.rt.admission.batch_size,
                held_s=held_s)
        except Exception as e:  # Redis away: step rather than wait on figures it cannot read
            log.warning("hold_inputs_failed", error=str(e))
            return False
        self._hold_dec = decide(inputs, cap_s=self.lcfg.straggler_grace_s, worth=self.lcfg.straggler_worth)
        if not self._hold_dec.hold:
            return False
        self._holding = len(stragglers)
        if self._hold_since is None:
            self._hold_since = now
            log.info("step_held_for_stragglers", version=self.state.version, episodes=len(stragglers),
                     **self._hold_dec.metrics())
        return True

    def _end_hold(self) -> None:
        """A step is taken: how long it waited, and why it went (for its metrics)."""
        waited = time.monotonic() - self._hold_since if self._hold_since is not None else 0.0
        d = self._hold_dec
        if self._hold_since is not None:
            log.info("step_after_hold", version=self.state.version, waited_s=round(waited, 2),
                     left_behind=self._hold_at_risk, **d.metrics())
        self._step_hold = {
            "straggler_wait_s": round(waited, 3),  # this step held for running episodes
            "hold/left_behind": self._hold_at_risk,  # running episodes it left (stopped, dropped)
            **{f"hold/{k}": v for k, v in d.metrics().items() if k != "decision"}}
        self._hold_since, self._holding, self._hold_at_risk = None, 0, 0
        self._hold_dec = HoldDecision(False, "none")

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
            **{f"{STATE_PREFIX}{k}": round(v, 6) for k, v in self._diag.items()},
            **self._hold_state()})

    def _hold_state(self) -> dict[str, Any]:
        """The hold rule's latest decision and inputs, for `swarl status` (learner.hold)."""
        d = self._hold_dec
        return {"hold_at_risk": self._hold_at_risk, "hold_why": d.why,
                "hold_saved_tokens": round(d.saved_tokens), "hold_cost_tokens": round(d.cost_tokens),
                "hold_for_s": round(d.for_s, 1), "hold_blocked_slots": round(d.blocked_slots, 1),
                "hold_held_s": round(time.monotonic() - self._hold_since, 1) if self._hold_since is not None else 0}

    def _step_metrics(self, batch: Batch, m: dict[str, float], rstats: dict[str, float]) -> dict[str, Any]:
        out: dict[str, Any] = {"version": self.state.version, **rstats,
                               **{k: v for k, v in m.items()}}
        out["episodes"] = batch.n_episodes
        out.update(self._step_hold)  # the hold rule at this step (learner.hold)
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
