"""Generated task instances that must be read: many per bug family, each in a repository of its
own, with package, module, function and variable names and line numbers drawn per instance.

No command can be memorised: the path and the line of the bug appear only in what the
repository shows when it is inspected (`grep -rn -A2 'def <name>(' .`), and the issue names
only the function and its symptom. Every instance is a real SWE-bench row (base_commit,
patch, test_patch, FAIL_TO_PASS / PASS_TO_PASS, eval_script) graded by its tests in Docker,
like the hand-written suite (envd/tasks/tasks.jsonl).

Splits (the `swarl_split` field):
- `train`: the train bug families in repositories named from the train vocabulary;
- `heldout`: the same families in repositories named from a vocabulary training never sees;
- `heldout_family`: bug families training never sees, in held-out-vocabulary repositories.

`python -m envd.tasks.generated` rewrites envd/tasks/generated.jsonl; `--check` exits 1 when
it is stale. The rows are a pure function of GEN_SEED and the tables below.
"""

from __future__ import annotations

import json
import random
import sys
import tempfile
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from envd.tasks.generate import dumps, eval_script, sed_command, write_or_check
from envd.tasks.gitrepo import commit_all, diff_after, write_files
from envd.tasks.specs import REPO_PREFIX, task_image_name

GENERATED_JSONL = Path(__file__).resolve().parent / "generated.jsonl"
GEN_SEED = 20261123
SPLITS = ("train", "heldout", "heldout_family")
COUNTS = {"train": 24, "heldout": 6, "heldout_family": 8}  # instances per family in each split

# Identifiers are numbered (package lib_<a>, module part_<b>, functions fn_<c>): with digits as
# single tokens the tiny model learns within its warm start to copy a number from what it reads;
# (with an earlier tokenizer) it did not learn to copy words or paths (docs/demo.md).
# Function numbers are split: held-out instances' buggy functions use numbers that occur nowhere
# in training (train split, practice instances, any filler function), so what to type for them
# has to be read.
_FN_NUMBERS = list(range(10, 100))
HELDOUT_FN_NUMBERS = frozenset(random.Random(GEN_SEED + 1).sample(_FN_NUMBERS, 40))
TRAIN_FN_NUMBERS = tuple(n for n in _FN_NUMBERS if n not in HELDOUT_FN_NUMBERS)
ARGS = ("value", "limit", "left", "right", "amount", "extra", "start", "stop", "first", "second",
        "item", "bound")


@dataclass(frozen=True)
class Family:
    """A kind of bug: the correct function, the fragment the bug swaps on one line, plausible
    wrong replacements, the added tests and the issue's title."""

    name: str
    params: int               # how many parameters the function takes (named from ARGS)
    body: tuple[str, ...]     # correct body lines; `{a}`, `{b}` are the parameters
    good: str                 # fragment of the target line (in the correct code)
    bad: str                  # what the bug puts in its place
    wrong: tuple[str, str]    # plausible wrong fixes (what an agent might put in place of `bad`)
    passing: str              # a test that passes with and without the bug (PASS_TO_PASS)
    failing: str              # the added test that fails with the bug (FAIL_TO_PASS)
    title: str                # the first line (the symptom)


FAMILIES: dict[str, Family] = {f.name: f for f in (
    Family("comparison_operator", 2, ("return {a} >= {b}",), " >= ", " > ", (" < ", " == "),
           "assert {fn}(5, 3) is True\n    assert {fn}(1, 3) is False",
           "assert {fn}(3, 3) is True\n    assert {fn}(5, 3) is True\n    assert {fn}(1, 3) is False",
           "{fn}(3, 3) returns False, but equal values should pass"),
    Family("off_by_one", 2, ("return list(range({a}, {b} + 1))",), "{b} + 1))", "{b}))",
           ("{b} - 1))", "{b} + 2))"),
           "assert {fn}(4, 3) == []",
           "assert {fn}(1, 3) == [1, 2, 3]\n    assert {fn}(2, 2) == [2]",
           "{fn}(1, 3) leaves out 3, the end should be included"),
    Family("arithmetic_operator", 2, ("return {a} + {b}",), " + ", " - ", (" * ", " % "),
           "assert {fn}(4, 0) == 4",
           "assert {fn}(10, 5) == 15\n    assert {fn}(2, 3) == 5",
           "{fn}(10, 5) returns 5, expected 15"),
    Family("boolean_logic", 2, ("return {a} and {b}",), " and ", " or ", (" is ", " == "),
           "assert {fn}(True, True) is True",
           "assert {fn}(True, False) is False\n    assert {fn}(False, False) is False\n"
           "    assert {fn}(True, True) is True",
           "{fn}(True, False) returns True, expected False"),
    # held-out families: never in training
    Family("none_handling", 1, ("if {a} is None:", "    return -1", "return {a}"), "{a} is None:", "not {a}:",
           ("{a} == 0:", "{a}:"),
           "assert {fn}(None) == -1\n    assert {fn}(7) == 7",
           "assert {fn}(0) == 0\n    assert {fn}(None) == -1\n    assert {fn}(7) == 7",
           "{fn}(0) returns -1 instead of 0"),
    Family("wrong_builtin", 2, ("return max({a}, {b})",), "max(", "min(", ("abs(", "sum("),
           "assert {fn}(4, 4) == 4",
           "assert {fn}(2, 7) == 7\n    assert {fn}(9, 1) == 9",
           "{fn}(2, 7) returns 2, expected 7"),
)}
TRAIN_FAMILIES = ("comparison_operator", "off_by_one", "arithmetic_operator", "boolean_logic")
HELDOUT_FAMILIES = ("none_handling", "wrong_builtin")
DOCSTRINGS = ("Return the result for the given inputs.", "Used by the reports.", "Keep this fast.")


