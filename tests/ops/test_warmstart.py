"""The demo's warm start teaches the procedure on practice instances: inspect, edit the line the
inspection printed, submit; each of the family's primitives equally often and independently of
the code's shape (so it cannot teach which one is right); never on a held-out instance; masks
on the answers only."""

from __future__ import annotations

from collections import Counter

import pytest
from transformers import AutoTokenizer

from actors.encoding import ChatEncoder
from actors.templates import load_templates
from swarl.config import REPO_ROOT
from swarl.demo.warmstart import SUBMIT, demonstrations
from swe.tasks import load_tasks
from swe.tasks.generated import demo_row, practice, reading_practice


@pytest.fixture(scope="module")
def enc(tiny_model_dir):
    return ChatEncoder(AutoTokenizer.from_pretrained(tiny_model_dir))


def test_demonstrations_inspect_then_edit_then_submit(enc) -> None:
    tpl = load_templates(REPO_ROOT / "configs" / "prompts" / "compact.yaml")
    insts = practice(12, seed=3)
    seqs = demonstrations([(demo_row(i), i) for i in insts], tpl, enc)
    assert len(seqs) == 12
    for (ids, mask), inst in zip(seqs, insts, strict=True):
        assert len(ids) == len(mask)
        answered = enc.tok.decode([t for t, m in zip(ids, mask, strict=True) if m])
        row = demo_row(inst)
        # in this order: the inspection, the instance's demonstrated primitive, the submit command
        edit = list(row["swarl_edit_commands"].values())[inst.demo_edit]
        i, j = answered.index(row["swarl_inspect_command"]), answered.index(SUBMIT)
        assert i < answered.index(edit) < j
        assert sum(c in answered for c in row["swarl_edit_commands"].values()) == 1
        # the grep output (path and line) is an observation: never trained on
        shown = enc.tok.decode([t for t, m in zip(ids, mask, strict=True) if not m])
        assert f"./{inst.path}:" in shown and f"./{inst.path}:" not in answered


