"""The latency profile: draws per episode key, reproducible, heavy-tailed as configured."""

from __future__ import annotations

import math
import statistics

import pytest
from pydantic import ValidationError

from inference.latency import ROW_FIELD, EpisodeDraw, LatencyLog, LatencyProfile, draw, episode_key


def test_episode_key_drops_the_turn() -> None:
    assert episode_key("run:inst:g0:s1:3") == "run:inst:g0:s1"
    assert episode_key("run:inst:g0:s1") == "run:inst:g0:s1"  # no turn: its own key
    assert episode_key(None) == episode_key("") == ""


def test_draws_are_per_episode_and_reproducible() -> None:
    p = LatencyProfile(seed=3)
    assert draw(p, "a") == draw(LatencyProfile(seed=3), "a")
    assert draw(p, "a") != draw(p, "b")
    assert draw(p, "a") != draw(LatencyProfile(seed=4), "a")
    log = LatencyLog(p)
    assert log.draw("a:0") == log.draw("a:5")  # every turn of an episode shares its draw


def test_durations_are_lognormal_with_the_configured_spread() -> None:
    p = LatencyProfile(turns_sigma=0.0, turns_median=1, token_s_median=0.1, token_s_sigma=0.75)
    xs = [draw(p, f"job-{i}").token_s for i in range(4000)]
    logs = [math.log(x) for x in xs]
    assert statistics.median(xs) == pytest.approx(0.1, rel=0.08)
    assert statistics.pstdev(logs) == pytest.approx(0.75, rel=0.08)
    q = statistics.quantiles(xs, n=20)
    assert 2.8 < q[-1] / statistics.median(xs) < 4.2  # p95 about 3.4x the median at sigma 0.75
    turns = {draw(LatencyProfile(turns_median=3, turns_sigma=0.5, max_turns=5), f"j{i}").turns
             for i in range(500)}
    assert min(turns) >= 1 and max(turns) == 5 and len(turns) >= 4


def test_the_log_records_what_was_slept() -> None:
    log = LatencyLog(LatencyProfile(token_s_median=0.01, token_s_sigma=0.0))
    d = log.delay_s("ep:0", 10) + log.delay_s("ep:1", 30)
    assert d == pytest.approx(0.4)
    assert log.episodes["ep"] == {"delay_s": pytest.approx(0.4), "answers": 2}


def test_a_bad_profile_names_the_field() -> None:
    with pytest.raises(ValidationError, match="token_s_sigma"):
        LatencyProfile(token_s_sigma=-1)
    with pytest.raises(ValidationError, match="surprise"):
        LatencyProfile.model_validate({"surprise": 1})


def test_a_row_fixes_its_own_draw_and_a_bad_one_names_the_field() -> None:
    log = LatencyLog(LatencyProfile(token_s_median=0.01, token_s_sigma=0.0, turns_sigma=0.0, turns_median=2))
    row = {"instance_id": "slow", ROW_FIELD: {"turns": 8, "token_s": 0.2}}
    assert log.draw("ep:0", row) == EpisodeDraw(8, 0.2)
    plain = log.draw("ep:0", {"instance_id": "plain"})
    assert plain == log.draw("ep:0") and plain.turns == 2 and plain.token_s == pytest.approx(0.01)
    assert log.delay_s("ep:0", 10, row) == pytest.approx(2.0)
    with pytest.raises(ValueError, match=f"(?s){ROW_FIELD}.*token_s"):
        log.draw("ep:0", {ROW_FIELD: {"turns": 8, "token_s": -1}})
    with pytest.raises(ValueError, match=f"(?s){ROW_FIELD}.*surprise"):
        log.draw("ep:0", {ROW_FIELD: {"turns": 8, "token_s": 0.1, "surprise": 1}})


def test_a_scripted_server_refuses_a_bad_row_draw_at_start(tiny_model_dir) -> None:
    from transformers import AutoTokenizer

    from inference.scripted import ScriptedPolicy

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    bad = {"instance_id": "slow-1", ROW_FIELD: {"turns": 0, "token_s": 0.2}}
    with pytest.raises(ValueError, match=f"(?s)task 'slow-1'.*{ROW_FIELD}.*turns"):
        ScriptedPolicy(tok, tasks=[bad], latency=LatencyProfile())
    ScriptedPolicy(tok, tasks=[{**bad, ROW_FIELD: {"turns": 1, "token_s": 0.2}}], latency=LatencyProfile())
