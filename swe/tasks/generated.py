"""Generated task instances where reading decides the edit: the same symptom has two correct
fixes, and which one is right is only in the code the agent inspects.

Each bug family has two *forms* of the same function whose fixes are inverse edit primitives
(`a > b` fixed by ` > ` -> ` >= `; `not b >= a` fixed by ` >= ` -> ` > `), two *layouts*
(`return <expr>`, or `result = <expr>` then `return result`), four issue *wordings* and argument
values drawn per instance. The symptom (the issue text) is the same for both forms, so a
policy that maps the symptom to an edit resolves at most half of a split, whatever edits it
chains (each primitive of a pair sets the line to one form's fix, undoing the other's: the
last one applied wins); reading the line and choosing the primitive whose fragment it holds
resolves all of it. `best_fixed_policy` computes the best symptom -> edits table exactly, by
applying every sequence of primitives and running the tests in process
(tests/swe/test_generated_tasks.py bounds it).

Every instance is a repository of its own (package `lib_<a>`, module `part_<b>.py`, four
functions `fn_<c>` in a drawn order, parameter names and docstrings drawn) and a real
SWE-bench row (base_commit, patch, test_patch, FAIL_TO_PASS / PASS_TO_PASS, eval_script)
graded by its tests in Docker, like the hand-written suite (swe/tasks/tasks.jsonl). The issue
names the function and the symptom, never the file or the line.

Splits (the `swarl_split` field):
- `train`: the train families in the (wording, form, layout) combinations of even parity;
- `heldout`: the same families in the combinations of odd parity — each wording, form and
  layout, and each pair of them, is trained on, but never this combination (and the buggy
  function's number occurs nowhere in training);
- `heldout_family`: `sum_at_least`, whose fix is two primitives (one of `comparison`'s and one
  of `arithmetic`'s) applied in turn: demonstrated separately, never together.

Besides the splits, `practice` and `reading_practice` draw instances for the demo's warm start
only (never graded): the train families' practice, and the reading families (READING_FAMILIES:
other operators, demonstrated with their correct fix).

`python -m swe.tasks.generated` rewrites swe/tasks/generated.jsonl; `--check` exits 1 when
it is stale. The rows are a pure function of GEN_SEED and the tables below.
"""

from __future__ import annotations

import itertools
import json
import os
import random
import re
import sys
import tempfile
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from swe.tasks.generate import dumps, eval_script, sed_command, write_or_check
from swe.tasks.gitrepo import commit_all, diff_after, write_files
from swe.tasks.specs import REPO_PREFIX, task_image_name

GENERATED_JSONL = Path(__file__).resolve().parent / "generated.jsonl"
GEN_SEED = 20261123
SPLITS = ("train", "heldout", "heldout_family")
PER_COMBO = {"train": 3, "heldout": 1, "heldout_family": 1}  # instances per family and combination

# Identifiers are numbered (package lib_<a>, module part_<b>, functions fn_<c>): with digits as
# single tokens the tiny model learns within its warm start to copy a number from what it reads.
# Held-out instances' buggy functions use numbers that occur nowhere in RL's training (train
# split, pool, any filler function) nor, unless practice(names="all"), in the warm start's
# practice instances, so what to type for them has to be read.
_FN_NUMBERS = list(range(10, 100))
HELDOUT_FN_NUMBERS = frozenset(random.Random(GEN_SEED + 1).sample(_FN_NUMBERS, 48))
TRAIN_FN_NUMBERS = tuple(n for n in _FN_NUMBERS if n not in HELDOUT_FN_NUMBERS)
# Which function numbers the warm start's practice instances use (`practice(names=...)`): "train",
# the train split's only; or "all", every two-digit number, a held-out name's too. With the 42
# train numbers alone the tiny model may learn a lookup over their digit pairs instead of copying
# the issue's name, and then types a train name for a held-out one: on the held-out combinations
# the recipe's warm starts of seeds 0-3 typed the issue's name in 0.19-1.00 of their first
# replies (docs/demo.md "Copying a name"). Under "all" the held-out instances' names still occur
# nowhere in RL's training (train split, pool), and practice never shows a held-out instance.
PRACTICE_NAMES = ("train", "all")
ARGS = ("value", "limit", "left", "right", "amount", "extra", "start", "stop", "first", "second",
        "item", "bound")
DOCSTRINGS = ("Return the result for the given inputs.", "Used by the reports.", "Keep this fast.")
LAYOUTS = ("return", "result")  # `return <expr>` | `result = <expr>` + `return result`


@dataclass(frozen=True)
class Primitive:
    """An edit: the first `old` on the line becomes `new` (sed's `s/old/new/`); no-op without it."""

    name: str
    old: str
    new: str

    def apply(self, line: str) -> str:
        return line.replace(self.old, self.new, 1)


