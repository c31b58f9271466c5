"""The slime plug-in (actors.slime_entry) against slime's real Sample contract, with the real
pool, envd, Docker and the scripted policy server.

slime is not installable here, so `Sample` below copies the dataclass fields of
    repository THUDM/slime, commit 624b824a898ab0ec1fcb4d373004c7f3852bf515,
    path slime/utils/types.py (class Sample, its Status enum, SpecInfo and PrefixCacheInfo)
field for field with their annotations; `slots=True` (ours, not slime's) turns setting a field
slime does not have into an AttributeError. What slime does with the result, read from the same
commit: slime/ray/rollout.py asserts len(loss_mask) == response_length and zeroes the loss mask
of a `remove_sample`; slime/utils/types.py requires rollout_log_probs to have response_length
entries; slime/rollout/sglang_rollout.py skips the reward model for ABORTED samples and for
samples whose reward generate() set, and with --group-rm calls the reward function once with the
group's list of samples (slime/rollout/rm_hub/__init__.py `batched_async_rm`).
"""

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from enum import Enum
from typing import Any
from urllib.parse import urlparse

import pytest
import torch
import yaml

from actors.slime_entry import generate, reward_func


@dataclass(slots=True)
class Sample:
    """slime.utils.types.Sample at 624b824a898ab0ec1fcb4d373004c7f3852bf515 (fields only)."""

    @dataclass
    class SpecInfo:
        spec_accept_token_num: int = 0
        spec_draft_token_num: int = 0
        spec_verify_ct: int = 0
        completion_token_num: int = 0

    @dataclass
    class PrefixCacheInfo:
        cached_tokens: int = 0
        total_prompt_tokens: int = 0

    class Status(Enum):
        PENDING = "pending"
        COMPLETED = "completed"
        TRUNCATED = "truncated"
        ABORTED = "aborted"
        FAILED = "failed"

    group_index: int | None = None
    index: int | None = None
    rollout_id: int | None = None
    prompt: str | list[dict[str, str]] = ""
    tokens: list[int] = field(default_factory=list)
    multimodal_inputs: dict[str, Any] | None = None
    multimodal_train_inputs: dict[str, Any] | None = None
    multimodal_train_input_id: str | None = None
    apply_chat_template_kwargs: dict = field(default_factory=dict)
    response: str = ""
    response_length: int = 0
    label: str | None = None
    reward: float | dict[str, Any] | None = None
    loss_mask: list[int] | None = None
    weight_versions: list[str] = field(default_factory=list)
    rollout_log_probs: list[float] | None = None
    rollout_top_p_token_ids: list[int] | torch.Tensor | None = None
    rollout_top_p_token_offsets: list[int] | torch.Tensor | None = None
    rollout_routed_experts: list[list[int]] | torch.Tensor | None = None
    remove_sample: bool = False
    teacher_log_probs: list[float] | None = None
    status: Status = Status.PENDING
    metadata: dict = field(default_factory=dict)
    generate_function_path: str | None = None
    custom_rm_path: str | None = None
    train_metadata: dict | None = None
    session_id: str | None = None
    non_generation_time: float = 0.0
    spec_info: SpecInfo = field(default_factory=SpecInfo)
    prefix_cache_info: PrefixCacheInfo = field(default_factory=PrefixCacheInfo)


def _conforms(value: Any, tp: Any) -> bool:
    """`value` fits the annotation `tp` (strictly: an int is not a float, a bool not an int)."""
    if tp is Any:
        return True
    if tp is None or tp is type(None):
        return value is None
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (types.UnionType, typing.Union):
        return any(_conforms(value, a) for a in args)
    if origin is list:
        return isinstance(value, list) and all(_conforms(v, args[0]) for v in value)
    if origin is dict:
        return isinstance(value, dict) and all(_conforms(k, args[0]) and _conforms(v, args[1])
                                               for k, v in value.items())
    if tp is float:
        return type(value) is float
    if tp is int:
        return type(value) is int
    return isinstance(value, tp)