@pytest.mark.parametrize("names", ["train", "all"])
def test_the_edit_shown_is_independent_of_the_code(names: str) -> None:
    """Contingency count over the demonstrations' (form, layout) x primitive, per family: every
    cell equal (so the primitive tells nothing about the form, nor the form about it), each
    primitive shown equally often, and right exactly half of the time; with either set of
    practice names."""
    insts = practice(256, seed=1, names=names)
    cells: Counter[tuple[str, str, str]] = Counter()
    for inst in insts:
        prim = inst.family.primitives[inst.demo_edit]
        cells[(inst.family.name, inst.shape, prim)] += 1
    for fam in {i.family.name for i in insts}:
        table = {k: v for k, v in cells.items() if k[0] == fam}
        shapes, prims = {k[1] for k in table}, {k[2] for k in table}
        assert len(shapes) == 4 and len(prims) == 2, table
        assert set(table.values()) == {256 // 4 // 8}, table  # 4 families, 4 shapes x 2 primitives
    right = sum(inst.form.fix == (inst.family.primitives[inst.demo_edit],) for inst in insts)
    assert right == len(insts) // 2


def test_no_demonstration_on_heldout_or_hand_written_rows(enc) -> None:
    tpl = load_templates(REPO_ROOT / "configs" / "prompts" / "compact.yaml")
    with pytest.raises(ValueError, match="held-out"):
        demonstrations(load_tasks("heldout", suite="generated")[:1], tpl, enc)
    with pytest.raises(ValueError, match="generated instances"):
        demonstrations(load_tasks("train")[:1], tpl, enc)


def test_the_loss_on_the_answers_only_is_the_models_own(enc, tiny_model_dir) -> None:
    """The warm start computes logits only where the mask is set; its loss must be the model's
    own masked cross-entropy (labels -100 elsewhere), and its gradient reach the same weights."""
    import torch
    from transformers import AutoModelForCausalLM

    from swarl.demo.warmstart import _masked_loss

    tpl = load_templates(REPO_ROOT / "configs" / "prompts" / "compact.yaml")
    seqs = demonstrations([(demo_row(i), i) for i in practice(3, seed=5)], tpl, enc)
    width = max(len(ids) for ids, _ in seqs)
    ids = torch.zeros((3, width), dtype=torch.long)
    attn = torch.zeros_like(ids)
    labels = torch.full_like(ids, -100)
    for r, (x, m) in enumerate(seqs):
        ids[r, : len(x)], attn[r, : len(x)] = torch.tensor(x), 1
        labels[r, : len(x)] = torch.where(torch.tensor(m, dtype=torch.bool), torch.tensor(x), -100)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    ours = _masked_loss(model, ids, attn, labels)
    theirs = model(input_ids=ids, attention_mask=attn, labels=labels).loss
    assert torch.allclose(ours, theirs, atol=1e-5), (ours, theirs)
    g1 = torch.autograd.grad(ours, model.lm_head.weight)[0]
    g2 = torch.autograd.grad(model(input_ids=ids, attention_mask=attn, labels=labels).loss,
                             model.lm_head.weight)[0]
    assert torch.allclose(g1, g2, atol=1e-6)


def test_sft_stops_at_max_steps_with_a_flat_rate(enc, tiny_model_dir, tmp_path) -> None:
    """The SFT control's pass: as many steps as asked (the learner's), at a constant rate after
    its warm-up, and a model that loads."""
    from transformers import AutoModelForCausalLM

    from swarl.demo.warmstart import sft

    tpl = load_templates(REPO_ROOT / "configs" / "prompts" / "compact.yaml")
    seqs = demonstrations([(demo_row(i), i) for i in practice(8, seed=2)], tpl, enc)
    seen: list[int] = []
    out = sft(tiny_model_dir, tmp_path / "ctl", seqs, epochs=5, lr=1e-3, batch_size=2, max_steps=3,
              warmup=1, decay=False, progress=lambda step, total, loss: seen.append(total))
    assert seen == [3, 3, 3]
    assert AutoModelForCausalLM.from_pretrained(out) is not None


def test_sft_stops_when_asked(enc, tiny_model_dir, tmp_path) -> None:
    """Ctrl-C during the demo's warm start: the training thread stops at its next step (the demo
    sets the flag), not at its end, and saves nothing."""
    from swarl.demo.warmstart import Interrupted, sft

    tpl = load_templates(REPO_ROOT / "configs" / "prompts" / "compact.yaml")
    seqs = demonstrations([(demo_row(i), i) for i in practice(8, seed=2)], tpl, enc)
    steps: list[int] = []
    with pytest.raises(Interrupted, match="step 2/"):
        sft(tiny_model_dir, tmp_path / "out", seqs, epochs=5, batch_size=2,
            progress=lambda step, total, loss: steps.append(step), stop=lambda: len(steps) >= 2)
    assert steps == [1, 2] and not (tmp_path / "out").exists()


def test_correct_demonstrations_show_the_fix_the_code_needs(enc) -> None:
    """demonstrations(correct=True), the ceiling study's (benchmarks/demo_ceiling.py): per
    instance one demonstration of its gold fix — so the edit shown depends on the form, the
    very thing the warm start's own demonstrations never do."""
    tpl = load_templates(REPO_ROOT / "configs" / "prompts" / "compact.yaml")
    insts = practice(32, seed=4)
    seqs = demonstrations([(demo_row(i), i) for i in insts], tpl, enc, correct=True)
    assert len(seqs) == len(insts)
    shown: Counter[tuple[str, str]] = Counter()
    for (ids, mask), inst in zip(seqs, insts, strict=True):
        answered = enc.tok.decode([t for t, m in zip(ids, mask, strict=True) if m])
        row = demo_row(inst)
        assert row["swarl_fix_command"] in answered
        assert not any(w in answered for w in row["swarl_wrong_commands"])
        prim = next(p for p, c in row["swarl_edit_commands"].items() if c in answered)
        assert (prim,) == inst.form.fix
        shown[(inst.form.name, prim)] += 1
    assert len(shown) == 8  # 4 families x 2 forms, each with its own primitive


def test_reading_demonstrations_show_the_correct_fix_beside_the_suites_50_50(enc) -> None:
    """--reading-demos: the reading families' demonstrations always show the fix their line needs
    (the edit's pattern is the operator the inspection printed), while the suite's families in the
    same list keep their code-independent primitive; no reading demonstration touches a suite
    family."""
    from swe.tasks.generated import READING_FAMILIES, edit_reads_line

    tpl = load_templates(REPO_ROOT / "configs" / "prompts" / "compact.yaml")
    suite, reading = practice(16, seed=4), reading_practice(24, seed=4)
    seqs = demonstrations([(demo_row(i), i) for i in [*suite, *reading]], tpl, enc)
    assert len(seqs) == 40
    shown: Counter[tuple[str, bool]] = Counter()
    for (ids, mask), inst in zip(seqs, [*suite, *reading], strict=True):
        row = demo_row(inst)
        answered = enc.tok.decode([t for t, m in zip(ids, mask, strict=True) if m])
        edit = next(c for c in row["swarl_edit_commands"].values() if c in answered)
        messages = [{"role": "user", "content": "<output>" + enc.tok.decode(ids)}, {"role": "assistant", "content": edit}]
        reads = edit_reads_line(messages)
        assert reads is not None
        shown[(inst.family.name in READING_FAMILIES, reads)] += 1
        if inst.family.name in READING_FAMILIES:
            assert row["swarl_demo_correct"] and edit == row["swarl_fix_command"]
        else:
            assert not row["swarl_demo_correct"]
    assert shown == {(True, True): 24, (False, True): 8, (False, False): 8}


def test_sft_snapshots_are_the_run_at_that_step(enc, tiny_model_dir, tmp_path) -> None:
    """sft(snapshots=...): the model after step k saved as it is (one run read at several
    budgets); with a constant rate the snapshot equals the run stopped at k."""
    import torch
    from safetensors.torch import load_file

    from swarl.demo.warmstart import sft

    tpl = load_templates(REPO_ROOT / "configs" / "prompts" / "compact.yaml")
    seqs = demonstrations([(demo_row(i), i) for i in practice(8, seed=2)], tpl, enc)
    kw = {"epochs": 5, "lr": 1e-3, "batch_size": 2, "warmup": 1, "decay": False, "seed": 3}
    sft(tiny_model_dir, tmp_path / "long", seqs, max_steps=4, snapshots={2: tmp_path / "at2"}, **kw)
    sft(tiny_model_dir, tmp_path / "short", seqs, max_steps=2, **kw)
    a, b = load_file(tmp_path / "at2" / "model.safetensors"), load_file(tmp_path / "short" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    long = load_file(tmp_path / "long" / "model.safetensors")
    assert not all(torch.equal(a[k], long[k]) for k in a)