PRIMITIVES: dict[str, Primitive] = {p.name: p for p in (
    Primitive("ge", " > ", " >= "), Primitive("gt", " >= ", " > "),
    Primitive("plus_one", " - 1", " + 1"), Primitive("minus_one", " + 1", " - 1"),
    Primitive("plus", " - ", " + "), Primitive("minus", " + ", " - "),
    Primitive("and", " or ", " and "), Primitive("or", " and ", " or "),
)}


@dataclass(frozen=True)
class Form:
    """One way the function is written: its correct expression, the bug, and the primitives
    that turn the bug into the correct expression (in order)."""

    name: str
    good: str            # `{a}`, `{b}`: the parameters
    bad: str
    fix: tuple[str, ...]


@dataclass(frozen=True)
class Family:
    """A kind of bug: two forms with the same symptom, the edits demonstrated for it, the tests
    and the issue's wordings. `args(rng)` draws the values the tests and the issue use."""

    name: str
    params: int
    forms: tuple[Form, Form]
    primitives: tuple[str, ...]   # what the warm start demonstrates for this symptom
    passing: str                  # passes with and without the bug (PASS_TO_PASS)
    failing: str                  # the added test, fails with the bug (FAIL_TO_PASS)
    wordings: tuple[str, ...]     # the issue's first line; `{fn}` and the drawn arguments
    args: Callable[[random.Random], dict[str, Any]]


def _cmp_args(rng: random.Random) -> dict[str, Any]:
    return {"n": rng.randint(1, 9)}


def _range_args(rng: random.Random) -> dict[str, Any]:
    x = rng.randint(1, 5)
    y = x + rng.randint(2, 4)
    return {"x": x, "y": y, "expected": list(range(x, y + 1))}


def _sum_args(rng: random.Random) -> dict[str, Any]:
    x, y = rng.randint(6, 20), rng.randint(1, 5)
    return {"x": x, "y": y, "good": x + y, "bad": x - y}


def _bool_args(rng: random.Random) -> dict[str, Any]:
    p, q = rng.choice([(True, False), (False, True)])
    return {"p": p, "q": q}


def _zero_args(rng: random.Random) -> dict[str, Any]:
    return {"x": rng.randint(2, 9)}


FAMILIES: dict[str, Family] = {f.name: f for f in (
    Family("comparison", 2,
           (Form("gt", "{a} >= {b}", "{a} > {b}", ("ge",)),
            Form("not_ge", "not {b} > {a}", "not {b} >= {a}", ("gt",))),
           ("ge", "gt"),
           "assert {fn}(5, 3) is True\n    assert {fn}(1, 3) is False",
           "assert {fn}({n}, {n}) is True\n    assert {fn}(5, 3) is True\n    assert {fn}(1, 3) is False",
           ("{fn}({n}, {n}) returns False, but equal values should pass",
            "{fn} rejects equal inputs: {fn}({n}, {n}) should be True",
            "Equal arguments fail: {fn}({n}, {n}) gives False, expected True",
            "{fn}({n}, {n}) is False; a value equal to the bound should count"),
           _cmp_args),
    Family("off_by_one", 2,
           (Form("stop", "list(range({a}, {b} + 1))", "list(range({a}, {b} - 1))", ("plus_one",)),
            Form("descending", "sorted(range({b}, {a} - 1, -1))", "sorted(range({b}, {a} + 1, -1))",
                 ("minus_one",))),
           ("plus_one", "minus_one"),
           "assert {fn}(4, 3) == []",
           "assert {fn}({x}, {y}) == {expected}\n    assert {fn}(4, 3) == []",
           ("{fn}({x}, {y}) should return {expected}: both ends are included",
            "{fn}({x}, {y}) returns the wrong list; expected {expected}",
            "Range helper {fn} is off: {fn}({x}, {y}) must give {expected}",
            "{fn}({x}, {y}) does not return {expected}"),
           _range_args),
    Family("arithmetic", 2,
           (Form("minus", "{a} + {b}", "{a} - {b}", ("plus",)),
            Form("negated", "{a} - (-{b})", "{a} + (-{b})", ("minus",))),
           ("plus", "minus"),
           "assert {fn}(4, 0) == 4",
           "assert {fn}({x}, {y}) == {good}\n    assert {fn}(4, 0) == 4",
           ("{fn}({x}, {y}) returns {bad}, expected {good}",
            "{fn} does not add: {fn}({x}, {y}) gives {bad} instead of {good}",
            "Wrong total from {fn}: {fn}({x}, {y}) should be {good}",
            "{fn}({x}, {y}) == {bad}, but the sum is {good}"),
           _sum_args),
    Family("boolean_logic", 2,
           (Form("or", "{a} and {b}", "{a} or {b}", ("and",)),
            Form("de_morgan", "not (not {a} or not {b})", "not (not {a} and not {b})", ("or",))),
           ("and", "or"),
           "assert {fn}(True, True)\n    assert not {fn}(False, False)",
           "assert not {fn}({p}, {q})\n    assert {fn}(True, True)\n    assert not {fn}(False, False)",
           ("{fn}({p}, {q}) returns True, expected False",
            "{fn} should need both: {fn}({p}, {q}) is True",
            "{fn}({p}, {q}) must be False, both conditions are required",
            "One true input is enough for {fn}({p}, {q}), but both should be needed"),
           _bool_args),
    # held out: a fix of two primitives, each demonstrated (with comparison, arithmetic) alone
    Family("sum_at_least", 2,
           (Form("difference", "{a} + {b} >= 0", "{a} - {b} > 0", ("plus", "ge")),
            Form("negated", "not -{a} - {b} > 0", "not -{a} + {b} >= 0", ("minus", "gt"))),
           ("plus", "minus", "ge", "gt"),
           "assert {fn}(5, 1) is True\n    assert {fn}(-9, 1) is False",
           "assert {fn}(-{x}, {x}) is True\n    assert {fn}(5, 1) is True\n    assert {fn}(-9, 1) is False",
           ("{fn}(-{x}, {x}) returns False, but a total of 0 should pass",
            "{fn} rejects a zero sum: {fn}(-{x}, {x}) should be True",
            "A sum of exactly 0 fails in {fn}: {fn}(-{x}, {x}) gives False",
            "{fn}(-{x}, {x}) is False; totals of 0 should count"),
           _zero_args),
)}
# Reading practice: families the warm start demonstrates with their *correct* fix (the edit whose
# pattern is the operator the inspected line holds), so that the policy meets RL already able to
# copy an operator it read; never in a split, the pool or an evaluation. Their operators are none
# of the suite's, so no demonstration shows a train family's answer.
READING_PRIMITIVES: dict[str, Primitive] = {p.name: p for p in (
    Primitive("le", " < ", " <= "), Primitive("lt", " <= ", " < "),
    Primitive("ne", " == ", " != "), Primitive("eq", " != ", " == "),
    Primitive("max", "min(", "max("), Primitive("min", "max(", "min("),
)}


