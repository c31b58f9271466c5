"""The GPU recipes load with the real config loader, carry the published run's settings, and use
the GPU counts of the published runs (their memory is checked in test_ops_plan)."""

from __future__ import annotations

from pathlib import Path

import pytest

from swarl.config import load_config

GPU = Path(__file__).resolve().parents[2] / "configs" / "gpu"
RECIPES = {"qwen3-8b.yaml": "Qwen3-8B", "qwen3-32b.yaml": "Qwen3-32B", "qwen3-8b-prm.yaml": "Qwen3-8B"}
GPUS = {"qwen3-8b.yaml": 16, "qwen3-32b.yaml": 64, "qwen3-8b-prm.yaml": 40}
OUTCOME_ONLY = ["qwen3-32b.yaml", "qwen3-8b.yaml"]  # the published outcome-reward runs


def test_the_recipes_exist():
    assert sorted(p.name for p in GPU.glob("*.yaml")) == sorted(RECIPES)


@pytest.mark.parametrize("name", OUTCOME_ONLY)
def test_recipe_loads_with_seed_settings(name):
    cfg = load_config(GPU / name, environ={})
    assert cfg.actor.max_context_len == 16384
    assert cfg.actor.sampling.max_new_tokens == 4096
    assert cfg.actor.dynamic_history and cfg.actor.context_management
    assert cfg.learner.n_samples_per_prompt == 8
    assert cfg.learner.lr == pytest.approx(1e-6)
    assert cfg.learner.backend == "megatron" and cfg.learner.dtype == "bf16"
    assert cfg.learner.tensor_parallel >= 2 and cfg.learner.pipeline_parallel >= 1
    assert cfg.pool.max_concurrent == 128 and cfg.pool.max_per_node == 15
    assert cfg.weight_sync.transport == "distributed" and cfg.weight_sync.backend == "nccl"
    assert cfg.learner.rollout_temperature == cfg.actor.sampling.temperature
    assert RECIPES[name] in (cfg.learner.model_dir or "")
    assert cfg.inference.model == cfg.learner.model_dir == cfg.actor.tokenizer
    # the prompt budget leaves room for the answer
    assert cfg.actor.max_context_len - cfg.actor.sampling.max_new_tokens == 12288


def test_prm_recipe_has_the_seeds_prm_settings():
    """run_swe_rl_8b_prm_5nodes_remote.sh: 5 nodes, one of them the judge's; its PRM_ARGS."""
    cfg = load_config(GPU / "qwen3-8b-prm.yaml", environ={})
    p = cfg.actor.prm
    assert p.enable and p.m == 3 and p.step_coef == 1.0 and p.temperature == 1.0 and p.max_tokens == 4096
    assert p.reward_mode == "step" and cfg.actor.dynamic_history  # --advantage-estimator step_wise
    assert cfg.actor.max_context_len == 32768 and cfg.actor.sampling.max_new_tokens == 4096
    assert cfg.learner.n_samples_per_prompt == 4 and cfg.learner.lr == pytest.approx(1e-6)
    assert cfg.learner.tensor_parallel == 4
    cl = cfg.cluster
    assert cl.prm_servers * cl.prm_tp_size == cl.gpus_per_node  # a node of its own
    assert "Qwen3-4B" in (cl.prm_model or "")
    text = (GPU / "qwen3-8b-prm.yaml").read_text()
    assert f"--role prm --tp-size {cl.prm_tp_size} \\\n#     --mem-fraction {cl.prm_mem_fraction:g}" in text


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_recipe_gpus_and_launch_comments_agree(name):
    cfg = load_config(GPU / name, environ={})
    cl, lc = cfg.cluster, cfg.learner
    learner_gpus = cl.learner_nodes * cl.gpus_per_node
    prm_gpus = cl.prm_servers * cl.prm_tp_size
    assert learner_gpus + cl.inference_servers * cl.inference_tp_size + prm_gpus == GPUS[name]
    assert learner_gpus % (lc.tensor_parallel * lc.pipeline_parallel) == 0
    assert learner_gpus // (lc.tensor_parallel * lc.pipeline_parallel) > 1  # data parallel
    assert lc.use_distributed_optimizer and lc.recompute == "full"
    text = (GPU / name).read_text()
    assert f"--tp-size {cl.inference_tp_size} --mem-fraction {cl.inference_mem_fraction:g}" in text
    assert f"--nproc-per-node {cl.gpus_per_node}" in text
    assert f"swarl doctor --config configs/gpu/{name}" in text  # check a node before it runs
    if cl.learner_nodes > 1:
        assert f"torchrun --nnodes {cl.learner_nodes}" in text