@dataclass(frozen=True)
class Instance:
    """One generated task: its repository (correct files), the bug and where it lives."""

    name: str                     # repository name, also the instance's
    split: str
    family: Family
    files: dict[str, str]         # the correct repository
    path: str                     # the module the bug lives in
    lineno: int                   # 1-based line of the bug
    fn: str                       # the buggy function
    test_path: str
    failing_test: str             # the added test's source
    title: str

    @property
    def instance_id(self) -> str:
        return f"{REPO_PREFIX}__{self.name}"


def _function(rng: random.Random, fam: Family, fn: str) -> tuple[list[str], int, dict[str, str]]:
    """Source lines of one function and the 0-based index of its target line."""
    names = rng.sample(ARGS, 2)
    sub = {"a": names[0], "b": names[1]}
    params = ", ".join(names[: fam.params])
    lines = [f"def {fn}({params}):"]
    if rng.random() < 0.5:
        lines.append(f'    """{rng.choice(DOCSTRINGS)}"""')
    target = -1
    good = fam.good.format(**sub)
    for line in fam.body:
        text = "    " + line.format(**sub)
        if target < 0 and good in text:
            target = len(lines)
        lines.append(text)
    assert target >= 0, fam.name
    return lines, target, sub


def _instance(rng: random.Random, split: str, fam: Family, index: int, used: set[str]) -> Instance:
    """`used`: module paths and (buggy function, family) pairs taken; updated with this
    instance's. Held-out instances' buggy functions are also unique among themselves."""
    held = split.startswith("heldout")
    while True:
        pkg, mod = f"lib_{rng.randint(10, 99)}", f"part_{rng.randint(10, 99)}"
        target = rng.choice(sorted(HELDOUT_FN_NUMBERS)) if held else rng.choice(TRAIN_FN_NUMBERS)
        others = rng.sample([n for n in TRAIN_FN_NUMBERS if n != target], 3)
        fns = [f"fn_{n}" for n in (target, *others)]
        path = f"{pkg}/{mod}.py"
        key = fns[0] if held else f"{fns[0]}:{fam.name}"
        if path not in used and key not in used:
            used.update((path, key))
            break
    name = f"{pkg}-{mod}-{index}".replace("_", "")
    target_fn = fns[0]
    fillers = [FAMILIES[f] for f in rng.sample(TRAIN_FAMILIES, 3)]
    order: list[tuple[Family, str]] = [(fam, target_fn), *zip(fillers, fns[1:], strict=True)]
    rng.shuffle(order)
    src = ['"""Helpers of the ' + pkg + ' package."""', ""]
    lineno = 0
    tests = [f"from {pkg}.{mod} import {', '.join(sorted(fns))}", ""]
    for f, fn in order:
        lines, target, _ = _function(rng, f, fn)
        if fn == target_fn:
            lineno = len(src) + target + 1
        src += ["", *lines, ""] if src[-1] != "" else [*lines, "", ""]
        tests += ["", f"def test_{fn}():", "    " + f.passing.format(fn=fn), ""]
    path = f"{pkg}/{mod}.py"
    test_path = f"tests/test_{mod}.py"
    files = {
        "README.md": f"# {pkg}\n\nSmall helpers. Run the tests with `python3 -m pytest`.\n",
        f"{pkg}/__init__.py": "",
        path: "\n".join(src).rstrip("\n") + "\n",
        "tests/__init__.py": "",
        test_path: "\n".join(tests).rstrip("\n") + "\n",
    }
    failing = f"def test_{target_fn}_issue():\n    " + fam.failing.format(fn=target_fn) + "\n"
    return Instance(name, split, fam, files, path, lineno, target_fn, test_path, failing,
                    fam.title.format(fn=target_fn))


