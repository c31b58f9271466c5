"""Can the warm-started tiny model read? Warm-start it (swarl.demo.warmstart) and sample its first two
turns on each split of the generated suite: is the inspection command right (the function's
name typed from the issue), and, shown the right inspection's output, which edit does it type
(the gold fix, the family's other primitive, anything else)? And per code form: how often it
types each of the family's primitives — before RL this should not depend on the form (the
warm start never conditions its edit on the code), so gold is about half of the well-typed
edits. No Docker, no servers: HF generate on CPU.

    .venv/bin/python benchmarks/warmstart_reading.py --on practice --demos 9600 --epochs 1
    .venv/bin/python benchmarks/warmstart_reading.py --names all --seed 1       # practice names
    .venv/bin/python benchmarks/warmstart_reading.py --model runs/X/model/warm  # probe a warm start
    .venv/bin/python benchmarks/warmstart_reading.py --model DIR --reading-probe 48  # and the reading families

`--reading-probe N` adds a split `reading`: N fresh instances of the reading families (the
warm start's `--reading-demos` shows their correct fix; these are drawn from another stream), where
a warm start that learned the copy types the gold fix, not half of the time.

`inspect` is the share of first replies that type the right inspection (the issue's function
name copied): on held-out rows, with `--names train`, a name no demonstration typed.

The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main() -> int:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from actors.context import TokenConversation
    from actors.encoding import ChatEncoder
    from actors.protocols import ExecOutput
    from actors.templates import load_templates
    from inference.tiny_model import init_tiny
    from swarl.config import REPO_ROOT
    from swarl.demo.warmstart import INSPECT_THOUGHT, answer, demonstrations, sft
    from swe.tasks import load_tasks
    from swe.tasks.generated import (
        PRACTICE_NAMES,
        demo_row,
        get_instance,
        inspect_output,
        practice,
        reading_practice,
    )

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--on", choices=("train", "practice"), default="practice")
    ap.add_argument("--demos", type=int, default=4000, help="practice instances (--on practice)")
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--names", choices=PRACTICE_NAMES, default="train",
                    help="practice instances' function names (swe.tasks.generated.practice)")
    ap.add_argument("--reading-demos", type=int, default=0, help="train with this many reading-family "
                    "demonstrations too (swarl demo --reading-demos)")
    ap.add_argument("--reading-probe", type=int, default=0, help="also probe this many fresh reading-family "
                    "instances (split `reading`)")
    ap.add_argument("--splits", default="train,heldout,heldout_family",
                    help="the generated suite's splits probed (comma-separated; '' for none)")
    ap.add_argument("--samples", type=int, default=4)
    ap.add_argument("--temperature", type=float, default=0.7, help="sampling temperature (the demo's: 0.7)")
    ap.add_argument("--seed", type=int, default=0, help="the warm start's seed, and the draws'")
    ap.add_argument("--model", type=Path, help="probe this warm-started model (a demo run's model/warm) "
                    "instead of training one")
    a = ap.parse_args()
    torch.set_num_threads(2)
    torch.manual_seed(a.seed)
    t0 = time.monotonic()
    if a.model is not None:
        warm = a.model
        tok = AutoTokenizer.from_pretrained(warm)
        enc = ChatEncoder(tok)
        tpl = load_templates(REPO_ROOT / "configs" / "prompts" / "compact.yaml")
        seqs: list = []
    else:
        work = Path(tempfile.mkdtemp(prefix="swarl-warmstart-reading-"))
        base = init_tiny(work / "base", seed=a.seed)
        tok = AutoTokenizer.from_pretrained(base)
        enc = ChatEncoder(tok)
        tpl = load_templates(REPO_ROOT / "configs" / "prompts" / "compact.yaml")
        rows = ([(demo_row(i), i) for i in practice(a.demos, seed=a.seed, names=a.names)] if a.on == "practice"
                else load_tasks("train", suite="generated"))
        rows += [(demo_row(i), i) for i in reading_practice(a.reading_demos, seed=a.seed, names=a.names)]
        seqs = demonstrations(rows, tpl, enc, every_edit=a.on == "train")

        def progress(step: int, total: int, loss: float) -> None:
            if step % 50 == 0 or step == total:
                print(f"warm start step {step}/{total} loss {loss:.3f} {time.monotonic() - t0:.0f}s", flush=True)

        warm = work / "warm"
        sft(base, warm, seqs, epochs=a.epochs, lr=a.lr, seed=a.seed, progress=progress)
    model = AutoModelForCausalLM.from_pretrained(warm, dtype=torch.float32).eval()
    action = re.compile(r"```bash\s*\n(.*?)\n```", re.S)

    def sample(ids: list[int]) -> list[str | None]:
        x = torch.tensor([ids] * a.samples)
        with torch.no_grad():
            g = model.generate(x, attention_mask=torch.ones_like(x), do_sample=True, temperature=a.temperature, top_p=1.0,
                               max_new_tokens=60, eos_token_id=enc.eos_id, pad_token_id=0)
        out = []
        for row in g[:, len(ids):].tolist():
            row = row[: row.index(enc.eos_id)] if enc.eos_id in row else row
            found = action.findall(str(tok.decode(row)))
            out.append(found[0] if len(found) == 1 else None)
        return out

    result: dict[str, object] = ({"model": str(a.model)} if a.model is not None else
                                 {"on": a.on, "names": a.names, "demos": len(seqs), "epochs": a.epochs,
                                  "reading_demos": a.reading_demos,
                                  "seed": a.seed, "warm_start_s": round(time.monotonic() - t0)})
    result["temperature"] = a.temperature
    shown_other: dict[str, int] = {}
    per_form: dict[str, dict[str, int]] = {}  # family:form -> primitive typed -> count
    splits = {s: [(r, get_instance(r["instance_id"])) for r in load_tasks(s, suite="generated")]
              for s in filter(None, a.splits.split(","))}
    if a.reading_probe:  # a stream no warm start trains on
        splits["reading"] = [(demo_row(i), i) for i in reading_practice(a.reading_probe, seed=10_000 + a.seed,
                                                                        names="all")]
    for split, split_rows in splits.items():
        c = {"inspect": 0, "gold": 0, "wrong": 0, "other": 0}
        for row, inst in split_rows:
            v = {"task": row["problem_statement"], "instance": row, "step_limit": 4, "cwd": "/testbed"}
            conv = TokenConversation(enc, tpl.render("system", **v), tpl.render("instance", **v), lambda n: "")
            c["inspect"] += sum(t == row["swarl_inspect_command"] for t in sample(conv.full_ids() + enc.gen_prompt))
            ids = [*enc.tokenize(answer(INSPECT_THOUGHT, row["swarl_inspect_command"])), enc.eos_id]
            conv.add_answer(ids, [0.0] * len(ids), stopped=True)
            shown = inspect_output(inst)
            conv.add_observation(tpl.render("observation", output=ExecOutput(0, shown)))
            form = f"{row['swarl_family']}:{row['swarl_shape'].split('/')[0]}"
            for t in sample(conv.full_ids() + enc.gen_prompt):
                k = "gold" if t == row["swarl_fix_command"] else "wrong" if t in row["swarl_wrong_commands"] else "other"
                c[k] += 1
                typed = next((p for p, cmd in row["swarl_edit_commands"].items() if cmd == t), "other")
                per_form.setdefault(form, {}).setdefault(typed, 0)
                per_form[form][typed] += 1
                if k == "other" and shown_other.get(split, 0) < 6:
                    shown_other[split] = shown_other.get(split, 0) + 1
                    print("  want", row["swarl_fix_command"], "\n  got ", t, flush=True)
        n = len(split_rows) * a.samples
        result[split] = {k: round(v / n, 3) for k, v in c.items()}
        print(split, result[split], flush=True)
    result["primitive_typed_per_form"] = per_form
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    from swarl.demo import kernels

    kernels.pin()  # the kernels `swarl demo` pins: the same warm start (swarl/demo/kernels.py)
    raise SystemExit(main())