def _pair_args(rng: random.Random) -> dict[str, Any]:
    x = rng.randint(1, 8)
    return {"x": x, "y": x + rng.randint(1, 9)}


READING_FAMILIES: dict[str, Family] = {f.name: f for f in (
    Family("ordering", 2,
           (Form("lt", "{a} <= {b}", "{a} < {b}", ("le",)),
            Form("not_le", "not {b} < {a}", "not {b} <= {a}", ("lt",))),
           ("le", "lt"),
           "assert {fn}(1, 3) is True\n    assert {fn}(5, 3) is False",
           "assert {fn}({n}, {n}) is True\n    assert {fn}(1, 3) is True\n    assert {fn}(5, 3) is False",
           ("{fn}({n}, {n}) returns False, but the limit itself is allowed",
            "{fn} refuses a value at its limit: {fn}({n}, {n}) should be True",
            "At the bound, {fn}({n}, {n}) gives False instead of True",
            "{fn}({n}, {n}) is False; reaching the limit should be fine"),
           _cmp_args),
    Family("equality", 2,
           (Form("eq", "{a} != {b}", "{a} == {b}", ("ne",)),
            Form("not_ne", "not {a} == {b}", "not {a} != {b}", ("eq",))),
           ("ne", "eq"),
           "assert {fn}(2, 2) is False",
           "assert {fn}({x}, {y}) is True\n    assert {fn}(2, 2) is False",
           ("{fn}({x}, {y}) returns False, but the values differ",
            "{fn} misses a change: {fn}({x}, {y}) should be True",
            "Different inputs look equal to {fn}: {fn}({x}, {y}) gives False",
            "{fn}({x}, {y}) is False; it should report that they differ"),
           _pair_args),
    Family("larger", 2,
           (Form("min", "max({a}, {b})", "min({a}, {b})", ("max",)),
            Form("negated", "-min(-{a}, -{b})", "-max(-{a}, -{b})", ("min",))),
           ("max", "min"),
           "assert {fn}(3, 3) == 3",
           "assert {fn}({x}, {y}) == {y}\n    assert {fn}({y}, {x}) == {y}\n    assert {fn}(3, 3) == 3",
           ("{fn}({x}, {y}) returns {x}, expected the larger value {y}",
            "{fn} picks the smaller one: {fn}({x}, {y}) should be {y}",
            "Wrong pick from {fn}: {fn}({x}, {y}) gives {x}, not {y}",
            "{fn}({x}, {y}) == {x}, but the larger of the two is {y}"),
           _pair_args),
)}
_ALL_PRIMITIVES = {**PRIMITIVES, **READING_PRIMITIVES}
TRAIN_FAMILIES = ("comparison", "off_by_one", "arithmetic", "boolean_logic")
HELDOUT_FAMILIES = ("sum_at_least",)
# (wording, form, layout): train has the even-parity combinations, heldout the odd ones
COMBOS = tuple(itertools.product(range(4), range(2), range(2)))
SPLIT_COMBOS = {"train": tuple(c for c in COMBOS if sum(c) % 2 == 0),
                "heldout": tuple(c for c in COMBOS if sum(c) % 2 == 1),
                "heldout_family": COMBOS}