def test_recipe_env_overrides_still_apply():
    cfg = load_config(GPU / "qwen3-8b.yaml",
                      environ={"SWARL_REDIS_URL": "redis://10.0.0.5:6379/0",
                               "SWARL_POOL__EXEC_URLS": "[http://10.0.0.10:5000, http://10.0.0.11:5000]"})
    assert cfg.redis.url == "redis://10.0.0.5:6379/0"
    assert cfg.pool.exec_urls == ["http://10.0.0.10:5000", "http://10.0.0.11:5000"]


# -- the GPU image (deploy/Dockerfile) ---------------------------------------------------------

ROOT = GPU.parents[1]


def dockerfile_args() -> dict[str, str]:
    """Every `ARG NAME=value` of deploy/Dockerfile, and the image it starts FROM."""
    import re

    text = (ROOT / "deploy" / "Dockerfile").read_text()
    args = dict(re.findall(r"^ARG (\w+)=(\S+)$", text, re.M))
    froms = re.findall(r"^FROM (\S+)", text, re.M)
    assert len(froms) == 1, froms
    args["FROM"] = re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], froms[0])
    return args


def pyproject_pins() -> dict[str, list[str]]:
    """name -> the exact versions pyproject gives it, base dependencies and the gpu extra."""
    import tomllib

    from packaging.requirements import Requirement

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pins: dict[str, list[str]] = {}
    for line in [*project["dependencies"], *project["optional-dependencies"]["gpu"]]:
        r = Requirement(line)
        if r.name in ("sglang", "megatron-core"):
            (spec,) = r.specifier  # one exact pin each
            assert spec.operator == "==", f"{line}: the GPU path is pinned exactly"
            pins.setdefault(r.name, []).append(spec.version)
    return pins


def test_docker_image_pins_are_pyprojects():
    """The image carries the sglang and megatron-core releases pyproject pins (base and gpu extra),
    and a TransformerEngine inside the range megatron-core's own metadata gives."""
    from packaging.specifiers import SpecifierSet

    from learner.backends.megatron_env import TE_SUPPORTED

    args, pins = dockerfile_args(), pyproject_pins()
    assert set(pins["sglang"]) == {args["SGLANG_VERSION"]}
    assert args["FROM"] == f"lmsysorg/sglang:v{pins['sglang'][0]}-{args['SGLANG_CUDA']}"
    assert args["SGLANG_CUDA"] == "cu130"  # sglang 0.5.23 needs CUDA 13 (cuda-python>=13, flashinfer cu13)
    assert set(pins["megatron-core"]) == {args["MEGATRON_CORE_VERSION"]}
    assert args["TRANSFORMER_ENGINE_VERSION"] in SpecifierSet(TE_SUPPORTED)
    text = (ROOT / "deploy" / "Dockerfile").read_text()
    # the core library for the image's CUDA, the torch extension built against the image's torch
    cuda = "cu13" if args["SGLANG_CUDA"].startswith("cu13") else "cu12"
    assert (f"--no-build-isolation \"transformer_engine[core_{cuda},pytorch]=="
            "${TRANSFORMER_ENGINE_VERSION}\"") in text
    assert 'pip install -e ".[gpu]"' in text and "RUN swarl doctor" in text
    # docs/gpu.md names the same versions
    doc = (ROOT / "docs" / "gpu.md").read_text()
    for v in (args["FROM"], f"megatron-core=={args['MEGATRON_CORE_VERSION']}",
              f"transformer_engine[core_cu13,pytorch]=={args['TRANSFORMER_ENGINE_VERSION']}"):
        assert v in doc, v