def check_contract(s: Sample) -> None:
    """Every field holds what its annotation says, and the lengths slime asserts agree."""
    for f in dataclasses.fields(Sample):
        assert _conforms(getattr(s, f.name), f.type), (f.name, getattr(s, f.name))
    assert s.status in (Sample.Status.COMPLETED, Sample.Status.TRUNCATED, Sample.Status.ABORTED,
                        Sample.Status.FAILED)
    assert 1 <= s.response_length < len(s.tokens)          # a prompt, and a response to mask
    assert s.loss_mask is not None and s.rollout_log_probs is not None
    assert len(s.loss_mask) == len(s.rollout_log_probs) == s.response_length
    assert set(s.loss_mask) <= {0, 1} and isinstance(s.reward, float)
    if s.remove_sample:
        assert sum(s.loss_mask) == 0 and s.metadata["swarl"]["masked"]
    else:
        assert sum(s.loss_mask) > 0


def _args(server, pool, tiny_model_dir, **extra):
    u = urlparse(server.url)
    return types.SimpleNamespace(hf_checkpoint=str(tiny_model_dir), sglang_router_ip=u.hostname,
                                 sglang_router_port=u.port, swarl_pool_url=pool.url,
                                 swarl_envd_token=pool.token, swarl_api_key=server.api_key, **extra)


def _sample(row: dict, group: int, index: int) -> Sample:
    return Sample(group_index=group, index=index, prompt=row["problem_statement"],
                  metadata={"instance": row, "data_source": "swarl-test"})


@pytest.mark.docker
async def test_generate_fills_slimes_sample_for_resolved_failed_and_masked_episodes(
        scripted, pool_server, tiny_model_dir, test_image, tmp_path):
    server, (fix_row, wrong_row) = scripted
    args = _args(server, pool_server, tiny_model_dir)

    # resolved: the whole trajectory is one trained sample
    out = await generate(args, _sample(fix_row, 0, 0), {"temperature": 1.0, "max_new_tokens": 256})
    check_contract(out)
    assert out.status == Sample.Status.COMPLETED and out.reward == 1.0 and not out.remove_sample
    assert await reward_func(args, out) == 1.0
    assert out.response_length < len(out.tokens) and sum(out.loss_mask) > 0
    assert out.weight_versions == ["0", "0"] and out.metadata["swarl"]["resolved"]
    assert "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT" in out.response
    assert out.metadata["instance"] == fix_row and out.non_generation_time > 0

    wrong = await generate(args, _sample(wrong_row, 0, 1), {"max_new_tokens": 256})
    check_contract(wrong)
    assert wrong.reward == -1.0 and not wrong.remove_sample

    # masked: compact filtering cuts the episode at its step limit; it resolved, but is not
    # judged (its own +1 must not reach slime), and none of its tokens are trained
    cfg = tmp_path / "swarl.yaml"
    cfg.write_text(yaml.safe_dump({"actor": {"compact_filtering": True, "step_limit": 1}}))
    masked = await generate(_args(server, pool_server, tiny_model_dir, swarl_config=str(cfg)),
                            _sample(fix_row, 0, 2), {"max_new_tokens": 256})
    check_contract(masked)
    info = masked.metadata["swarl"]
    assert info["masked"] and info["mask_reason"] == "compact_filtering:step" and info["resolved"]
    assert masked.remove_sample and masked.status == Sample.Status.TRUNCATED
    assert masked.response_length > 1 and masked.reward == 0.0
    assert await reward_func(args, masked) == 0.0

    # an outage: no -1, the sample is dropped (ABORTED, removed, a one-token placeholder response)
    dead = _args(server, pool_server, tiny_model_dir)
    dead.swarl_pool_url = "http://127.0.0.1:9"
    bad = await generate(dead, Sample(group_index=0, index=3, metadata={"instance": fix_row}), {})
    check_contract(bad)
    assert bad.reward == 0.0 and bad.metadata["swarl"]["masked"]
    assert bad.metadata["swarl"]["mask_reason"] == "infra:allocate_failed"
    assert bad.status == Sample.Status.ABORTED and bad.remove_sample
    assert (bad.tokens, bad.response_length, bad.loss_mask, bad.rollout_log_probs) == ([0, 0], 1, [0], [0.0])

    # --group-rm: one reward per sample; removed ones get the kept samples' mean (+1 and -1 → 0),
    # so the group's mean is what the kept samples make it
    assert await reward_func(args, [out, wrong, masked, bad]) == [1.0, -1.0, 0.0, 0.0]
    assert await reward_func(args, [out, bad]) == [1.0, 1.0]
    assert await reward_func(args, [masked, bad]) == [0.0, 0.0]
    with pytest.raises(TypeError, match="nested"):
        await reward_func(args, [[out]])
    with pytest.raises(ValueError, match=r"metadata\.swarl\.reward"):
        await reward_func(args, Sample(metadata={}))


