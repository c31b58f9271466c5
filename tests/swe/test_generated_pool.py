"""RL's train pool (swe.tasks.generated.pool, `swarl demo --train-pool N`): fresh instances of the
train families in the train combinations, as real SWE rows with their own images.

Without Docker: the rows are valid, named apart from every suite row, a prefix of a longer pool,
found by id (their image's files too); no held-out path, function number or combination occurs
in them; both forms of each symptom come in turn (the demo's pairs); no fixed symptom table
beats chance on them; the row cache gives the rows it would build.
In Docker, through envd's own grading (`/container/evaluate`: the referee, canaries and
re-runs), one instance per family and form: the gold fix resolves it, an empty patch and the
family's other primitive do not."""

from __future__ import annotations

import re
from typing import Any

import pytest
from fixtures_tasks import envd_client

from swe.rows import validate_row
from swe.tasks import load_tasks, task_files
from swe.tasks.generated import (
    HELDOUT_FN_NUMBERS,
    POOL_SPLIT,
    SPLIT_COMBOS,
    TRAIN_FAMILIES,
    best_fixed_policy,
    buggy,
    form_pairs,
    get_instance,
    instances,
    pool,
    pool_instance,
    pool_rows,
    practice,
)

N = 512  # the demo's default pool (swarl.demo.run.TRAIN_POOL)


def test_pool_rows_are_valid_and_named_apart() -> None:
    rows = pool_rows(32)
    suite = load_tasks("all", suite="generated") + load_tasks("all", suite="bundled")
    for row in rows:
        validate_row(row)
        assert row["swarl_split"] == POOL_SPLIT and row["swarl_suite"] == "generated"
        assert row["image_name"].startswith("swarl/task.pool0-")
    for key in ("instance_id", "repo", "image_name", "swarl_fix_command"):
        values = [r[key] for r in rows]
        assert len(set(values)) == len(values), key
        assert not set(values) & {r.get(key) for r in suite}, key
    # prefix of a longer pool, found by id, files as the image gets them
    big = pool(N)
    assert big[:32] == pool(32)
    assert [get_instance(r["instance_id"]) for r in rows] == list(big[:32])
    assert pool_instance(big[-1].instance_id) == big[-1] and pool_instance("swarl-tasks__pool0-0") is None
    assert task_files(rows[5]["instance_id"]) == buggy(big[5])
    assert pool(8, seed=1)[0].instance_id == "swarl-tasks__pool1-1" and pool(8, seed=1) != pool(8)[:8]
    # not the warm start's practice instances: another stream, other names
    assert not {i.files[i.path] for i in big} & {i.files[i.path] for i in practice(N)}


def test_nothing_of_the_heldout_splits_in_the_pool() -> None:
    held = [i for i in instances() if i.split != "train"]
    held_paths = {i.path for i in held}
    insts = pool(N)
    for inst in insts:
        assert inst.family.name in TRAIN_FAMILIES
        assert inst.path not in held_paths, inst.name
        numbers = {int(n) for f in inst.files.values() for n in re.findall(r"\bfn_(\d+)\b", f)}
        assert not numbers & HELDOUT_FN_NUMBERS, (inst.name, numbers & HELDOUT_FN_NUMBERS)
        assert (inst.wording, inst.family.forms.index(inst.form), ("return", "result").index(inst.layout)) \
            in SPLIT_COMBOS["train"]
    # every (family, combination) equally often
    cells: dict[tuple[str, int, str, str], int] = {}
    for i in insts:
        key = (i.family.name, i.wording, i.form.name, i.layout)
        cells[key] = cells.get(key, 0) + 1
    assert len(cells) == 4 * 8 and set(cells.values()) == {N // 32}


def test_pool_pairs_both_forms_and_no_fixed_table_beats_chance() -> None:
    rows = pool_rows(64)
    units = form_pairs(rows)
    assert all(len(u) == 2 for u in units) and len(units) == 32
    for a, b in units:
        assert (a["swarl_family"], a["swarl_wording"]) == (b["swarl_family"], b["swarl_wording"])
        assert a["swarl_shape"].split("/")[0] != b["swarl_shape"].split("/")[0]
    insts = list(pool(64))
    assert best_fixed_policy(insts, max_edits=3)["rate"] <= 0.5
    assert best_fixed_policy(insts, max_edits=2, key=lambda i: (i.symptom, i.form.name))["rate"] == 1.0


def test_pool_rows_cache(tmp_path) -> None:
    built = pool_rows(6)
    assert pool_rows(4, cache_dir=tmp_path) == built[:4]
    (cached,) = tmp_path.iterdir()
    assert len(cached.read_text().splitlines()) == 4
    assert pool_rows(6, cache_dir=tmp_path) == built  # extended
    assert len(cached.read_text().splitlines()) == 6
    assert pool_rows(3, cache_dir=tmp_path) == built[:3]


def _diff_after(api: Any, cid: str, command: str | None) -> str:
    """Reset the container, run `command` (none: leave it at the base commit), return its diff."""
    out = api.post("/container/exec", json={"container_id": cid, "command": "git reset -q --hard && git clean -qfdx"})
    assert out.json()["returncode"] == 0, out.text
    if command:
        out = api.post("/container/exec", json={"container_id": cid, "command": command})
        assert out.json()["returncode"] == 0, out.text
    return str(api.post("/container/diff", json={"container_id": cid}).json()["patch"])


@pytest.mark.docker
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_pool_images_build_and_grade_through_envd(docker_client: Any, envd_server: Any) -> None:
    from envd.images import build_task_images
    from envd.referee import plan
    from swe.grading import eval_script_for

    rows = pool_rows(8)  # the k-th is of family k mod 4, the first 4 in one form, the next 4 in the other
    assert {(r["swarl_family"], r["swarl_shape"].split("/")[0]) for r in rows}.__len__() == 8
    for row in rows:  # graded through the referee (a pytest row), as the train split's
        assert plan(row, row["patch"], eval_script_for(row)) is not None
    images = build_task_images(docker_client, rows, progress=False)
    with envd_client(envd_server) as api:
        for row, image in zip(rows, images, strict=True):
            cid = api.post("/container/create", json={"image": image}).json()["container_id"]
            try:
                def grade(command: str | None, cid: str = cid, row: dict[str, Any] = row) -> dict[str, Any]:
                    patch = _diff_after(api, cid, command)
                    r = api.post("/container/evaluate", json={"container_id": cid, "patch": patch,
                                                              "instance": row, "timeout": 120})
                    assert r.status_code == 200, r.text
                    return dict(r.json())

                gold = grade(row["swarl_fix_command"])
                assert gold["resolved"], (row["instance_id"], gold.get("error"), gold.get("output", "")[-2000:])
                def body(diff: str) -> list[str]:  # the index line's abbreviation differs
                    return [x for x in diff.strip().splitlines() if not x.startswith("index ")]

                assert body(_diff_after(api, cid, row["swarl_fix_command"])) == body(row["patch"])
                for cmd in [None, *row["swarl_wrong_commands"]]:
                    wrong = grade(cmd)
                    assert not wrong["resolved"], (row["instance_id"], cmd, wrong)
            finally:
                api.post("/container/destroy", json={"container_id": cid})
