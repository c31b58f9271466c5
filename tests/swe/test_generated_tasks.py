"""The generated suite (swe/tasks/generated.py): tasks where reading decides the edit.

Without Docker: the rows are fresh, valid SWE-bench rows; no fix command, path or function
name repeats across instances (nothing to memorise); held-out repositories' module paths and
function names never occur in training, held-out (wording, form, layout) combinations never
occur in training, and the held-out family never does. The best fixed symptom -> edits table
is computed exactly (every sequence of primitives applied and the tests run in process) and
scores no more than chance on every split, where a table that also knows the form (what the
inspection shows) resolves everything.
In Docker (each instance's own image): the gold patch resolves it, the fix command makes
exactly the gold change, an empty patch and every wrong fix do not, and the inspection prints
in the image exactly what the warm start's demonstrations show. `make test` grades one instance
per family, form and split; `make long` grades all of them."""

from __future__ import annotations

import re
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from fixtures_tasks import Variant, run_variants

from swarl.demo.run import PRACTICE
from swe.rows import validate_row
from swe.tasks import load_tasks
from swe.tasks.generated import (
    FAMILIES,
    HELDOUT_FAMILIES,
    HELDOUT_FN_NUMBERS,
    LAYOUTS,
    PRIMITIVES,
    READING_FAMILIES,
    READING_PRIMITIVES,
    SPLIT_COMBOS,
    SPLITS,
    TRAIN_FAMILIES,
    TRAIN_FN_NUMBERS,
    apply_edits,
    best_fixed_policy,
    edit_reads_line,
    fix_commands,
    get_instance,
    inspect_command,
    inspect_output,
    instances,
    main,
    names_function,
    practice,
    reading_practice,
    resolves,
)

ROWS = load_tasks("all", suite="generated")
GOLD_IDENTICAL = "@@gold-identical"


def test_generated_rows_are_fresh_and_valid() -> None:
    assert main(["--check"]) == 0, "run `python -m swe.tasks.generated`"
    for row in ROWS:
        validate_row(row)
    assert {r["swarl_split"] for r in ROWS} == {"train", "heldout", "heldout_family"}


def test_nothing_to_memorise() -> None:
    for key in ("swarl_fix_command", "repo", "instance_id"):
        values = [r[key] for r in ROWS]
        assert len(set(values)) == len(values), f"{key} repeats across instances"
    held = [r["swarl_inspect_command"] for r in ROWS if r["swarl_split"] != "train"]
    assert len(set(held)) == len(held), "a held-out buggy function repeats"
    targets = [(get_instance(r["instance_id"]).path, get_instance(r["instance_id"]).lineno) for r in ROWS]
    assert len({p for p, _ in targets}) > len(ROWS) * 0.8, "bug paths should differ per instance"
    assert len({n for _, n in targets}) >= 8, "bug lines should differ per instance"
    # the issue text names the function and the symptom, never the file or the line
    for r in ROWS:
        inst = get_instance(r["instance_id"])
        assert inst.fn in r["problem_statement"]
        assert inst.path not in r["problem_statement"] and f"{inst.lineno}s/" not in r["problem_statement"]


def test_heldout_repositories_and_families_are_unseen() -> None:
    train = [r for r in ROWS if r["swarl_split"] == "train"]
    held = [r for r in ROWS if r["swarl_split"] != "train"]
    assert {r["swarl_family"] for r in train} == set(TRAIN_FAMILIES)
    assert {r["swarl_family"] for r in ROWS if r["swarl_split"] == "heldout"} == set(TRAIN_FAMILIES)
    assert {r["swarl_family"] for r in ROWS if r["swarl_split"] == "heldout_family"} == set(HELDOUT_FAMILIES)
    # held-out combinations of wording x form x layout never occur in training (train split or
    # practice), while each of their pairs of factors does: the combination is what is new
    def combo(i: Any) -> tuple[str, int, str, str]:
        return i.family.name, i.wording, i.form.name, i.layout
    trained = {combo(i) for i in instances() if i.split == "train"} | {combo(i) for i in practice(256)}
    held_combos = {combo(i) for i in instances() if i.split == "heldout"}
    assert len(held_combos) == 32 and not held_combos & trained
    for f, w, form, layout in held_combos:
        assert any(c[:3] == (f, w, form) for c in trained) and any(c[::2] == (f, form) for c in trained)
        assert any((c[0], c[1], c[3]) == (f, w, layout) for c in trained)
        assert any((c[0], c[2], c[3]) == (f, form, layout) for c in trained)
    train_text = "\n".join([f for r in train for f in get_instance(r["instance_id"]).files.values()]
                           + [r["problem_statement"] for r in train])
    warm = practice(PRACTICE)  # the default names; under names="all" they do occur (the next test)
    warm_text = "\n".join(f for i in warm for f in i.files.values())
    named = set(re.findall(r"\bfn_\d+\b", warm_text)) | set(re.findall(r"\bfn_\d+\b", train_text))
    for r in held:  # a held-out repository's module path and buggy function never occur in training
        inst = get_instance(r["instance_id"])
        assert inst.path not in {i.path for i in warm}, r["instance_id"]
        assert inst.fn not in named, r["instance_id"]
        pkg, mod = inst.path.removesuffix(".py").split("/")
        assert f"from {pkg}.{mod} import" not in train_text, r["instance_id"]