@dataclass(frozen=True)
class Instance:
    """One generated task: its repository (correct files), the bug and where it lives."""

    name: str                     # repository name, also the instance's
    split: str
    family: Family
    form: Form
    layout: str
    wording: int
    files: dict[str, str]         # the correct repository
    path: str                     # the module the bug lives in
    lineno: int                   # 1-based line of the bug
    good_line: str                # the line, correct
    bad_line: str                 # the line with the bug
    fn: str                       # the buggy function
    test_path: str
    passing_tests: str            # the test file's source (PASS_TO_PASS)
    failing_test: str             # the added test's source
    title: str
    demo_edit: int = 0            # practice instances: which of the family's primitives to demonstrate

    @property
    def instance_id(self) -> str:
        return f"{REPO_PREFIX}__{self.name}"

    @property
    def shape(self) -> str:
        """The code shape: form and layout (what the inspection shows that the issue does not)."""
        return f"{self.form.name}/{self.layout}"

    @property
    def symptom(self) -> tuple[str, int]:
        """What the issue text says, less the function's name and the argument values."""
        return self.family.name, self.wording


def _function(rng: random.Random, fam: Family, form: Form, layout: str, fn: str
              ) -> tuple[list[str], int, str, str]:
    """Source lines of one (correct) function, the 0-based index of its target line, and that
    line correct and with the bug."""
    names = rng.sample(ARGS, 2)
    sub = {"a": names[0], "b": names[1]}
    lines = [f"def {fn}({', '.join(names[: fam.params])}):"]
    if rng.random() < 0.5:
        lines.append(f'    """{rng.choice(DOCSTRINGS)}"""')
    lead = "    return " if layout == "return" else "    result = "
    good, bad = lead + form.good.format(**sub), lead + form.bad.format(**sub)
    target = len(lines)
    lines.append(good)
    if layout == "result":
        lines.append("    return result")
    return lines, target, good, bad


def _instance(rng: random.Random, split: str, fam: Family, combo: tuple[int, int, int], index: int,
              used: set[str], demo_edit: int = 0, prefix: str = "", every_number: bool = False) -> Instance:
    """`used`: module paths and (buggy function, family) pairs taken; updated with this
    instance's. Held-out instances' buggy functions are also unique among themselves.
    `prefix`: the instance is named `<prefix><index>` (the pool's: never a suite row's name).
    `every_number`: function numbers from all of 10-99 (practice instances only)."""
    held = split.startswith("heldout")
    while True:
        pkg, mod = f"lib_{rng.randint(10, 99)}", f"part_{rng.randint(10, 99)}"
        if every_number and not held:
            target, *others = rng.sample(_FN_NUMBERS, 4)
        else:
            target = rng.choice(sorted(HELDOUT_FN_NUMBERS)) if held else rng.choice(TRAIN_FN_NUMBERS)
            others = rng.sample([n for n in TRAIN_FN_NUMBERS if n != target], 3)
        fns = [f"fn_{n}" for n in (target, *others)]
        path = f"{pkg}/{mod}.py"
        key = fns[0] if held else f"{fns[0]}:{fam.name}"
        if path not in used and key not in used:
            used.update((path, key))
            break
    wording, form_i, layout_i = combo
    form, layout = fam.forms[form_i], LAYOUTS[layout_i]
    name = f"{prefix}{index}" if prefix else f"{pkg}-{mod}-{index}".replace("_", "")
    target_fn = fns[0]
    fillers = [FAMILIES[f] for f in rng.sample(TRAIN_FAMILIES, 3)]
    order: list[tuple[Family, str]] = [(fam, target_fn), *zip(fillers, fns[1:], strict=True)]
    rng.shuffle(order)
    src = ['"""Helpers of the ' + pkg + ' package."""', ""]
    lineno, good_line, bad_line = 0, "", ""
    tests = [f"from {pkg}.{mod} import {', '.join(sorted(fns))}", ""]
    for f, fn in order:
        if fn == target_fn:
            lines, target, good_line, bad_line = _function(rng, f, form, layout, fn)
        else:  # a correct filler, of any form and layout
            lines, target, _, _ = _function(rng, f, rng.choice(f.forms), rng.choice(LAYOUTS), fn)
        pre, post = ([""], [""]) if src[-1] != "" else ([], ["", ""])
        if fn == target_fn:
            lineno = len(src) + len(pre) + target + 1
        src += [*pre, *lines, *post]
        tests += ["", f"def test_{fn}():", "    " + f.passing.format(fn=fn), ""]
    args = fam.args(rng)
    path = f"{pkg}/{mod}.py"
    test_path = f"tests/test_{mod}.py"
    test_src = "\n".join(tests).rstrip("\n") + "\n"
    files = {
        "README.md": f"# {pkg}\n\nSmall helpers. Run the tests with `python3 -m pytest`.\n",
        f"{pkg}/__init__.py": "",
        path: "\n".join(src).rstrip("\n") + "\n",
        "tests/__init__.py": "",
        test_path: test_src,
    }
    failing = f"def test_{target_fn}_issue():\n    " + fam.failing.format(fn=target_fn, **args) + "\n"
    return Instance(name, split, fam, form, layout, wording, files, path, lineno, good_line, bad_line,
                    target_fn, test_path, test_src, failing, fam.wordings[wording].format(fn=target_fn, **args),
                    demo_edit)


