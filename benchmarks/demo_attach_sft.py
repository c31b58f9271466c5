"""Give a finished RL arm the SFT control of another run whose control is the same procedure.

    .venv/bin/python benchmarks/demo_attach_sft.py RL_ARM SOURCE_ARM OUT_ARM

The SFT control (`swarl demo`'s `sft_control`) continues the warm start's supervised training
for as many steps as the learner took, with the learner's batch size, learning rate and warm-up;
nothing else of the run enters it, and its evaluation reuses the run's draws. So an RL arm run
with `--no-sft-control`, or one whose settings differ only where the control does not read them
(e.g. `learner.max_update_kl`), has the same control as another arm of the same seed. This copies
RL_ARM to OUT_ARM with SOURCE_ARM's control (eval/sft-*, model/sft-control) and rebuilds its
learning.json and result.json as `swarl demo` writes them — refusing, with the reason, unless:
both arms are rl arms of the same seed and warm seed with the same number of learner steps; their
warm weights are the same bytes; the control's settings are equal; and their "before" episodes are
the same episodes (same draws). The record of a proof assembled this way says so (docs/demo.md).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from swarl.demo.choice import evaluations as choice_evaluations  # noqa: E402
from swarl.demo.choice import summary as choice_summary  # noqa: E402
from swarl.demo.run import (  # noqa: E402
    Demo,
    DemoOptions,
    _outcomes,
    flat_result,
    learning_report,
    read_episodes,
    task_groups,
)

# what the control reads of the run's config (swarl.demo.run.Demo.sft_control)
CONTROL_KEYS = (("admission", "batch_size"), ("learner", "lr"), ("learner", "warmup_steps"))


def _episodes(arm: Path, name: str) -> dict[str, list[dict[str, Any]]]:
    return {d.name.split("-", 1)[1]: read_episodes(d) for d in sorted((arm / "eval").glob(f"{name}-*"))}


def _weights_digest(model_dir: Path) -> str:
    h = hashlib.sha256()
    for f in sorted(model_dir.iterdir()):
        h.update(f.name.encode())
        h.update(f.read_bytes())
    return h.hexdigest()


def check(rl: Path, src: Path) -> list[str]:
    """Why `src`'s control is not `rl`'s (empty: it is)."""
    why = []
    r, s = (json.loads((d / "result.json").read_text()) for d in (rl, src))
    for k in ("arm", "seed", "warm_seed", "learner_steps"):
        if r.get(k) != s.get(k):
            why.append(f"{k}: {r.get(k)!r} here, {s.get(k)!r} in the source")
    if r.get("arm") != "rl":
        why.append(f"arm: {r.get('arm')!r}, not an rl arm")
    if _weights_digest(rl / "model" / "warm") != _weights_digest(src / "model" / "warm"):
        why.append("model/warm: different weights")
    rc, sc = (yaml.safe_load((d / "config.yaml").read_text()) for d in (rl, src))
    for a, b in CONTROL_KEYS:
        if rc[a][b] != sc[a][b]:
            why.append(f"{a}.{b}: {rc[a][b]!r} here, {sc[a][b]!r} in the source")
    rb, sb, ssft = _episodes(rl, "before"), _episodes(src, "before"), _episodes(src, "sft")
    if set(rb) != set(ssft):
        why.append(f"the source's sft evaluations {sorted(ssft)} are not this run's splits {sorted(rb)}")
    for split in rb:
        if _outcomes(rb[split]) != _outcomes(sb.get(split, [])):
            why.append(f"before-{split}: not the same episodes (draws or weights differ)")
    if _episodes(rl, "sft"):
        why.append("this arm has an SFT control already")
    return why


def attach(rl: Path, src: Path, out: Path) -> dict[str, Any]:
    shutil.copytree(rl, out, symlinks=True)  # copy2: config.yaml's and result.json's times kept (wall time)
    for d in (src / "eval").glob("sft-*"):
        shutil.copytree(d, out / "eval" / d.name)
    shutil.copytree(src / "model" / "sft-control", out / "model" / "sft-control")
    result = json.loads((rl / "result.json").read_text())
    before, after, sft = _episodes(out, "before"), _episodes(out, "after"), _episodes(out, "sft")
    demo = Demo(DemoOptions(seed=result["seed"], handwritten=False, run_dir=str(out)))
    groups = task_groups([r for sp in before for r in demo.eval_rows(sp)])
    learning = learning_report(before, after, {"sft": sft}, seed=result["seed"], groups=groups)
    old = json.loads((rl / "learning.json").read_text())
    learning["arm"] = "rl"
    learning["before_from"] = old.get("before_from")
    learning["choice"] = choice_summary(out / "trajectories")
    learning["eval_choice"] = choice_evaluations(out / "eval")
    learning["sft_control_from"] = str(src.resolve())
    (out / "learning.json").write_text(json.dumps(learning, indent=1) + "\n")
    mtime = (rl / "result.json").stat().st_mtime
    result = {**result, **flat_result(learning), "run_dir": str(out.resolve()), "ran_in": result["run_dir"],
              "sft_control_from": str(src.resolve())}
    (out / "result.json").write_text(json.dumps(result) + "\n")
    os.utime(out / "result.json", (mtime, mtime))  # the arm's wall time stays its own
    return result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("rl_arm", type=Path)
    ap.add_argument("source_arm", type=Path)
    ap.add_argument("out_arm", type=Path)
    a = ap.parse_args()
    if a.out_arm.exists():
        raise SystemExit(f"{a.out_arm}: exists")
    if why := check(a.rl_arm, a.source_arm):
        raise SystemExit("not the same control:\n  " + "\n  ".join(why))
    result = attach(a.rl_arm, a.source_arm, a.out_arm)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    from swarl.demo import kernels

    kernels.pin()  # the kernels `swarl demo` pins: the same warm start (swarl/demo/kernels.py)
    raise SystemExit(main())
