"""The megatron backend on two gloo ranks (torchrun, real processes) against one rank, on the
same fixed samples: data parallel 2 with and without the distributed optimizer (gradient
reduction overlapped with the backward, in several buckets, and not overlapped), tensor
parallel 2 and pipeline parallel 2. Three optimizer steps whose number of micro-batches differs from step to step and
between data-parallel ranks; per-token logprobs after every step and the final weights within
1e-4 of one rank's (fp32); the published weights equal the HF weights they came from and the
torch backend's; a checkpoint saved on two ranks (the model in safetensors shards of at most
SHARD_BYTES, with their index) and loaded on two new ones continues exactly.
Each layout runs once per session (tests/learner/megatron_worker.py); `make test` runs
dp2, dp2_distopt, tp2, pp2 and two resumes, `make long` the rest.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from learner.backends.megatron_backend import load_hf_state
from learner.backends.torch_backend import TorchBackend
from learner.config import LearnerConfig

# a torchrun launch per layout and per resume: well over a minute, more on a loaded machine
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

REPO = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).resolve().parent / "megatron_worker.py"
TOL = 1e-4
UPDATES = ["--set", "minibatches=2", "--set", "epochs=2"]
# one optimizer update a step (learner.minibatches defaults to 4): the micro-batch counts differ
# between ranks within the step, the premise of the reduce-once test
ONE = ["--set", "minibatches=1"]
# name -> worker arguments
LAYOUTS: dict[str, list[str]] = {
    "dp2": [*ONE, "--set", "use_distributed_optimizer=false", "--bucket-size", "10000"],
    "dp2_distopt": [*ONE, "--set", "use_distributed_optimizer=true", "--bucket-size", "10000"],
    "dp2_distopt_sync": [*ONE, "--set", "use_distributed_optimizer=true", "--set", "overlap_grad_reduce=false"],
    "tp2": [*ONE, "--set", "tensor_parallel=2"],
    "pp2": [*ONE, "--set", "pipeline_parallel=2"],
    # several optimizer updates a step (learner.minibatches, learner.epochs): each minibatch
    # sharded on its own, the proximal pass before the first update
    "dp2_mb": ["--set", "use_distributed_optimizer=true", "--bucket-size", "10000", *UPDATES],
    "tp2_mb": ["--set", "tensor_parallel=2", *UPDATES],
    "pp2_mb": ["--set", "pipeline_parallel=2", *UPDATES],
}
# `make test` runs a short set; `make long` every layout and every resume
LONG = {"dp2_distopt_sync", "tp2_mb", "pp2_mb"}
PARAMS = [pytest.param(k, marks=pytest.mark.long) if k in LONG else k for k in LAYOUTS]
RESUMED = [pytest.param("dp2", marks=pytest.mark.long), "dp2_distopt", "tp2",
           pytest.param("pp2", marks=pytest.mark.long)]
SHARD_BYTES = 100_000  # the tiny model (0.43 MB) is written in several shards


def run_worker(out: Path, model: Path, args: list[str], nproc: int) -> dict[str, Any]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, str(WORKER), "--model", str(model), "--out", str(out), *args]
    if nproc > 1:
        cmd[1:1] = ["-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}"]
    res = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, f"{' '.join(args)}: exit {res.returncode}\n{res.stderr[-3000:]}"
    return torch.load(out, weights_only=False)


@pytest.fixture(scope="module")
def odd_vocab_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Untied, vocabulary 500: under tensor parallelism Megatron pads it to 512."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(1)
    model = Qwen3ForCausalLM(Qwen3Config(
        vocab_size=500, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=2048,
        tie_word_embeddings=False))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if not name.endswith("norm.weight"):
                p.normal_(0.0, 0.08)
    out = tmp_path_factory.mktemp("odd-vocab")
    model.save_pretrained(out)
    return out


class Runs:
    """Each run launched on first use and kept for the module: one rank, a two-rank layout
    (saving a checkpoint after step 2), and its resumed run (new processes: load that
    checkpoint, take step 3). Lazy, so a layout whose tests are deselected costs nothing."""

    def __init__(self, d: Path, model: Path, probe_model: Path) -> None:
        self.d, self.model, self.probe = d, model, ["--probe-model", str(probe_model)]
        self.done: dict[str, dict[str, Any]] = {}

    def __getitem__(self, name: str) -> dict[str, Any]:
        if name not in self.done:
            if name == "one":
                self.done[name] = run_worker(self.d / "one.pt", self.model, [*ONE, *self.probe], 1)
            elif name == "one_mb":
                self.done[name] = run_worker(self.d / "one_mb.pt", self.model, UPDATES, 1)
            elif name.endswith("_resumed"):
                layout = name.removesuffix("_resumed")
                ck = self[layout]["ckpt"]
                self.done[name] = run_worker(self.d / f"{layout}-resumed.pt", self.model,
                                             [*LAYOUTS[layout], "--resume", str(ck), "--first-step", "3"], 2)
            else:
                ck = self.d / f"ck-{name}"
                self.done[name] = run_worker(self.d / f"{name}.pt", self.model,
                                             [*LAYOUTS[name], *self.probe, "--save-at", "2", "--ckpt", str(ck),
                                              "--shard-bytes", str(SHARD_BYTES)], 2)
                self.done[name]["ckpt"] = ck
        return self.done[name]


@pytest.fixture(scope="module")
def runs(small_model_dir: Path, odd_vocab_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Runs:
    return Runs(tmp_path_factory.mktemp("megatron-ranks"), small_model_dir, odd_vocab_model)


def max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k].float() - b[k].float()).abs().max()) for k in a)


@pytest.mark.parametrize("layout", PARAMS)
def test_two_ranks_train_as_one(runs: Runs, layout: str) -> None:
    several = layout.endswith("_mb")
    one, two = runs["one_mb" if several else "one"], runs[layout]
    counts = two["mb_counts"]
    if several:  # four updates a step, every rank in each: the same model as one rank's
        assert two["dp_size"] == (2 if layout.startswith("dp") else 1)
        assert all(st["updates"] == 4 for st in two["stats"].values())
        assert all(st["clip_frac"] > 0 for st in one["stats"].values())  # the clip acted
    elif layout.startswith("dp"):
        assert two["dp_size"] == 2
        # the premise: ranks reduce once per step after different numbers of micro-batches
        assert any(len({n for _, n in counts[s]}) > 1 for s in counts)
    else:
        assert two["dp_size"] == 1 and all(len({n for _, n in counts[s]}) == 1 for s in counts)
    if not several:
        assert len({n for s in one["mb_counts"] for _, n in one["mb_counts"][s]}) > 1  # per step, too
    for step in (1, 2, 3):
        assert float((one["logprobs"][step] - two["logprobs"][step]).abs().max()) <= TOL, step
        assert two["stats"][step]["grad_norm"] == pytest.approx(one["stats"][step]["grad_norm"], rel=1e-5)
        assert two["stats"][step]["lr"] == one["stats"][step]["lr"]
    # training moved the weights well beyond the tolerance, and both the same way
    assert max_diff(one["params"], one["params_start"]) > 10 * TOL
    assert max_diff(one["params"], two["params"]) <= TOL


@pytest.mark.parametrize("layout", PARAMS)
def test_published_weights_are_the_hf_weights(runs: Runs, small_model_dir: Path,
                                              layout: str) -> None:
    two = runs[layout]
    hf = load_hf_state(small_model_dir)
    assert two["params_start"].keys() == hf.keys()
    for k, v in hf.items():
        assert torch.equal(two["params_start"][k], v), k
    torch_pub = dict(TorchBackend(LearnerConfig(), small_model_dir).publish_tensors())
    assert torch_pub.keys() == hf.keys()
    for k, v in torch_pub.items():
        assert torch.equal(two["params_start"][k], v), k


@pytest.mark.parametrize("layout", PARAMS)
def test_untied_odd_vocabulary(runs: Runs, odd_vocab_model: Path, layout: str) -> None:
    """Vocabulary 500, untied: under tensor parallelism 512 logits of which 12 are padding (cut
    before the softmax); under pipeline parallelism the output layer lives on the last stage."""
    one, two = runs["one"]["probe_model_logprobs"], runs[layout]["probe_model_logprobs"]
    assert two.shape == one.shape
    assert float((two - one).abs().max()) <= 1e-5
    hf = load_hf_state(odd_vocab_model)
    assert runs[layout]["probe_model_params"].keys() == hf.keys()
    for k, v in hf.items():
        assert torch.equal(runs[layout]["probe_model_params"][k], v), k


@pytest.mark.parametrize("layout", RESUMED)
def test_checkpoint_on_two_ranks_continues_exactly(runs: Runs, layout: str) -> None:
    straight, resumed = runs[layout], runs[f"{layout}_resumed"]
    ck: Path = straight["ckpt"]
    files = sorted(p.name for p in (ck / "optim").iterdir())
    expect = {"dp2": ["tp0_pp0_dp0.pt"], "dp2_distopt": ["tp0_pp0_dp0.pt", "tp0_pp0_dp1.pt"],
              "tp2": ["tp0_pp0_dp0.pt", "tp1_pp0_dp0.pt"], "pp2": ["tp0_pp0_dp0.pt", "tp0_pp1_dp0.pt"]}[layout]
    assert files == expect  # each rank wrote what only it holds
    # the model: shards of at most SHARD_BYTES (a larger tensor alone) and the index naming them
    model = ck / "model"
    index = json.loads((model / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) > 2 and shards == sorted(p.name for p in model.glob("*.safetensors"))
    assert shards[0] == f"model-00001-of-{len(shards):05d}.safetensors"
    total = 0
    for f in shards:
        part = load_file(model / f)
        size = sum(t.numel() * t.element_size() for t in part.values())
        assert size <= SHARD_BYTES or len(part) == 1, (f, size)
        assert {k for k, v in index["weight_map"].items() if v == f} == part.keys()
        total += size
    assert index["metadata"]["total_size"] == total
    assert torch.equal(resumed["logprobs"][3], straight["logprobs"][3])
    assert resumed["stats"][3]["grad_norm"] == straight["stats"][3]["grad_norm"]
    assert max_diff(resumed["params"], straight["params"]) == 0.0
    # the checkpoint's model is an HF directory: the torch backend loads what two ranks publish
    loaded = dict(TorchBackend(LearnerConfig(), ck / "model").publish_tensors())
    assert loaded.keys() == resumed["params_start"].keys()
    for k, v in loaded.items():
        assert torch.equal(resumed["params_start"][k], v), k