def test_practice_names_all_show_every_number_never_a_heldout_instance() -> None:
    """`practice(names="all")`: the buggy functions are numbered from every two-digit number, the
    held-out names included (so copying one is demonstrated), in train combinations and never at a
    held-out path; the default names are the train split's, as before."""
    every = practice(PRACTICE, seed=1, names="all")
    assert [i.fn for i in practice(64, seed=1)] == [i.fn for i in practice(64, seed=1, names="train")]
    assert all(int(i.fn.removeprefix("fn_")) in TRAIN_FN_NUMBERS for i in practice(256, seed=1))
    buggy_numbers = {int(i.fn.removeprefix("fn_")) for i in every}
    assert buggy_numbers == set(range(10, 100)) and HELDOUT_FN_NUMBERS < buggy_numbers
    held = [i for i in instances() if i.split != "train"]
    assert not {i.path for i in held} & {i.path for i in every}
    combos = {(i.wording, i.family.forms.index(i.form), LAYOUTS.index(i.layout)) for i in every}
    assert combos == set(SPLIT_COMBOS["train"])
    with pytest.raises(ValueError, match="practice names"):
        practice(4, names="wide")


def test_no_fixed_symptom_table_beats_chance() -> None:
    """Exactly: the best table from the symptom (family and wording) to a sequence of up to 3
    primitives (the step budget less the inspection) resolves half of train and held-out, and
    of the two-primitive held-out family no more than half (none with one edit); a table that
    also knows the form resolves all of it. So only reading the code gets above chance."""
    for split in SPLITS:
        insts = [i for i in instances() if i.split == split]
        for key in (lambda i: i.symptom, lambda i: i.family.name):  # per wording, per family
            best = best_fixed_policy(insts, max_edits=3, key=key)
            assert best["rate"] <= 0.5, (split, best)
        knows_form = best_fixed_policy(insts, max_edits=2, key=lambda i: (i.symptom, i.form.name))
        assert knows_form["rate"] == 1.0, (split, knows_form)
        # every symptom comes with both forms, equally often
        for (fam, wording), forms in Counter((i.symptom, i.form.name) for i in insts).items():
            assert forms == len(insts) // (2 * len({i.symptom for i in insts})), (split, fam, wording)
        if split == "heldout_family":
            assert best_fixed_policy(insts, max_edits=1)["rate"] == 0.0


def test_each_form_has_its_own_fix() -> None:
    """The gold fix is the form's primitives; the family's other primitive leaves the bug
    (a no-op or a wrong line), and both forms' fixes exist among the demonstrated primitives."""
    for inst in instances():
        assert resolves(inst, inst.good_line) and not resolves(inst, inst.bad_line), inst.name
        assert apply_edits(inst.bad_line, inst.form.fix) == inst.good_line
        for p in inst.family.primitives:
            if (p,) != inst.form.fix:
                assert not resolves(inst, apply_edits(inst.bad_line, [p])), (inst.name, p)
    for name in HELDOUT_FAMILIES:  # a composition of primitives demonstrated separately
        for form in FAMILIES[name].forms:
            assert len(form.fix) == 2
            for p in form.fix:
                assert p in PRIMITIVES and any(p in FAMILIES[t].primitives for t in TRAIN_FAMILIES)


def test_reading_families_teach_the_copy_not_the_suites_answers(tmp_path) -> None:
    """The warm start's reading practice (`--reading-demos`): per family both forms, each resolved
    by its own fix only, applied by the row's real `sed` command; every combination, no held-out
    path; and none of its operators occurs on a suite line, nor a suite operator in its primitives:
    its demonstrations cannot show what a train or held-out instance needs."""
    import subprocess

    from swe.tasks.generated import buggy, demo_row
    from swe.tasks.gitrepo import write_files

    insts = reading_practice(96, seed=2, names="all")
    assert {i.family.name for i in insts} == set(READING_FAMILIES) and not set(READING_FAMILIES) & set(FAMILIES)
    assert Counter((i.family.name, i.wording, i.form.name, i.layout) for i in insts) == Counter(
        {(f, w, fo.name, la): 2 for f, fam in READING_FAMILIES.items() for w in range(4)
         for fo in fam.forms for la in LAYOUTS})
    held = {i.path for i in instances() if i.split != "train"}
    assert not held & {i.path for i in insts}
    for inst in insts[:24]:
        assert resolves(inst, inst.good_line) and not resolves(inst, inst.bad_line), inst.name
        for p in inst.family.primitives:
            assert resolves(inst, apply_edits(inst.bad_line, [p])) == ((p,) == inst.form.fix), (inst.name, p)
        d = tmp_path / inst.name
        write_files(d, buggy(inst))
        subprocess.run(["bash", "-c", demo_row(inst)["swarl_fix_command"]], cwd=d, check=True, timeout=30)
        assert (d / inst.path).read_text().split("\n")[inst.lineno - 1] == inst.good_line
    suite_ops = {x for p in PRIMITIVES.values() for x in (p.old, p.new)}
    for p in READING_PRIMITIVES.values():
        assert p.old not in suite_ops and p.new not in suite_ops
        assert not any(p.old in i.bad_line for i in instances()), p
    with pytest.raises(ValueError, match="practice names"):
        reading_practice(3, names="wide")


