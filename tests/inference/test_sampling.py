"""The sampler and the logprob convention, in-process."""

from __future__ import annotations

import pytest
import torch
from pydantic import ValidationError

from inference.logprobs import RETURN_ORIGINAL_LOGPROB_ENV, logprob_temperature, token_logprobs
from inference.sampling import SamplingParams, sample

LOGITS = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))


def draw(n: int, **params) -> tuple[torch.Tensor, torch.Tensor]:
    p = SamplingParams(**params)
    return sample(LOGITS.repeat(n, 1), [p] * n, torch.Generator().manual_seed(0))


def test_sampling_follows_the_distribution_and_filters():
    ids, lps = draw(20_000, temperature=1.0)
    freq = torch.bincount(ids, minlength=4).float() / len(ids)
    assert torch.allclose(freq, LOGITS.exp(), atol=0.015), freq
    assert torch.allclose(lps, LOGITS[ids], atol=1e-6)
    assert set(draw(2000, top_k=2)[0].tolist()) == {0, 1}
    assert set(draw(2000, top_p=0.75)[0].tolist()) == {0, 1}  # 0.5 + 0.3 covers 0.75
    assert set(draw(2000, min_p=0.5)[0].tolist()) == {0, 1}   # p >= 0.5 * 0.5
    ids, lps = draw(10, temperature=0)
    assert ids.tolist() == [0] * 10 and torch.allclose(lps, LOGITS[0].repeat(10))


def test_seeded_rows_draw_from_seed_and_position_alone():
    n = 20_000
    seeded = [SamplingParams(sampling_seed=s) for s in range(n)]
    ids, _ = sample(LOGITS.repeat(n, 1), seeded, torch.Generator().manual_seed(0), [7] * n)
    freq = torch.bincount(ids, minlength=4).float() / n  # over seeds: still the distribution
    assert torch.allclose(freq, LOGITS.exp(), atol=0.015), freq
    # one (seed, position): the same token whatever the generator or the rows beside it
    p = SamplingParams(sampling_seed=11)
    alone = [int(sample(LOGITS.unsqueeze(0), [p], torch.Generator().manual_seed(g), [pos])[0])
             for g, pos in ((1, 3), (2, 3))]
    mixed = sample(LOGITS.repeat(3, 1), [SamplingParams(), p, SamplingParams(sampling_seed=5)],
                   torch.Generator().manual_seed(3), [9, 3, 3])[0]
    assert alone[0] == alone[1] == int(mixed[1])
    # positions and seeds each give their own stream
    over_pos = sample(LOGITS.repeat(200, 1), [p] * 200, torch.Generator(), list(range(200)))[0]
    assert len(set(over_pos.tolist())) == 4
    with pytest.raises(ValueError, match="positions"):
        sample(LOGITS.unsqueeze(0), [p], torch.Generator())


def test_logprobs_are_temperature_scaled_unless_original(monkeypatch):
    scaled = torch.log_softmax(LOGITS / 0.5, dim=-1)
    _, lps = draw(50, temperature=0.5)
    ids, _ = draw(50, temperature=0.5)
    assert torch.allclose(lps, scaled[ids], atol=1e-6)
    assert torch.allclose(token_logprobs(LOGITS.repeat(3, 1), torch.tensor([0, 1, 2]), 0.5), scaled[:3])
    assert logprob_temperature(0.0) == 1.0 and logprob_temperature(0.7) == 0.7
    monkeypatch.setenv(RETURN_ORIGINAL_LOGPROB_ENV, "1")
    assert logprob_temperature(0.7) == 1.0
    ids, lps = draw(50, temperature=0.5)
    assert torch.allclose(lps, LOGITS[ids], atol=1e-6)


@pytest.mark.parametrize(("params", "field"), [
    ({"temperature": -0.1}, "temperature"), ({"top_p": 1.5}, "top_p"), ({"top_k": -2}, "top_k"),
    ({"min_p": 2}, "min_p"), ({"max_new_tokens": -1}, "max_new_tokens"), ({"bogus": 1}, "bogus"),
    ({"repetition_penalty": 1.2}, "repetition_penalty"), ({"min_new_tokens": 5, "max_new_tokens": 2}, "min_new_tokens"),
])
def test_bad_params_name_their_field(params, field):
    with pytest.raises(ValidationError) as ei:
        SamplingParams(**params)
    assert field in str(ei.value)
