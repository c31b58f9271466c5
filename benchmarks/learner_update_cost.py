"""The learner step's cost per design, by phase: one pass or two over the batch, and the trust
region's check per minibatch or over the whole batch (learner.max_update_kl_scope).

Same tiny model (inference.tiny_model), same samples shaped like the demo's (32 of ~330-400
tokens, the last ~35% carrying loss, 8 groups of 4 with +-1 advantages), the demo's learner
settings (configs/demo.yaml: the KL term to the reference, the spike clip, lr) but the ones each
row names. The modes take turns, one step each, so that load drift hits every mode alike; the
median step counts. The trust region's bound is one no update reaches (--bound, 1e9): what is
measured is the check itself, not the backtracking, which depends on the data.

    .venv/bin/python benchmarks/learner_update_cost.py [--steps 3 --threads 1]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
import yaml

from _record import markdown_table, record

ROOT = Path(__file__).resolve().parents[1]
MODES = [  # label, learner overrides
    ("1 pass, 2 updates of 16", {"epochs": 1, "max_update_kl_scope": "minibatch"}),
    ("2 passes, region per minibatch", {"epochs": 2, "max_update_kl_scope": "minibatch"}),
    ("2 passes, region over the batch (the design)", {"epochs": 2, "max_update_kl_scope": "batch"}),
    ("2 passes of 1 update of 32, region over the batch", {"epochs": 2, "minibatches": 1,
                                                            "max_update_kl_scope": "batch"}),
]
PHASES = ("proximal", "reference", "forward+backward", "optimizer", "trust region", "update KL")


def make_items(n: int, seed: int, vocab: int, minibatches: int):
    from learner.packing import TrainItem

    rng = np.random.default_rng(seed)
    items = []
    for i in range(n):
        n_tok = int(rng.integers(330, 400))
        mask = np.zeros(n_tok, dtype=np.uint8)
        mask[int(n_tok * 0.65):] = 1
        adv = 1.0 if (i % 4) < 2 else -1.0  # each group of 4: two resolved, two not
        items.append(TrainItem(f"s{i}", rng.integers(10, vocab, size=n_tok).astype(np.int32), mask,
                               np.where(mask == 1, -1.0, 0.0).astype(np.float32), adv,
                               minibatch=(i // 4) % minibatches, fresh=True))
    return items


def timed(timers: dict[str, float], label: str, f):
    def g(*a, **k):
        t = time.perf_counter()
        try:
            return f(*a, **k)
        finally:
            timers[label] += time.perf_counter() - t
    return g


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--samples", type=int, default=32)
    ap.add_argument("--bound", type=float, default=1e9, help="learner.max_update_kl")
    args = ap.parse_args()

    import torch

    from inference.tiny_model import DEFAULT_SIZE, init_tiny
    from learner import train as T
    from learner.backends.torch_backend import TorchBackend
    from learner.config import LearnerConfig
    from learner.spike_clip import SpikeClip

    torch.set_num_threads(args.threads)
    demo = yaml.safe_load((ROOT / "configs" / "demo.yaml").read_text())["learner"]
    timers: dict[str, dict[str, float]] = {}
    runs = {}
    with tempfile.TemporaryDirectory(prefix="swarl-bench-update-") as d:
        model_dir = init_tiny(d, seed=0)
        for label, over in MODES:
            cfg = LearnerConfig(**{**demo, "max_update_kl": args.bound, **over})
            backend = TorchBackend(cfg, model_dir, ref_model_dir=model_dir)
            t = timers[label] = defaultdict(float)
            for name, phase in (("train_microbatches", "forward+backward"), ("step", "optimizer"),
                                ("ref_logprobs", "reference")):
                setattr(backend, name, timed(t, phase, getattr(backend, name)))
            spikes = SpikeClip(cfg.spike_clip) if cfg.spike_clip else None
            items = make_items(args.samples, 0, DEFAULT_SIZE["vocab_size"], cfg.minibatches)
            T.set_token_weights(items, cfg.aggregation)
            runs[label] = (cfg, backend, spikes, items, [], {})
        originals = {n: getattr(T, n) for n in ("proximal_pass", "constrain", "update_kl")}
        try:
            for i in range(args.steps + 1):  # the first round warms up (allocator, kernels)
                if i == 1:
                    for t in timers.values():
                        t.clear()
                for label, (cfg, backend, spikes, items, times, last) in runs.items():
                    for name, phase in (("proximal_pass", "proximal"), ("constrain", "trust region"),
                                        ("update_kl", "update KL")):
                        setattr(T, name, timed(timers[label], phase, originals[name]))
                    t0 = time.perf_counter()
                    last.update(T.train_step(backend, items, cfg, spikes=spikes))
                    if i:
                        times.append(time.perf_counter() - t0)
        finally:
            for name, f in originals.items():
                setattr(T, name, f)
    rows, summary = [], {}
    for label, (_cfg, _b, _s, _items, times, last) in runs.items():
        sec = float(np.median(times))
        ph = {p: timers[label][p] / args.steps for p in PHASES}
        ph["forward+backward"] -= ph["reference"]  # the loss asks for the reference's logprobs
        rows.append([label, int(last["updates"]), round(sec, 2), *(round(ph[p], 2) for p in PHASES),
                     int(last.get("update_backtracked", 0))])
        summary[label] = {"sec_per_step": round(sec, 3), **{p: round(v, 3) for p, v in ph.items()}}
    base = summary[MODES[0][0]]["sec_per_step"]
    table = markdown_table(["design", "updates", "s/step", *(f"{p} s" for p in PHASES), "scaled back"], rows)
    print(table)
    out = {"steps": args.steps, "threads": args.threads, "samples": args.samples, "bound": args.bound,
           "tokens": int(runs[MODES[0][0]][5]["tokens"]), "modes": summary,
           "vs_one_pass": {label: round(s["sec_per_step"] / base, 3) for label, s in summary.items()}}
    notes = (f"Tiny Qwen3, torch {torch.__version__}, {args.threads} thread(s), {args.samples} samples of "
             "330-400 tokens (35% with loss), configs/demo.yaml's learner settings but each row's; median "
             f"of {args.steps} steps a mode after a warm-up, the modes interleaved step by step; "
             f"learner.max_update_kl {args.bound:g}. A phase is the seconds its function took (the trust "
             "region's forwards are in 'trust region'; the reference's in 'reference'). "
             "The machine is shared: compare rows, not runs.")
    record("learner_update_cost", table, out, notes)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