async def test_generate_names_bad_input(tiny_model_dir, monkeypatch):
    """A sample without a usable SWE row, or no pool to lease from: a ValueError naming it."""
    monkeypatch.delenv("SWARL_POOL_URL", raising=False)
    args = types.SimpleNamespace(hf_checkpoint=str(tiny_model_dir), sglang_router_ip="127.0.0.1",
                                 sglang_router_port=9, swarl_pool_url=None)
    with pytest.raises(ValueError, match=r"sample\.metadata\.instance"):
        await generate(args, Sample(metadata={}), {})
    row = {"instance_id": "a__b-1", "repo": "a/b", "problem_statement": "x",
           "FAIL_TO_PASS": ["t"], "PASS_TO_PASS": [], "eval_script": "true", "image_name": "i:1"}
    with pytest.raises(ValueError, match="swarl_pool_url"):
        await generate(args, Sample(metadata={"instance": row}), {})
    with pytest.raises(ValueError, match="FAIL_TO_PASS"):
        await generate(args, Sample(metadata={"instance": {**row, "FAIL_TO_PASS": 3}}), {})


async def test_an_infra_failure_is_tried_again_by_slime_then_given_up(tiny_model_dir, tmp_path):
    """slime's fully-async rollout (slime/rollout/fully_async_rollout.py at the commit above,
    AsyncRolloutWorker._make_done_cb) puts a group with an ABORTED sample back in its data buffer,
    and generate_and_rm runs its samples again, skipping COMPLETED/TRUNCATED ones. A task whose
    infrastructure always fails must not loop forever: ABORTED while tries are left, then FAILED
    (removed), which that loop ships instead of requeueing."""
    cfg = tmp_path / "swarl.yaml"
    cfg.write_text(yaml.safe_dump({"actor": {"slime_infra_tries": 3, "allocate_wait_s": 2}}))
    args = types.SimpleNamespace(hf_checkpoint=str(tiny_model_dir), sglang_router_ip="127.0.0.1",
                                 sglang_router_port=9, swarl_pool_url="http://127.0.0.1:9",
                                 swarl_config=str(cfg))
    row = {"instance_id": "a__b-1", "repo": "a/b", "problem_statement": "x", "FAIL_TO_PASS": ["t"],
           "PASS_TO_PASS": [], "eval_script": "true", "image_name": "i:1"}
    group = [Sample(group_index=0, index=0, metadata={"instance": row})]
    requeued = 0
    while True:  # the worker's loop: run what is not done, requeue while any sample is ABORTED
        for i, s in enumerate(group):
            if s.status not in (Sample.Status.COMPLETED, Sample.Status.TRUNCATED):
                group[i] = await generate(args, s, {"max_new_tokens": 8})
                check_contract(group[i])
        if not any(s.status == Sample.Status.ABORTED for s in group):
            break
        requeued += 1
        assert requeued < 10, "slime would requeue this group forever"
    assert requeued == 2
    for s in group:
        assert s.status == Sample.Status.FAILED and s.remove_sample and s.reward == 0.0
        assert s.metadata["swarl"]["infra_tries"] == 3
        assert s.metadata["swarl"]["mask_reason"].startswith("infra:")
    assert await reward_func(args, group) == [0.0]
