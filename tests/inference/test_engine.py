"""The generation worker in-process (no HTTP): EOS handling, min_new_tokens, pause modes."""

from __future__ import annotations

import threading

import pytest
import torch

from inference.engine import Engine, GenRequest
from inference.sampling import SamplingParams

PROMPT = [1, 846, 1045, 97, 300]


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    torch.set_num_threads(1)
    e = Engine(tiny_model_dir, weight_version="0")
    e.start()
    yield e
    e.stop()


def run(engine: Engine, reqs: list[GenRequest], timeout: float = 60) -> list[GenRequest]:
    done = threading.Event()
    left = [len(reqs)]
    lock = threading.Lock()

    def cb(_r):
        with lock:
            left[0] -= 1
            if left[0] == 0:
                done.set()

    for r in reqs:
        r.on_done = cb
        engine.submit(r)
    assert done.wait(timeout), "requests did not finish"
    return reqs


def test_eos_ends_generation_unless_ignored(engine):
    (g,) = run(engine, [GenRequest(PROMPT, SamplingParams(max_new_tokens=6, temperature=0, ignore_eos=True))])
    fake_eos = g.output_ids[2]
    first = g.output_ids.index(fake_eos)
    saved = set(engine.eos_ids)
    engine.eos_ids = saved | {fake_eos}
    try:
        a, b, c = run(engine, [
            GenRequest(PROMPT, SamplingParams(max_new_tokens=6, temperature=0)),
            GenRequest(PROMPT, SamplingParams(max_new_tokens=6, temperature=0, ignore_eos=True)),
            GenRequest(PROMPT, SamplingParams(max_new_tokens=6, temperature=0, min_new_tokens=first + 2)),
        ])
    finally:
        engine.eos_ids = saved
    assert a.finish_reason == {"type": "stop", "matched": fake_eos} and a.output_ids == g.output_ids[:first + 1]
    assert b.finish_reason == {"type": "length", "length": 6} and b.output_ids == g.output_ids
    assert len(c.output_ids) >= first + 2


def test_pause_in_place_keeps_requests_and_abort_mode_ends_them(engine):
    long = GenRequest(PROMPT, SamplingParams(max_new_tokens=100_000, temperature=1.0, ignore_eos=True))
    finished = threading.Event()
    long.on_done = lambda _r: finished.set()
    engine.submit(long)
    while len(long.output_ids) < 3:
        threading.Event().wait(0.01)
    engine.call(lambda: engine.pause("in_place")).result(10)
    n = len(long.output_ids)
    threading.Event().wait(0.3)
    assert len(long.output_ids) == n and long.finish_reason is None  # held, not stepped
    engine.call(engine.resume).result(10)
    while len(long.output_ids) < n + 3:
        threading.Event().wait(0.01)
    aborted = engine.call(lambda: engine.pause("abort")).result(10)
    assert aborted == 1 and finished.wait(10)
    assert long.finish_reason["type"] == "abort"
    engine.call(engine.resume).result(10)


def test_max_new_tokens_zero_and_abort_by_rid(engine):
    (z,) = run(engine, [GenRequest(PROMPT, SamplingParams(max_new_tokens=0))])
    assert z.finish_reason == {"type": "length", "length": 0} and z.output_ids == []
    r = GenRequest(PROMPT, SamplingParams(max_new_tokens=100_000, ignore_eos=True), rid="kill-me")
    ev = threading.Event()
    r.on_done = lambda _r: ev.set()
    engine.submit(r)
    while not r.output_ids:
        threading.Event().wait(0.01)
    assert engine.call(lambda: engine.abort("kill-me")).result(10) == 1
    assert ev.wait(10) and r.finish_reason["type"] == "abort"


def test_a_sampling_seed_repeats_its_completion_whatever_runs_beside_it(engine):
    def params(seed=None):
        return SamplingParams(max_new_tokens=12, temperature=1.0, ignore_eos=True, sampling_seed=seed)

    (alone,) = run(engine, [GenRequest(PROMPT, params(42))])
    beside = run(engine, [GenRequest(PROMPT[:3], params()), GenRequest(PROMPT, params(42)),
                          GenRequest([*PROMPT, 5, 6], params(7))])
    assert beside[1].output_ids == alone.output_ids
    others = run(engine, [GenRequest(PROMPT, params(s)) for s in range(43, 49)])
    assert any(o.output_ids != alone.output_ids for o in others)  # another seed, another draw


def test_a_retracted_request_goes_on_where_it_stopped(engine):
    """pause(retract) drops the running batch's KV cache and queues its requests again; on resume
    each is prefilled with its prompt and its tokens so far: with the same weights the greedy
    completion is the one it would have been without the pause."""
    params = SamplingParams(max_new_tokens=40, temperature=0, ignore_eos=True)
    (whole,) = run(engine, [GenRequest(PROMPT, params)])
    r = GenRequest(PROMPT, params)
    ev = threading.Event()
    r.on_done = lambda _r: ev.set()
    engine.submit(r)
    while len(r.output_ids) < 5:
        threading.Event().wait(0.005)
    before = engine.stats.retracted
    engine.call(lambda: engine.pause("retract")).result(10)
    n = len(r.output_ids)
    assert engine.num_running == 0 and engine.held == 0 and engine.num_waiting == 1
    threading.Event().wait(0.2)
    assert len(r.output_ids) == n < 40 and r.finish_reason is None  # queued, not stepped
    engine.call(engine.resume).result(10)
    assert ev.wait(30)
    assert engine.stats.retracted == before + 1
    assert r.output_ids == whole.output_ids and r.finish_reason == {"type": "length", "length": 40}
    assert r.output_logprobs == pytest.approx(whole.output_logprobs, abs=1e-4)


def test_pause_abort_ends_queued_requests_too_and_later_ones_wait(engine):
    """As SGLang 0.5.23: pause_generation(abort) aborts every request the scheduler holds,
    queued ones included; a request submitted after the pause waits for resume."""
    params = SamplingParams(max_new_tokens=100_000, temperature=1.0, ignore_eos=True)
    running = GenRequest(PROMPT, params)
    ev = threading.Event()
    running.on_done = lambda _r: ev.set()
    engine.submit(running)
    while not running.output_ids:
        threading.Event().wait(0.01)
    engine.call(lambda: engine.pause("in_place")).result(10)  # hold it, then queue one behind
    queued = GenRequest(PROMPT, SamplingParams(max_new_tokens=4, temperature=0))
    q_done = threading.Event()
    queued.on_done = lambda _r: q_done.set()
    engine.submit(queued)
    assert engine.call(lambda: engine.pause("abort")).result(10) == 2
    assert ev.wait(10) and q_done.wait(10)
    assert running.finish_reason["type"] == "abort" and queued.finish_reason["type"] == "abort"
    later = GenRequest(PROMPT, SamplingParams(max_new_tokens=4, temperature=0))
    l_done = threading.Event()
    later.on_done = lambda _r: l_done.set()
    engine.submit(later)
    assert not l_done.wait(0.3)
    engine.call(engine.resume).result(10)
    assert l_done.wait(30) and later.finish_reason["type"] == "length"
