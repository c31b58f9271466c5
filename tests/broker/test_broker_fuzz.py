"""Fuzzed stream entries: whatever bytes reach the replay stream, decoding raises WireError naming
what is wrong (never another exception), and the learner's reader dead-letters them and goes on."""

from __future__ import annotations

import math

import msgpack
import numpy as np
import pytest
from fuzz_http import FUZZ_EXAMPLES, settings
from hypothesis import given
from hypothesis import strategies as st

from broker.keys import Keys
from broker.replay import FIELD, ReplayReader, ReplayWriter
from broker.wire import MAGIC, Sample, WireError, decode, encode

pytestmark = pytest.mark.fuzz


def _sample(n: int = 6) -> Sample:
    return Sample(tokens=np.arange(n), loss_mask=[0, 0, 0, 1, 1, 1][:n], rollout_logprobs=np.full(n, -0.5),
                  prompt_len=3, reward=1.0, group_id="g", sample_index=0, instance_id="i",
                  policy_version=1, sample_id="s:0", metrics={"turns": 2.0})


VALID = encode(_sample())
HEAD = len(MAGIC) + 4
HEADER = msgpack.unpackb(VALID[HEAD:HEAD + int.from_bytes(VALID[len(MAGIC):HEAD], "little")])
JSONISH = st.recursive(st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats() | st.text(max_size=8) | st.binary(max_size=8),
                       lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
                       max_leaves=8)


def _check(data: bytes) -> None:
    try:
        s = decode(data)
    except WireError as e:
        assert str(e).split(":")[0], "a WireError names what is wrong"
        return
    # what decodes is usable by the learner: numbers where numbers are read
    assert all(isinstance(v, float) and math.isfinite(v) for v in s.metrics.values())
    assert math.isfinite(s.reward) and np.isfinite(s.rollout_logprobs).all()
    assert all(isinstance(v, str) for v in s.weight_versions) and (s.tokens >= 0).all()


@settings(FUZZ_EXAMPLES * 10)
@given(st.binary(max_size=300))
def test_random_bytes(data: bytes) -> None:
    _check(data)
    _check(MAGIC + data)


@settings(FUZZ_EXAMPLES * 10)
@given(pos=st.integers(0, len(VALID) - 1), byte=st.integers(0, 255), cut=st.integers(0, len(VALID)))
def test_mutated_frames(pos: int, byte: int, cut: int) -> None:
    data = bytearray(VALID)
    data[pos] = byte
    _check(bytes(data))
    _check(bytes(data[:cut]))


@settings(FUZZ_EXAMPLES * 10)
@given(field=st.sampled_from(sorted(HEADER)), value=JSONISH)
def test_header_fields_of_any_type(field: str, value: object) -> None:
    header = msgpack.packb({**HEADER, field: value}, use_bin_type=True)
    body = VALID[HEAD + int.from_bytes(VALID[len(MAGIC):HEAD], "little"):]
    _check(MAGIC + len(header).to_bytes(4, "little") + header + body)


async def test_the_reader_dead_letters_junk_and_goes_on(aredis, redis_url: str) -> None:
    keys = Keys("swarl", "fuzz")
    reader = ReplayReader(aredis, keys, "learner", "learner-0")
    await reader.ensure_group()
    writer = ReplayWriter(aredis, keys)
    bad = [b"", b"junk", MAGIC + b"\xff" * 8, VALID[:-3], encode(_sample()).replace(b"turns", b"tvrns")]
    for data in bad[:4]:
        await aredis.xadd(keys.replay, {FIELD: data})
    await aredis.xadd(keys.replay, {b"other": b"x"})
    await writer.add([_sample()])
    got = await reader.read(count=100, block_ms=100)
    assert [e.sample.sample_id for e in got] == ["s:0"]
    dead = await aredis.xrange(keys.replay_dead)
    assert len(dead) == 5 and all(f[b"error"] for _, f in dead)
    assert int(await aredis.hget(keys.stats, "samples_dead_lettered")) == 5
    pending = await aredis.xpending(keys.replay, "learner")
    assert pending["pending"] == 1  # only the good one waits for its ack