@lru_cache(maxsize=1)
def instances() -> tuple[Instance, ...]:
    """Per split and family, PER_COMBO rounds over the split's combinations (so the first
    len(combos) instances of a family are one of each: balanced forms for `--eval-per-family`)."""
    rng = random.Random(GEN_SEED)
    used: set[str] = set()
    out: list[Instance] = []
    for split, fams in (("train", TRAIN_FAMILIES), ("heldout", TRAIN_FAMILIES), ("heldout_family", HELDOUT_FAMILIES)):
        for fam in fams:
            for _ in range(PER_COMBO[split]):
                for combo in SPLIT_COMBOS[split]:
                    out.append(_instance(rng, split, FAMILIES[fam], combo, len(out) + 1, used))
    return tuple(out)


def _train_like(n: int, stream: str, split: str, prefix: str = "", every_number: bool = False,
                families: tuple[Family, ...] | None = None, combos: tuple[tuple[int, int, int], ...] | None = None
                ) -> list[Instance]:
    """`n` instances of `families` (default: the train families) in `combos` (default: the train
    combinations) drawn from `stream`: the k-th of a family has combination k mod len(combos) and
    `demo_edit` (k div len(combos)) mod 2. No path of the held-out splits occurs in them, nor a
    held-out function number (buggy or filler) unless `every_number`."""
    fams = families or tuple(FAMILIES[f] for f in TRAIN_FAMILIES)
    combos = combos or SPLIT_COMBOS["train"]
    held = {i.path for i in instances() if i.split != "train"}
    rng = random.Random(stream)
    out = []
    for k in range(n):
        fam = fams[k % len(fams)]
        j = k // len(fams)
        out.append(_instance(rng, split, fam, combos[j % len(combos)], k + 1, set(held),
                             demo_edit=(j // len(combos)) % len(fam.primitives), prefix=prefix,
                             every_number=every_number))
    return out


def _practice_names(names: str) -> bool:
    """Whether practice instances number their functions from every two-digit number."""
    if names not in PRACTICE_NAMES:
        raise ValueError(f"practice names: one of {', '.join(PRACTICE_NAMES)}, got {names!r}")
    return names == "all"


def practice(n: int, seed: int = 0, names: str = "train") -> list[Instance]:
    """`n` more instances of the train families in the train combinations, for the warm start's
    demonstrations (no images: a demonstration's observations are computed); no path of the
    held-out splits occurs in them, and their function numbers are the train split's (`names`
    "train") or any two-digit number ("all": copying a name is then shown on held-out names
    too, none of them a held-out instance's function). The k-th instance of a family has
    combination k mod 8 and `demo_edit` (k div 8) mod 2: over every 16 of a family, each
    (combination, demonstrated primitive) pair once — the edit shown is independent of the code."""
    return _train_like(n, f"practice-{seed}", "practice", every_number=_practice_names(names))


def reading_practice(n: int, seed: int = 0, names: str = "train") -> list[Instance]:
    """`n` instances of the reading families (READING_FAMILIES) in every combination, for
    demonstrations of their correct fix (their `demo_edit` is not used); like `practice`, no
    held-out path, and function numbers by `names`. The k-th is family k mod 3, combination
    (k div 3) mod 16."""
    return _train_like(n, f"reading-{seed}", "practice", prefix="reading", every_number=_practice_names(names),
                       families=tuple(READING_FAMILIES.values()), combos=COMBOS)


POOL_SPLIT = "pool"
POOL_PREFIX = "pool"


@lru_cache(maxsize=4)
def pool(n: int, seed: int = 0) -> tuple[Instance, ...]:
    """RL's train pool (`swarl demo --train-pool n`): `n` fresh instances drawn like the train
    split — the train families in the train combinations, no held-out path or function number —
    from a stream of their own (`pool-<seed>`, not the warm start's `practice-<seed>`), named
    `pool<seed>-<k>` (instance_id `swarl-tasks__pool<seed>-<k>`, image
    `swarl/task.pool<seed>-<k>`). A prefix of a longer pool: pool(n)[:k] == pool(k). Rows
    (`pool_rows`) are real SWE rows graded by their tests in their own image, like the train
    split's; with the k-th of a family in combination k mod 8, consecutive rows of a family and
    wording come in both forms (`form_pairs` pairs them)."""
    return tuple(_train_like(n, f"pool-{seed}", POOL_SPLIT, prefix=f"{POOL_PREFIX}{seed}-"))


def pool_instance(instance_id: str) -> Instance | None:
    """The pool instance an id names (`swarl-tasks__pool<seed>-<k>`), or None for another id."""
    m = re.fullmatch(rf"{re.escape(REPO_PREFIX)}__{POOL_PREFIX}(\d+)-(\d+)", instance_id)
    if m is None:
        return None
    seed, k = int(m.group(1)), int(m.group(2))
    if k < 1:
        return None
    return pool(_pool_size(k), seed)[k - 1]


def _pool_size(k: int) -> int:
    """A pool long enough to hold the k-th instance, rounded up so lookups share a cached pool."""
    return max(1024, 1 << (k - 1).bit_length())


def demo_row(inst: Instance) -> dict[str, Any]:
    """What a demonstration needs of an instance (a row without the git work of build_row)."""
    gold, wrong = fix_commands(inst)
    return {"instance_id": inst.instance_id, "problem_statement": _statement(inst), "swarl_family": inst.family.name,
            "swarl_split": inst.split, "swarl_suite": "generated", "swarl_inspect_command": inspect_command(inst),
            "swarl_fix_command": gold, "swarl_wrong_commands": wrong, "swarl_shape": inst.shape,
            "swarl_wording": inst.wording, "swarl_edit_commands": edit_commands(inst),
            "swarl_demo_edit": inst.demo_edit, "swarl_demo_correct": inst.family.name in READING_FAMILIES}


def _statement(inst: Instance) -> str:
    return f"{inst.title}\n\nSeen in `{inst.fn}`; the other helpers are fine.\n"


def buggy(inst: Instance) -> dict[str, str]:
    """The repository at the base commit: the bug on its line."""
    files = dict(inst.files)
    lines = files[inst.path].split("\n")
    if lines[inst.lineno - 1] != inst.good_line:
        raise ValueError(f"{inst.name}: line {inst.lineno} is {lines[inst.lineno - 1]!r}, not the target")
    lines[inst.lineno - 1] = inst.bad_line
    files[inst.path] = "\n".join(lines)
    return files


def inspect_command(inst: Instance) -> str:
    """The inspection that reveals where the bug lives (path and line) and its form."""
    return f"grep -rn -A2 'def {inst.fn}(' ."


def inspect_output(inst: Instance) -> str:
    """What `inspect_command` prints at the base commit (GNU grep's -n/-A format)."""
    lines = buggy(inst)[inst.path].split("\n")
    start = next(i for i, line in enumerate(lines) if line.startswith(f"def {inst.fn}("))
    out = [f"./{inst.path}:{start + 1}:{lines[start]}"]
    for j in range(start + 1, min(start + 3, len(lines) - 1 if lines[-1] == "" else len(lines))):
        out.append(f"./{inst.path}-{j + 1}-{lines[j]}")
    return "\n".join(out) + "\n"


_SHOWN_LINE = re.compile(r"^\S+-\d+-(.*)$", re.M)  # grep -A's context lines: ./path-N-text
_SED_PATTERN = re.compile(r"sed -i '(?:\d+)?s/((?:[^/\\]|\\.)*)/")


def edit_reads_line(messages: list[dict[str, Any]]) -> bool | None:
    """Whether an episode's first `sed` edit searches for text that its first inspection showed
    in the function's body: the one choice that decides this suite's outcome (each family's
    primitives are inverses, and only the one whose pattern is on the buggy line changes it).
    None when the episode inspected nothing or never edited with `sed -i '[N]s/OLD/NEW/'`."""
    body: list[str] | None = None
    for m in messages:
        text = str(m.get("content", ""))
        if m.get("role") == "user" and body is None and "<output>" in text:
            body = _SHOWN_LINE.findall(text.split("<output>", 1)[1])
        elif m.get("role") == "assistant" and (s := _SED_PATTERN.search(text)):
            if not body:
                return None
            pattern = re.sub(r"\\(.)", r"\1", s.group(1))
            return bool(pattern) and any(pattern in line for line in body)
    return None


_FN_NAME = re.compile(r"\bfn_\d+\b")


def names_function(messages: list[dict[str, Any]]) -> bool | None:
    """Whether an episode's first reply types the function the issue names (the first `fn_<N>` of
    each: the issue names only the buggy one): the name copied, which inspecting it takes — on a
    held-out instance a name RL never trained on. None without a name in the issue or a reply;
    False for a reply that names no function."""
    issue = next((str(m.get("content", "")) for m in messages if m.get("role") == "user"), "")
    reply = next((str(m.get("content", "")) for m in messages if m.get("role") == "assistant"), None)
    if reply is None or (want := _FN_NAME.search(issue)) is None:
        return None
    typed = _FN_NAME.search(reply)
    return typed is not None and typed.group(0) == want.group(0)


def _sed(inst: Instance, prim: Primitive) -> str:
    where = f"$(grep -rl 'def {inst.fn}(' .)"
    return sed_command("FILE", inst.lineno, prim.old, prim.new).removesuffix(" FILE") + " " + where


def edit_commands(inst: Instance) -> dict[str, str]:
    """The family's primitives as `sed -i` commands on the line the inspection printed, in the
    file that defines the function (found by grep, not typed)."""
    return {p: _sed(inst, _ALL_PRIMITIVES[p]) for p in inst.family.primitives}


def fix_commands(inst: Instance) -> tuple[str, list[str]]:
    """(the gold fix: the form's primitives in turn; the wrong fixes: the family's other
    primitives, and for a two-primitive fix each of its primitives alone)."""
    gold = " && ".join(_sed(inst, _ALL_PRIMITIVES[p]) for p in inst.form.fix)
    wrong = [p for p in inst.family.primitives if p not in inst.form.fix]
    if len(inst.form.fix) > 1:
        wrong = [*inst.form.fix, *wrong]
    return gold, [_sed(inst, _ALL_PRIMITIVES[p]) for p in wrong]


# -- what a fixed symptom -> edit table can score (exact) ------------------------------------

def apply_edits(line: str, edits: Iterable[str]) -> str:
    for e in edits:
        line = _ALL_PRIMITIVES[e].apply(line)
    return line


def resolves(inst: Instance, line: str) -> bool:
    """Whether the repository with its target line replaced by `line` passes the instance's
    tests (the passing ones and the added one), run in process: the module and the tests are
    our own generated code."""
    lines = inst.files[inst.path].split("\n")
    lines[inst.lineno - 1] = line
    ns: dict[str, Any] = {}
    tests = "\n".join(x for x in inst.passing_tests.splitlines() if not x.startswith("from "))
    try:
        exec(compile("\n".join(lines), inst.path, "exec"), ns)  # generated code, ours
        exec(compile(tests + "\n\n" + inst.failing_test, inst.test_path, "exec"), ns)
        for name in [k for k in ns if k.startswith("test_")]:
            ns[name]()
    except Exception:  # an assertion, or an edit that broke the code
        return False
    return True


def edit_sequences(max_len: int) -> list[tuple[str, ...]]:
    """Every sequence of at most `max_len` primitives (the empty one included)."""
    return [s for n in range(max_len + 1) for s in itertools.product(PRIMITIVES, repeat=n)]


def best_fixed_policy(insts: Iterable[Instance], max_edits: int = 2,
                      key: Callable[[Instance], Any] = lambda i: i.symptom) -> dict[str, Any]:
    """The best policy that maps the symptom (`key`: by default family and wording) to one
    sequence of at most `max_edits` primitives on the buggy line, whatever the code: its
    resolve rate over `insts`, computed exactly (every sequence applied and tested)."""
    seqs = edit_sequences(max_edits)
    wins: dict[Any, Counter[tuple[str, ...]]] = defaultdict(Counter)
    n = 0
    for inst in insts:
        n += 1
        outcome: dict[str, bool] = {}
        for s in seqs:
            line = apply_edits(inst.bad_line, s)
            if line not in outcome:
                outcome[line] = resolves(inst, line)
            wins[key(inst)][s] += int(outcome[line])
    resolved = sum(max(c.values(), default=0) for c in wins.values())
    return {"rate": resolved / max(1, n), "instances": n, "keys": len(wins),
            "table": {str(k): max(c, key=lambda s: c[s]) if c else () for k, c in wins.items()}}


def build_row(inst: Instance) -> dict[str, Any]:
    files = buggy(inst)
    new_tests = files[inst.test_path] + "\n\n" + inst.failing_test
    with tempfile.TemporaryDirectory(prefix="swarl-gen-") as tmp:
        root = Path(tmp)
        write_files(root, files)
        base_commit = commit_all(root)
        patch = diff_after(root, {inst.path: inst.files[inst.path]})
        test_patch = diff_after(root, {inst.test_path: new_tests})
    tests = [line[4:].split("(")[0] for line in new_tests.splitlines() if line.startswith("def test_")]
    failing = f"test_{inst.fn}_issue"
    gold, wrong = fix_commands(inst)
    return {
        "repo": f"{REPO_PREFIX}/{inst.name}",
        "instance_id": inst.instance_id,
        "base_commit": base_commit,
        "patch": patch,
        "test_patch": test_patch,
        "problem_statement": _statement(inst),
        "hints_text": "",
        "created_at": "2024-06-01T09:00:00Z",
        "version": "1.0",
        "FAIL_TO_PASS": json.dumps([f"{inst.test_path}::{failing}"]),
        "PASS_TO_PASS": json.dumps([f"{inst.test_path}::{t}" for t in tests if t != failing]),
        "environment_setup_commit": base_commit,
        "eval_script": eval_script(base_commit, test_patch, [inst.test_path]),
        "image_name": task_image_name(inst.instance_id),
        "log_parser": "pytest",
        "dataset_family": "swarl",
        "swarl_family": inst.family.name,
        "swarl_split": inst.split,
        "swarl_suite": "generated",
        "swarl_shape": inst.shape,
        "swarl_wording": inst.wording,
        "swarl_inspect_command": inspect_command(inst),
        "swarl_fix_command": gold,
        "swarl_wrong_commands": wrong,
        "swarl_edit_commands": edit_commands(inst),
    }


def pool_rows(n: int, seed: int = 0, cache_dir: Path | None = None) -> list[dict[str, Any]]:
    """The rows of pool(n, seed) (`build_row`: git work, ~0.1 s a row). With `cache_dir` they are
    kept in `<cache_dir>/pool<seed>-<hash>.jsonl`, `<hash>` of the sources that write a row, and
    a longer pool extends the file (a pool's rows are a prefix of a longer one's)."""
    if cache_dir is None:
        return [build_row(i) for i in pool(n, seed)]
    import hashlib

    from swe.tasks import generate as gen_mod
    from swe.tasks import gitrepo

    h = hashlib.sha256()
    for mod in (sys.modules[__name__], gen_mod, gitrepo):
        h.update(Path(str(mod.__file__)).read_bytes())
    path = Path(cache_dir) / f"{POOL_PREFIX}{seed}-{h.hexdigest()[:16]}.jsonl"
    rows = [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.is_file() else []
    if len(rows) < n:
        rows += [build_row(i) for i in pool(n, seed)[len(rows):]]
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        tmp.write_text("".join(json.dumps(r) + "\n" for r in rows))
        tmp.replace(path)
    return rows[:n]


def generate() -> list[dict[str, Any]]:
    return [build_row(i) for i in instances()]


def form_pairs(rows: Iterable[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """The rows in the units to train together: each generated row with a row of its family and
    wording in the other form — the same issue text, the inverse fix — the k-th of one form with
    the k-th of the other, in the rows' order; a row without a partner (another suite, a form
    left over) is a unit alone. A policy that does not read resolves exactly one of a pair."""
    units: list[list[dict[str, Any]]] = []
    waiting: dict[tuple[str, int, str], list[int]] = defaultdict(list)  # (family, wording, form) -> units
    for row in rows:
        fam, shape = row.get("swarl_family"), str(row.get("swarl_shape", ""))
        if fam not in FAMILIES or "swarl_wording" not in row:
            units.append([row])
            continue
        form, wording = shape.split("/")[0], int(row["swarl_wording"])
        other = next((f.name for f in FAMILIES[fam].forms if f.name != form), None)
        partner = waiting[(fam, wording, other)] if other else []
        if partner:
            units[partner.pop(0)].append(row)
        else:
            waiting[(fam, wording, form)].append(len(units))
            units.append([row])
    return units


def instance_files(instance_id: str) -> dict[str, str] | None:
    """The files of a generated instance (the suite's or the pool's) at its base commit, or None
    for another id."""
    inst = _find(instance_id)
    return None if inst is None else buggy(inst)


def get_instance(instance_id: str) -> Instance:
    inst = _find(instance_id)
    if inst is None:
        raise KeyError(f"instance_id: no generated task {instance_id!r}")
    return inst


def _find(instance_id: str) -> Instance | None:
    for inst in instances():
        if inst.instance_id == instance_id:
            return inst
    return pool_instance(instance_id)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    return write_or_check(GENERATED_JSONL, dumps(generate()), "--check" in args, "swe.tasks.generated")


if __name__ == "__main__":
    raise SystemExit(main())
