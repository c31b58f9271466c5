"""Supervised warm start for the demo: teach a fresh tiny model the agent's procedure on the
generated instances (swe/tasks/generated.py), so that it inspects, edits and submits in
well-formed actions — the procedure, not the answers.

Each demonstration is three turns: inspect (`grep -rn -A2 'def <fn>(' .`, the function the
issue names), edit the line the inspection printed in the file that defines the function
(`sed -i '<line>s/<old>/<new>/' $(grep -rl 'def <fn>(' .)`), submit. The edit is one of the
primitives demonstrated for the symptom's family (its two inverse primitives, e.g. ` > ` ->
` >= ` and ` >= ` -> ` > `), each equally often and chosen without looking at the code: which
one the inspected line needs is what RL has to learn from the tests' verdict. Half of the
demonstrations therefore show an edit that does not fix the bug (often one that changes
nothing). Two sources (swarl demo --sft-on):
- `practice` (the demo's default): one demonstration on each of N new instances drawn like the
  train split (train combinations, no held-out path; function numbers the train split's, or every
  two-digit one: swe.tasks.generated.practice's `names`); the primitive shown is
  the instance's `demo_edit`, which the generator sets from the instance's index so that every
  (code shape, primitive) pair occurs equally often (tests/ops/test_warmstart.py counts them).
- `train`: the train split, one demonstration per primitive of each instance.
Optionally (swarl demo --reading-demos N) N more on the reading families
(swe.tasks.generated.READING_FAMILIES: other operators, never in a split, the pool or an
evaluation), each showing its *correct* fix: the policy then meets RL able to copy an operator it
read, on families where the copy decides, and 50/50 on the suite's own.
Held-out instances get no demonstrations. The sequences are built with the actors' own
token-exact conversation code, so they are exactly what the agent sees, observations included
(the grep output is what GNU grep prints in the image; a Docker test checks it)."""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

SUBMIT = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT && git add -A && git diff --cached"
INSPECT_THOUGHT = "THOUGHT: I read the function the issue names."
FIX_THOUGHT = "THOUGHT: I change the line that causes this bug."
SUBMIT_THOUGHT = "THOUGHT: The fix is in place, so I submit it."


class Interrupted(Exception):
    """sft() was asked to stop."""


def answer(thought: str, command: str) -> str:
    return f"{thought}\n\n```bash\n{command}\n```"


def procedure(row: dict[str, Any], fix: str, inst: Any = None) -> list[tuple[str, str]]:
    """(answer, observation) per turn of one demonstration on a generated instance."""
    from swe.tasks.generated import get_instance, inspect_output

    inst = inst or get_instance(row["instance_id"])
    return [(answer(INSPECT_THOUGHT, row["swarl_inspect_command"]), inspect_output(inst)),
            (answer(FIX_THOUGHT, fix), ""),
            (answer(SUBMIT_THOUGHT, SUBMIT), "")]


def demonstrations(rows: list[Any], templates: Any, encoder: Any, cwd: str = "/testbed",
                   step_limit: int = 4, every_edit: bool = False,
                   correct: bool = False) -> list[tuple[list[int], list[int]]]:
    """(ids, loss mask) per demonstration, mask 1 on the answers. `rows`: generated train rows,
    or (demo_row, Instance) pairs of practice instances. Per instance one demonstration of the
    family's primitive `swarl_demo_edit` (without it: the family's primitives in turn);
    every_edit: one per primitive instead. Never chosen by the code's shape. `correct`: the
    gold fix instead (the one the code needs), one per instance: the ceiling study's
    demonstrations (benchmarks/demo_ceiling.py), which a policy can only follow by reading."""
    from actors.context import TokenConversation
    from actors.protocols import ExecOutput

    out = []
    turn: dict[str, int] = {}
    for item in rows:
        row, inst = (item if isinstance(item, tuple) else (item, None))
        if row.get("swarl_suite") != "generated":
            raise ValueError(f"{row['instance_id']}: demonstrations need generated instances "
                             "(swe/tasks/generated.py), which say how to inspect them")
        if row["swarl_split"] not in ("train", "practice"):
            raise ValueError(f"{row['instance_id']}: no demonstrations on held-out instances")
        edits = list(row["swarl_edit_commands"].values())
        k = turn.get(row["swarl_family"], 0)
        turn[row["swarl_family"]] = k + 1
        k = row.get("swarl_demo_edit", k)
        # reading practice (swe.tasks.generated.reading_practice) always shows its correct fix
        fixes = ([row["swarl_fix_command"]] if correct or row.get("swarl_demo_correct")
                 else edits if every_edit else [edits[k % len(edits)]])
        variables = {"task": row["problem_statement"], "instance": row, "step_limit": step_limit, "cwd": cwd}
        system, user = templates.render("system", **variables), templates.render("instance", **variables)
        for fix in fixes:
            conv = TokenConversation(encoder, system, user, lambda n: templates.render("context_marker", n_omitted=n))
            mask = [0] * len(conv.prompt)
            turns = procedure(row, fix, inst)
            for k, (text, observation) in enumerate(turns):
                ids = [*encoder.tokenize(text), encoder.eos_id]
                conv.add_answer(ids, [0.0] * len(ids), stopped=True)
                mask += [0] * len(encoder.gen_prompt) + [1] * len(ids)
                if k < len(turns) - 1:
                    conv.add_observation(templates.render("observation", output=ExecOutput(0, observation)))
                    mask += [0] * len(conv.blocks[-1].observation)
            ids = conv.full_ids()
            assert len(ids) == len(mask), "mask must align with the conversation"
            out.append((ids, mask))
    return out


