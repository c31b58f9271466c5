import struct

import msgpack
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.wire import MAGIC, SCHEMA_VERSION, Sample, WireError, decode, encode


def make_sample(n: int = 8, **kw) -> Sample:
    base = dict(
        tokens=np.arange(n), loss_mask=[0] * (n // 2) + [1] * (n - n // 2),
        rollout_logprobs=np.linspace(-1, 0, n), prompt_len=n // 2, reward=1.0, group_id="g",
        sample_index=0, instance_id="i", policy_version=3, sample_id="s-1",
    )
    base.update(kw)
    return Sample(**base)


@settings(max_examples=60, deadline=None)
@given(
    toks=st.lists(st.integers(0, 2**31 - 1), min_size=1, max_size=300),  # token ids are never negative
    reward=st.floats(allow_nan=False, allow_infinity=False, width=32),
    versions=st.lists(st.text(max_size=5), max_size=4),
    metrics=st.dictionaries(st.text(max_size=10), st.floats(allow_nan=False, allow_infinity=False, width=32), max_size=4),
    status=st.sampled_from(["completed", "truncated", "aborted", "failed"]),
    masked=st.booleans(),
)
def test_round_trip(toks, reward, versions, metrics, status, masked):
    n = len(toks)
    rng = np.random.default_rng(n)
    s = Sample(tokens=toks, loss_mask=rng.integers(0, 2, n), rollout_logprobs=rng.normal(size=n),
               prompt_len=n // 3, reward=reward, group_id="grp", sample_index=2, instance_id="x__y-1",
               policy_version=7, weight_versions=versions, status=status, step_index=1, steps_total=3,
               masked=masked, mask_reason="why" if masked else "", metrics=metrics, sample_id="id:1",
               episode_id="ep")
    d = decode(encode(s))
    assert np.array_equal(d.tokens, s.tokens) and d.tokens.dtype == np.int32
    assert np.array_equal(d.loss_mask, s.loss_mask)
    assert np.array_equal(d.rollout_logprobs, s.rollout_logprobs.astype(np.float32))
    for f in ("prompt_len", "group_id", "sample_index", "instance_id", "policy_version", "weight_versions",
              "status", "step_index", "steps_total", "masked", "mask_reason", "sample_id", "episode_id"):
        assert getattr(d, f) == getattr(s, f), f
    assert d.reward == pytest.approx(s.reward)
    assert d.metrics == pytest.approx(s.metrics)


def split(frame: bytes) -> tuple[dict, bytes]:
    hlen = struct.unpack_from("<I", frame, 4)[0]
    return msgpack.unpackb(frame[8 : 8 + hlen], raw=False), frame[8 + hlen :]


def join(header: dict, arrays: bytes) -> bytes:
    h = msgpack.packb(header, use_bin_type=True)
    return MAGIC + struct.pack("<I", len(h)) + h + arrays


def test_arrays_are_raw_little_endian_bytes_after_a_msgpack_header():
    frame = encode(make_sample(4))
    assert frame[:4] == MAGIC
    m, arrays = split(frame)
    assert m["v"] == SCHEMA_VERSION and m["n"] == 4
    assert arrays[:16] == np.arange(4, dtype="<i4").tobytes()
    assert arrays[16:20] == bytes([0, 0, 1, 1])
    assert arrays[20:] == np.linspace(-1, 0, 4).astype("<f4").tobytes()


def test_decode_is_zero_copy():
    frame = encode(make_sample(64))
    d = decode(frame)
    assert d.tokens.base is not None and not d.tokens.flags.writeable


@pytest.mark.parametrize(
    "mutate, field",
    [
        (lambda m: m.pop("reward"), "reward"),
        (lambda m: m.update(n=5), "tokens"),
        (lambda m: m.update(v=99), "v"),
        (lambda m: m.update(status="weird"), "status"),
        (lambda m: m.update(prompt_len=-1), "prompt_len"),
        (lambda m: m.update(policy_version="3"), "policy_version"),
    ],
)
def test_decode_errors_name_the_field(mutate, field):
    m, arrays = split(encode(make_sample(4)))
    mutate(m)
    with pytest.raises(WireError, match=field):
        decode(join(m, arrays))


@pytest.mark.parametrize("frame, needle", [
    (b"\xc1not a frame", "magic"), (b"SW", "shorter"), (MAGIC + struct.pack("<I", 999) + b"x", "header length"),
    (MAGIC + struct.pack("<I", 1) + b"\xc1", "header"),
])
def test_decode_garbage(frame, needle):
    with pytest.raises(WireError, match=needle):
        decode(frame)


def test_constructor_validates():
    with pytest.raises(WireError, match="loss_mask"):
        make_sample(4, loss_mask=[1, 1])
    with pytest.raises(WireError, match="prompt_len"):
        make_sample(4, prompt_len=9)


def test_token_versions_round_trip_and_the_oldest_trained_token():
    # prompt (-1), a turn at 3 masked out (a format error), a trained turn at 4, one at 5
    s = make_sample(8, loss_mask=[0, 0, 0, 0, 1, 1, 1, 0], policy_version=4,
                    token_versions=[-1, -1, 3, 3, 4, 4, 5, -1])
    d = decode(encode(s))
    assert d.token_versions is not None and d.token_versions.tolist() == s.token_versions.tolist()
    assert d.oldest_version == 4  # the masked turn at 3 is not trained
    assert d.generated_tokens == 5
    # a policy_version older than every token still bounds it (never younger than either)
    assert decode(encode(make_sample(8, policy_version=2, token_versions=[5] * 8))).oldest_version == 2
    assert decode(encode(make_sample(8, token_versions=[1] * 8))).oldest_version == 1


def test_a_schema_1_sample_is_still_read_as_all_of_its_policy_version():
    m, arrays = split(encode(make_sample(4)))
    m["v"] = 1
    m.pop("tv")
    d = decode(join(m, arrays))
    assert d.token_versions is None and d.oldest_version == 3 and d.generated_tokens == 2
    with pytest.raises(WireError, match="schema version 3"):
        decode(join({**m, "v": 3}, arrays))


def test_bad_token_versions_are_refused_naming_the_field():
    with pytest.raises(WireError, match="token_versions: length 3"):
        make_sample(4, token_versions=[0, 0, 0])
    m, arrays = split(encode(make_sample(4, token_versions=[0] * 4)))
    with pytest.raises(WireError, match="token_versions: -7"):
        decode(join(m, arrays[:-16] + np.array([0, 0, -7, 0], "<i4").tobytes()))
    with pytest.raises(WireError, match="int32 token_versions"):
        decode(join(m, arrays[:-4]))