def _variants(row: dict[str, Any]) -> list[Variant]:
    fix = (f"{row['swarl_fix_command']} && git apply -R /tmp/swarl_gold.patch && "
           f"test -z \"$(git status --porcelain)\" && echo {GOLD_IDENTICAL}")
    return [Variant("gold", patch=row["patch"]), Variant("empty"),
            Variant("inspect", command=row["swarl_inspect_command"], evaluate=False),
            Variant("fix_command", command=fix, evaluate=False, files={"/tmp/swarl_gold.patch": row["patch"]}),
            *(Variant(f"wrong_{i}", command=c) for i, c in enumerate(row["swarl_wrong_commands"]))]


def _check(client: Any, image: str, row: dict[str, Any]) -> list[str]:
    results = run_variants(client, image, row, _variants(row), timeout_s=600)
    iid, problems = row["instance_id"], []
    if GOLD_IDENTICAL not in results["fix_command"][1]:
        problems.append(f"{iid}: swarl_fix_command does not make the gold change:\n{results['fix_command'][1]}")
    if results["inspect"][1] != inspect_output(get_instance(iid)):
        problems.append(f"{iid}: the inspection prints {results['inspect'][1]!r} in the image, "
                        f"the demonstrations show {inspect_output(get_instance(iid))!r}")
    for name, (report, log) in results.items():
        if report is not None and report.resolved != (name == "gold"):
            problems.append(f"{iid} {name}: resolved={report.resolved} error={report.error!r}\n{log[-1200:]}")
    return problems


def _grade(client: Any, rows: list[dict[str, Any]]) -> None:
    from envd.images import build_task_images

    images = build_task_images(client, rows, progress=False)
    with ThreadPoolExecutor(max_workers=2) as pool:
        futures = [pool.submit(_check, client, image, row) for row, image in zip(rows, images, strict=True)]
        problems = [p for f in futures for p in f.result()]
    assert not problems, "\n\n".join(problems)


@pytest.mark.docker
@pytest.mark.timeout(600)
def test_one_instance_per_family_and_split_graded_in_its_image(docker_client: Any) -> None:
    seen, sample = set(), []
    for row in ROWS:
        key = (row["swarl_split"], row["swarl_family"], row["swarl_shape"].split("/")[0])
        if key not in seen:
            seen.add(key)
            sample.append(row)
    _grade(docker_client, sample)


@pytest.mark.docker
@pytest.mark.long
@pytest.mark.timeout(1800)
def test_every_generated_instance_graded_in_its_image(docker_client: Any) -> None:
    _grade(docker_client, ROWS)


def test_edit_reads_line_tells_the_deciding_choice() -> None:
    """On every train-family instance the gold edit searches for text the inspection showed and
    every wrong edit does not; an episode that inspected or edited nothing has no such choice."""
    for inst in instances():
        if inst.family.name not in TRAIN_FAMILIES:
            continue
        gold, wrong = fix_commands(inst)
        for command, reads in [(gold, True), *((w, False) for w in wrong)]:
            messages = [{"role": "system", "content": "sys"}, {"role": "user", "content": "issue"},
                        {"role": "assistant", "content": f"```bash\n{inspect_command(inst)}\n```"},
                        {"role": "user", "content": f"<returncode>0</returncode>\n<output>\n{inspect_output(inst)}</output>"},
                        {"role": "assistant", "content": f"THOUGHT: fix\n```bash\n{command}\n```"}]
            assert edit_reads_line(messages) is reads, (inst.name, command)
            assert edit_reads_line(messages[:4]) is None  # inspected, never edited
            assert edit_reads_line(messages[:2] + messages[4:]) is None  # edited blind


def test_names_function_reads_the_first_reply() -> None:
    """The first reply's first function name against the issue's: a longer number that starts
    with the same digits is another name; no name in the issue or no reply: no answer."""
    inst = next(i for i in instances() if i.split == "heldout")
    n = inst.fn.removeprefix("fn_")
    issue = {"role": "user", "content": f"<pr_description>\n{inst.title}\n</pr_description>"}

    def reply(text: str) -> dict[str, str]:
        return {"role": "assistant", "content": f"THOUGHT: read\n\n```bash\n{text}\n```"}

    later = [{"role": "user", "content": "<output>\n</output>"}, reply(inspect_command(inst))]
    assert names_function([issue, reply(inspect_command(inst))]) is True
    assert names_function([issue, reply(f"grep -rn -A2 'def fn_{n}1(' ."), *later]) is False
    assert names_function([issue, reply("ls"), *later]) is False
    assert names_function([issue]) is None
    assert names_function([{"role": "user", "content": "no name"}, reply(inspect_command(inst))]) is None