def sft(model_dir: str | Path, out_dir: str | Path, seqs: list[tuple[list[int], list[int]]],
        epochs: int = 40, lr: float = 1e-3, batch_size: int = 8, seed: int = 0,
        progress: Callable[[int, int, float], None] | None = None, max_steps: int | None = None,
        warmup: int = 10, decay: bool = True, stop: Callable[[], bool] | None = None,
        snapshots: dict[int, Path] | None = None) -> Path:
    """Cross-entropy on the masked tokens; AdamW; saves an HF model (+ tokenizer) to out_dir.
    The learning rate warms up linearly over `warmup` steps, then decays linearly to 5% (decay)
    or stays; `max_steps` stops early (the demo's SFT control: as many steps as RL took). `stop()`
    true before a step: Interrupted, nothing saved (the demo interrupted during its warm start).
    `snapshots` (step -> directory): the model as it is after that step is saved there too (one
    run read at several budgets; with decay=False each is the run that stopped there)."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    rng = random.Random(seed)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    pad = 0
    steps_per_epoch = (len(seqs) + batch_size - 1) // batch_size
    total = epochs * steps_per_epoch if max_steps is None else min(max_steps, epochs * steps_per_epoch)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / max(1, warmup)) * (max(0.05, 1 - s / total) if decay else 1.0))
    step = 0
    for _ in range(epochs):
        if step >= total:
            break
        order = list(range(len(seqs)))
        rng.shuffle(order)
        for i in range(0, len(order), batch_size):
            if step >= total:
                break
            if stop is not None and stop():
                raise Interrupted(f"supervised training stopped at step {step}/{total}")
            batch = [seqs[j] for j in order[i : i + batch_size]]
            width = max(len(ids) for ids, _ in batch)
            ids = torch.full((len(batch), width), pad, dtype=torch.long)
            labels = torch.full((len(batch), width), -100, dtype=torch.long)
            attn = torch.zeros((len(batch), width), dtype=torch.long)
            for r, (x, m) in enumerate(batch):
                t = torch.tensor(x)
                ids[r, : len(x)] = t
                attn[r, : len(x)] = 1
                keep = torch.tensor(m, dtype=torch.bool)
                labels[r, : len(x)] = torch.where(keep, t, torch.tensor(-100))
            loss = _masked_loss(model, ids, attn, labels)
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            step += 1
            if progress:
                progress(step, total, float(loss.detach()))
            if snapshots and step in snapshots:
                _save(model, model_dir, snapshots[step])
    return _save(model, model_dir, Path(out_dir))


def _save(model: Any, model_dir: str | Path, out: Path) -> Path:
    from transformers import AutoTokenizer

    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    AutoTokenizer.from_pretrained(model_dir).save_pretrained(out)
    return out


def _masked_loss(model: Any, ids: Any, attn: Any, labels: Any) -> Any:
    """Next-token cross-entropy on the labelled positions only: the vocabulary projection is
    computed where the loss is (the answers, about a third of a demonstration), not everywhere."""
    import torch

    hidden = model.model(input_ids=ids, attention_mask=attn).last_hidden_state[:, :-1]
    target = labels[:, 1:]
    keep = target != -100
    logits = model.lm_head(hidden[keep])
    return torch.nn.functional.cross_entropy(logits.float(), target[keep])