@lru_cache(maxsize=1)
def instances() -> tuple[Instance, ...]:
    rng = random.Random(GEN_SEED)
    used: set[str] = set()
    out: list[Instance] = []
    for split, fams in (("train", TRAIN_FAMILIES), ("heldout", TRAIN_FAMILIES), ("heldout_family", HELDOUT_FAMILIES)):
        for fam in fams:
            for _ in range(COUNTS[split]):
                out.append(_instance(rng, split, FAMILIES[fam], len(out) + 1, used))
    return tuple(out)


def practice(n: int, seed: int = 0) -> list[Instance]:
    """`n` more instances of the train families, drawn like the train split, for the warm
    start's demonstrations: no images (a demonstration's observations are computed), and no
    path or function name of the held-out splits occurs in them."""
    held = {i.path for i in instances() if i.split != "train"}
    rng = random.Random(f"practice-{seed}")
    return [_instance(rng, "practice", FAMILIES[TRAIN_FAMILIES[k % len(TRAIN_FAMILIES)]], k + 1, set(held))
            for k in range(n)]


def demo_row(inst: Instance) -> dict[str, Any]:
    """What a demonstration needs of an instance (a row without the git work of build_row)."""
    gold, wrong = fix_commands(inst)
    return {"instance_id": inst.instance_id, "problem_statement": _statement(inst), "swarl_family": inst.family.name,
            "swarl_split": inst.split, "swarl_suite": "generated", "swarl_inspect_command": inspect_command(inst),
            "swarl_fix_command": gold, "swarl_wrong_commands": wrong}


def _statement(inst: Instance) -> str:
    return f"{inst.title}\n\nSeen in `{inst.fn}`; the other helpers are fine.\n"


def _swap(line: str, old: str, new: str, where: str) -> str:
    if line.count(old) != 1:
        raise ValueError(f"{where}: fragment {old!r} must occur once on {line!r}")
    return line.replace(old, new)


def buggy(inst: Instance) -> dict[str, str]:
    """The repository at the base commit: the bug injected on its line."""
    files = dict(inst.files)
    lines = files[inst.path].split("\n")
    sub = _subs(inst)
    lines[inst.lineno - 1] = _swap(lines[inst.lineno - 1], inst.family.good.format(**sub),
                                   inst.family.bad.format(**sub), inst.name)
    files[inst.path] = "\n".join(lines)
    return files


def _subs(inst: Instance) -> dict[str, str]:
    """The target function's parameter names (read back from its def line)."""
    src = inst.files[inst.path].split("\n")
    start = next(i for i, line in enumerate(src) if line.startswith(f"def {inst.fn}("))
    params = src[start][len(f"def {inst.fn}("):-2].split(", ")
    return {"a": params[0], "b": params[1] if len(params) > 1 else ""}


def inspect_command(inst: Instance) -> str:
    """The inspection that reveals where the bug lives (path and line)."""
    return f"grep -rn -A2 'def {inst.fn}(' ."


def inspect_output(inst: Instance) -> str:
    """What `inspect_command` prints at the base commit (GNU grep's -n/-A format)."""
    lines = buggy(inst)[inst.path].split("\n")
    start = next(i for i, line in enumerate(lines) if line.startswith(f"def {inst.fn}("))
    out = [f"./{inst.path}:{start + 1}:{lines[start]}"]
    for j in range(start + 1, min(start + 3, len(lines) - 1 if lines[-1] == "" else len(lines))):
        out.append(f"./{inst.path}-{j + 1}-{lines[j]}")
    return "\n".join(out) + "\n"


def fix_commands(inst: Instance) -> tuple[str, list[str]]:
    """(the gold fix, the plausible wrong fixes) as `sed -i` commands on the line the inspection
    printed, in the file that defines the function (found by grep, not typed)."""
    sub = _subs(inst)
    bad = inst.family.bad.format(**sub)
    where = f"$(grep -rl 'def {inst.fn}(' .)"

    def sed(new: str) -> str:
        return sed_command("FILE", inst.lineno, bad, new).removesuffix(" FILE") + " " + where
    return sed(inst.family.good.format(**sub)), [sed(w.format(**sub)) for w in inst.family.wrong]


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
        "swarl_family": inst.family.name,
        "swarl_split": inst.split,
        "swarl_suite": "generated",
        "swarl_inspect_command": inspect_command(inst),
        "swarl_fix_command": gold,
        "swarl_wrong_commands": wrong,
    }


def generate() -> list[dict[str, Any]]:
    return [build_row(i) for i in instances()]


def instance_files(instance_id: str) -> dict[str, str] | None:
    """The files of a generated instance at its base commit, or None for another id."""
    for inst in instances():
        if inst.instance_id == instance_id:
            return buggy(inst)
    return None


def get_instance(instance_id: str) -> Instance:
    for inst in instances():
        if inst.instance_id == instance_id:
            return inst
    raise KeyError(f"instance_id: no generated task {instance_id!r}")


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    return write_or_check(GENERATED_JSONL, dumps(generate()), "--check" in args, "envd.tasks.generated")


if __name__ == "__main__":
    raise SystemExit(main())
