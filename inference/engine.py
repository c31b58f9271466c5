"""The CPU server's generation worker: one thread owns the model and runs continuous batching.

Requests that arrive together are prefilled as one left-padded batch and merged into the
running batch; every decode step feeds one token for every running request (per-row
positions, a shared padded KV cache). Control operations (weight updates, pause, abort) are
queued to the same thread and run between decode steps, so nothing else touches the model.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import functools
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from common.logs import get_logger
from inference.sampling import SamplingParams, sample
from inference.weight_versions import Span, VersionEvent, spans

log = get_logger("inference")


@dataclass
class GenRequest:
    input_ids: list[int]
    params: SamplingParams
    rid: str = field(default_factory=lambda: uuid.uuid4().hex)
    return_logprob: bool = False
    output_ids: list[int] = field(default_factory=list)
    output_logprobs: list[float] = field(default_factory=list)
    finish_reason: dict[str, Any] | None = None
    stop_trim: str | None = None  # matched stop string (trimmed from text unless no_stop_trim)
    created: float = field(default_factory=time.monotonic)
    weight_version: str = ""
    version_events: list[VersionEvent] = field(default_factory=list)  # one per version change it lived through
    weight_versions: list[Span] = field(default_factory=list)  # set when it finishes
    retractions: int = 0
    on_done: Callable[[GenRequest], None] | None = None
    cancelled: bool = False

    @property
    def max_new_tokens(self) -> int:
        return self.params.max_new_tokens if self.params.max_new_tokens is not None else 1 << 30


@dataclass
class EngineStats:
    prefill_batches: int = 0
    max_prefill_batch: int = 0
    decode_steps: int = 0
    batched_decode_steps: int = 0  # steps with more than one running request
    max_decode_batch: int = 0
    requests_finished: int = 0
    tokens_generated: int = 0
    weight_updates: int = 0
    retracted: int = 0  # requests put back in the queue by pause_generation(retract)


class Engine:
    """Owns a transformers causal LM (fp32, on `device`: the CPU by default); `submit` a
    GenRequest, `call` a control op. The model and its KV cache live on `device`; the batch's
    bookkeeping (mask, positions, last tokens) and sampling stay on the CPU, so sampling draws
    the same numbers whatever the device."""

    def __init__(self, model_dir: str | Path, weight_version: str = "0", max_batch_size: int = 32,
                 max_prefill_tokens: int = 8192, seed: int = 0, device: str = "cpu") -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

        self.model_dir = str(model_dir)
        self.tokenizer = AutoTokenizer.from_pretrained(self.model_dir)
        self.model = AutoModelForCausalLM.from_pretrained(
            self.model_dir, dtype=torch.float32, attn_implementation="sdpa")
        self.device = torch.device(device)
        self.model.to(self.device)  # type: ignore[arg-type]  # transformers' stub types .to() as for a module
        self.model.eval()
        self.config = self.model.config
        self.vocab_size = int(self.config.vocab_size)
        self.context_len = int(getattr(self.config, "max_position_embeddings", 1 << 30))
        eos: set[int] = set()
        for src in (self.config.eos_token_id, self.tokenizer.eos_token_id):
            eos.update(src if isinstance(src, list) else ([src] if src is not None else []))
        try:
            gc = GenerationConfig.from_pretrained(self.model_dir)
            e = gc.eos_token_id
            eos.update(e if isinstance(e, list) else ([e] if e is not None else []))
        except OSError:
            pass
        self.eos_ids = eos
        self.weight_version = str(weight_version)
        self.max_batch_size = max_batch_size
        self.max_prefill_tokens = max_prefill_tokens
        self.generator = torch.Generator().manual_seed(seed)
        self.stats = EngineStats()
        self.paused = False
        self._hold_running = False  # pause in_place: keep the running batch, stop stepping
        self._waiting: collections.deque[GenRequest] = collections.deque()
        self._running: list[GenRequest] = []
        self._ops: collections.deque[tuple[Callable[[], Any], concurrent.futures.Future]] = collections.deque()
        self._cv = threading.Condition()
        self._stop = False
        # KV cache of the running batch: per layer (keys, values) [B, H, T, D]; mask [B, T]
        self._cache: Any = None  # DynamicCache of _GrowingLayer, shared by the running rows
        self._mask: Any = None
        self._pos: Any = None   # next position id per row [B]
        self._last: Any = None  # last sampled token per row (not yet fed) [B]
        self._thread = threading.Thread(target=self._loop, name="generation-worker", daemon=True)

    # -- public (any thread) -------------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        with self._cv:
            self._stop = True
            self._cv.notify_all()
        self._thread.join(timeout=30)

    def submit(self, req: GenRequest) -> None:
        with self._cv:
            self._waiting.append(req)
            self._cv.notify_all()

    def cancel(self, req: GenRequest) -> None:
        """The caller went away: drop the request at the next step."""
        req.cancelled = True
        with self._cv:
            self._cv.notify_all()

    def call(self, fn: Callable[[], Any]) -> concurrent.futures.Future:
        """Run `fn` on the worker thread between decode steps; returns its future."""
        fut: concurrent.futures.Future = concurrent.futures.Future()
        with self._cv:
            self._ops.append((fn, fut))
            self._cv.notify_all()
        return fut

    async def acall(self, fn: Callable[[], Any]) -> Any:
        return await asyncio.wrap_future(self.call(fn))

    @property
    def num_running(self) -> int:
        return len(self._running)

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    # -- control ops (run on the worker thread via `call`) --------------------------------
    def set_weight_version(self, new: str) -> None:
        """The version the loaded weights are labelled with from now on. Every live request
        that has output tokens records the change (SGLang's record_weight_version_change), so
        its answer says which of its tokens each version made."""
        new = str(new)
        if new == self.weight_version:
            return
        with self._cv:
            live = [*self._running, *self._waiting]
        for r in live:
            if r.output_ids and r.finish_reason is None:
                r.version_events.append(VersionEvent(self.weight_version, len(r.output_ids)))
        self.weight_version = new

    def abort(self, rid: str = "", abort_all: bool = False, message: str = "Aborted by request") -> int:
        n = 0
        for req in list(self._running):
            if abort_all or req.rid == rid:
                self._finish(req, {"type": "abort", "message": message})
                n += 1
        with self._cv:  # handlers append to the queue from the event loop's thread
            queued = [r for r in self._waiting if abort_all or r.rid == rid]
            for req in queued:
                self._waiting.remove(req)
        for req in queued:
            self._finish(req, {"type": "abort", "message": message})
            n += 1
        self._compact()
        return n

    def pause(self, mode: str = "abort") -> int:
        """SGLang 0.5.23's three modes; either way new requests wait until `resume`.
        abort: end the requests it has, running or queued, with finish_reason abort (their
        tokens so far returned); requests submitted after the pause wait.
        in_place: keep them in the running batch with their KV cache, stop stepping (a cache
        flush then fails: `held`). retract: put them back at the head of the queue, their KV
        cache dropped; on `resume` each is prefilled again with its prompt and the tokens it
        has generated, under the weights then loaded, and goes on generating."""
        self.paused = True
        if mode == "abort":  # SGLang aborts every request the scheduler has: running and queued
            return self.abort(abort_all=True, message="Generation paused (pause_generation).")
        if mode == "retract":
            back = [r for r in self._running if r.finish_reason is None]
            for r in back:
                r.retractions += 1
            self._running, self._cache, self._mask, self._pos, self._last = [], None, None, None, None
            with self._cv:
                self._waiting.extendleft(reversed(back))
            self.stats.retracted += len(back)
            return 0
        self._hold_running = True
        return 0

    @property
    def held(self) -> int:
        """Requests kept in the running batch (pause in_place): their KV cache is in use."""
        return len(self._running)

    def resume(self) -> None:
        self.paused = False
        self._hold_running = False

    # -- worker loop ----------------------------------------------------------------------
    def _loop(self) -> None:
        import torch

        with torch.inference_mode():
            while True:
                with self._cv:
                    while not self._stop and not self._has_work():
                        self._cv.wait(0.5)
                    if self._stop:
                        break
                    ops = list(self._ops)
                    self._ops.clear()
                for fn, fut in ops:
                    if fut.set_running_or_notify_cancel():
                        try:
                            fut.set_result(fn())
                        except BaseException as e:  # handed to the caller
                            fut.set_exception(e)
                try:
                    self._drop_cancelled()
                    admit = self._admit()
                    if admit:
                        self._prefill(admit)
                    if self._running and not self._hold_running:
                        self._decode()
                except Exception as e:
                    log.exception("generation_step_failed", error=str(e))
                    for req in list(self._running):
                        self._finish(req, {"type": "abort", "message": f"server error: {e}"})
                    self._compact()
        for req in list(self._running) + list(self._waiting):
            self._finish(req, {"type": "abort", "message": "server shutting down"})

    def _has_work(self) -> bool:
        return bool(self._ops) or (bool(self._waiting) and not self.paused) or (
            bool(self._running) and not self._hold_running) or any(r.cancelled for r in self._waiting)

    def _drop_cancelled(self) -> None:
        gone = [r for r in self._running if r.cancelled]
        with self._cv:
            gone += [r for r in self._waiting if r.cancelled]
            for r in gone:
                if r in self._waiting:
                    self._waiting.remove(r)
        for r in gone:
            self._finish(r, {"type": "abort", "message": "client disconnected"})
        if gone:
            self._compact()

    def _admit(self) -> list[GenRequest]:
        if self.paused:
            return []
        admit: list[GenRequest] = []
        with self._cv:
            room = self.max_batch_size - len(self._running)
            longest = 0
            while self._waiting and len(admit) < room:
                nxt = self._waiting[0]
                longest2 = max(longest, len(nxt.input_ids))
                if admit and longest2 * (len(admit) + 1) > self.max_prefill_tokens:
                    break
                admit.append(self._waiting.popleft())
                longest = longest2
        ready = []
        for req in admit:
            if req.max_new_tokens == 0 and not req.output_ids:
                self._finish(req, {"type": "length", "length": 0})
            else:
                ready.append(req)
        return ready

    def _new_cache(self, kv: list[tuple[Any, Any]] | None = None) -> Any:
        from transformers import DynamicCache

        cache = DynamicCache(config=self.config)
        n = len(cache.layers)
        cache.layers = [_growing_layer(*(kv[i] if kv is not None else (None, None))) for i in range(n)]
        return cache

    def _forward(self, input_ids, attention_mask, position_ids, cache):
        """One forward; `cache` is extended in place."""
        d = self.device
        out = self.model(input_ids=input_ids.to(d), attention_mask=attention_mask.to(d),
                         position_ids=position_ids.to(d), past_key_values=cache, use_cache=True,
                         logits_to_keep=1)
        return out.logits[:, -1, :].float().cpu()

    @staticmethod
    def _kv_of(cache: Any) -> list[tuple[Any, Any]]:
        return [(layer.keys, layer.values) for layer in cache.layers]

    def _prefill(self, reqs: list[GenRequest]) -> None:
        import torch

        # a retracted request is prefilled with the tokens it generated before it was put back
        seqs = [r.input_ids + r.output_ids for r in reqs]
        lens = [len(q) for q in seqs]
        t = max(lens)
        ids = torch.zeros((len(reqs), t), dtype=torch.long)
        mask = torch.zeros((len(reqs), t), dtype=torch.long)
        for i, q in enumerate(seqs):
            ids[i, t - lens[i]:] = torch.tensor(q, dtype=torch.long)
            mask[i, t - lens[i]:] = 1
        pos = (mask.cumsum(dim=1) - 1).clamp(min=0)
        cache = self._new_cache()
        logits = self._forward(ids, mask, pos, cache)
        self.stats.prefill_batches += 1
        self.stats.max_prefill_batch = max(self.stats.max_prefill_batch, len(reqs))
        new_pos = torch.tensor(lens, dtype=torch.long)
        self._merge(reqs, cache, mask, new_pos)
        self._sample_and_check(logits, rows=list(range(len(self._running) - len(reqs), len(self._running))))

    def _merge(self, reqs, cache, mask, pos) -> None:
        """Append freshly prefilled rows to the running batch (left-pad the shorter side)."""
        import torch
        import torch.nn.functional as F

        if self._cache is None or not self._running:
            self._cache, self._mask, self._pos = cache, mask, pos
            self._last = torch.zeros(len(reqs), dtype=torch.long)
            self._running = list(reqs)
            return
        t_old, t_new = self._mask.shape[1], mask.shape[1]
        t = max(t_old, t_new)

        def lpad(x, n, dim):  # left-pad dim (2 for kv [B,H,T,D], 1 for mask [B,T])
            if n == 0:
                return x
            pad = [0, 0] * (x.dim() - dim - 1) + [n, 0]
            return F.pad(x, pad)

        self._cache = self._new_cache([
            (torch.cat([lpad(k0, t - t_old, 2), lpad(k1, t - t_new, 2)]),
             torch.cat([lpad(v0, t - t_old, 2), lpad(v1, t - t_new, 2)]))
            for (k0, v0), (k1, v1) in zip(self._kv_of(self._cache), self._kv_of(cache), strict=True)
        ])
        self._mask = torch.cat([lpad(self._mask, t - t_old, 1), lpad(mask, t - t_new, 1)])
        self._pos = torch.cat([self._pos, pos])
        self._last = torch.cat([self._last, torch.zeros(len(reqs), dtype=torch.long)])
        self._running.extend(reqs)

    def _decode(self) -> None:
        import torch

        b = len(self._running)
        ids = self._last.view(b, 1)
        mask = torch.cat([self._mask, torch.ones((b, 1), dtype=self._mask.dtype)], dim=1)
        logits = self._forward(ids, mask, self._pos.view(b, 1), self._cache)
        self._mask = mask
        self._pos = self._pos + 1
        self.stats.decode_steps += 1
        self.stats.max_decode_batch = max(self.stats.max_decode_batch, b)
        if b > 1:
            self.stats.batched_decode_steps += 1
        self._sample_and_check(logits, rows=list(range(b)))

    def _sample_and_check(self, logits, rows: list[int]) -> None:
        reqs = [self._running[i] for i in rows]
        import torch

        positions = [len(r.input_ids) + len(r.output_ids) for r in reqs]  # of the token sampled now
        ids, lps = sample(logits, [r.params for r in reqs], self.generator, positions)
        self._last[torch.tensor(rows, dtype=torch.long)] = ids
        done = []
        for i_tok, lp, r in zip(ids.tolist(), lps.tolist(), reqs, strict=True):
            tok = int(i_tok)
            r.output_ids.append(tok)
            r.output_logprobs.append(float(lp))
            self.stats.tokens_generated += 1
            reason = self._finish_reason(r, tok)
            if reason is not None:
                done.append((r, reason))
        for r, reason in done:
            self._finish(r, reason)
        if done:
            self._compact()

    def _finish_reason(self, r: GenRequest, tok: int) -> dict[str, Any] | None:
        n = len(r.output_ids)
        p = r.params
        if n >= p.min_new_tokens:
            if not p.ignore_eos and tok in self.eos_ids:
                return {"type": "stop", "matched": tok}
            if p.stop_token_ids and tok in p.stop_token_ids:
                return {"type": "stop", "matched": tok}
            stops = p.stop_strings
            if stops:
                longest = max(len(s) for s in stops)
                tail = self.tokenizer.decode(r.output_ids[-(4 * longest + 4):], skip_special_tokens=False)
                for s in stops:
                    if s in tail:
                        r.stop_trim = s
                        return {"type": "stop", "matched": s}
        if n >= r.max_new_tokens:
            return {"type": "length", "length": n}
        if len(r.input_ids) + n >= self.context_len:
            return {"type": "length", "length": n}
        return None

    def _finish(self, r: GenRequest, reason: dict[str, Any]) -> None:
        if r.finish_reason is not None:
            return
        r.finish_reason = reason
        r.weight_version = self.weight_version  # as SGLang: the version when the answer is made
        r.weight_versions = spans(r.version_events, self.weight_version, len(r.output_ids))
        self.stats.requests_finished += 1
        if r.on_done is not None:
            try:
                r.on_done(r)
            except Exception as e:
                log.warning("on_done_failed", rid=r.rid, error=str(e))

    def _compact(self) -> None:
        """Remove finished rows from the running batch and trim all-padding cache columns."""
        import torch

        keep = [i for i, r in enumerate(self._running) if r.finish_reason is None]
        if len(keep) == len(self._running):
            return
        if not keep:
            self._running, self._cache, self._mask, self._pos, self._last = [], None, None, None, None
            return
        idx = torch.tensor(keep, dtype=torch.long)
        mask = self._mask.index_select(0, idx)
        cols = mask.any(dim=0).nonzero()
        start = int(cols[0]) if len(cols) else 0
        self._mask = mask[:, start:]
        kidx = idx.to(self.device)
        self._cache = self._new_cache([(k.index_select(0, kidx)[:, :, start:], v.index_select(0, kidx)[:, :, start:])
                                       for k, v in self._kv_of(self._cache)])
        self._pos = self._pos.index_select(0, idx)
        self._last = self._last.index_select(0, idx)
        self._running = [self._running[i] for i in keep]

    # -- text ---------------------------------------------------------------------------
    def output_text(self, r: GenRequest) -> str:
        text = cast(str, self.tokenizer.decode(r.output_ids, skip_special_tokens=r.params.skip_special_tokens))
        if r.stop_trim and not r.params.no_stop_trim:
            cut = text.find(r.stop_trim)
            if cut >= 0:
                text = text[:cut]
        return text


@functools.cache
def _growing_layer_class() -> type:
    from transformers.cache_utils import DynamicLayer

    class GrowingLayer(DynamicLayer):
        """A KV cache layer that appends in place into a buffer with spare room (grown by half
        again when full) instead of copying the whole cache for every token (DynamicLayer's cat)."""

        def _alloc(self, k: Any, v: Any, room: int) -> None:
            b, h, t, d = k.shape
            self._k, self._v = k.new_empty((b, h, t + room, d)), v.new_empty((b, h, t + room, d))
            self._k[:, :, :t].copy_(k)
            self._v[:, :, :t].copy_(v)
            self._len = t
            self.dtype, self.device, self.is_initialized = k.dtype, k.device, True
            self.keys, self.values = self._k[:, :, :t], self._v[:, :, :t]

        def update(self, key_states: Any, value_states: Any, *args: Any, **kwargs: Any) -> tuple[Any, Any]:
            s = key_states.shape[2]
            if not self.is_initialized:
                self._alloc(key_states, value_states, max(64, s // 2))
                return self.keys, self.values
            if self._len + s > self._k.shape[2]:
                self._alloc(self.keys, self.values, max(64, (self._len + s) // 2) + s)
            self._k[:, :, self._len:self._len + s].copy_(key_states)
            self._v[:, :, self._len:self._len + s].copy_(value_states)
            self._len += s
            self.keys, self.values = self._k[:, :, :self._len], self._v[:, :, :self._len]
            return self.keys, self.values

    return GrowingLayer


def _growing_layer(keys: Any = None, values: Any = None) -> Any:
    layer = _growing_layer_class()()
    if keys is not None:
        layer._alloc(keys, values, max(64, keys.shape[2] // 2))
    return layer
