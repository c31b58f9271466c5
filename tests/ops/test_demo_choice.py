"""The choice measured on a run's own train episodes (swarl.demo.choice): the share of episodes
whose edit read the line, per bin of policy versions, from trajectories laid out as the actors
write them; and its summary across seeds beside the goals (swarl.demo.report)."""

from __future__ import annotations

import json
from pathlib import Path

from swarl.demo.choice import line, summary
from swarl.demo.report import aggregate, markdown
from swe.tasks.generated import (
    TRAIN_FAMILIES,
    fix_commands,
    inspect_command,
    inspect_output,
    instances,
)

INSTS = [i for i in instances() if i.family.name in TRAIN_FAMILIES][:20]


def _episode(d: Path, name: str, version: int, reads: bool | None, k: int, rc: int | None = None,
             misnamed: bool = False) -> None:
    """`misnamed`: the inspection types another function than the issue's (the eval still shows the
    right one's output: only the name's share may change)."""
    inst = INSTS[k % len(INSTS)]
    gold, wrong = fix_commands(inst)
    inspect = inspect_command(inst).replace(f"{inst.fn}(", "fn_1000(") if misnamed else inspect_command(inst)
    messages = [{"role": "system", "content": "sys"},
                {"role": "user", "content": f"<pr_description>\n{inst.title}\n</pr_description>"},
                {"role": "assistant", "content": f"```bash\n{inspect}\n```"},
                {"role": "user", "content": f"<returncode>0</returncode>\n<output>\n{inspect_output(inst)}</output>"}]
    if reads is not None:
        messages.append({"role": "assistant", "content": f"```bash\n{gold if reads else wrong[0]}\n```"})
        if rc is not None:
            messages.append({"role": "user", "content": f"<returncode>{rc}</returncode>\n<output>\n</output>"})
    (d / name).mkdir(parents=True)
    (d / name / "traj.json").write_text(json.dumps({"messages": messages}))
    (d / name / "meta.json").write_text(json.dumps({"policy_version": version}))


def _run_dir(tmp: Path, shares: dict[int, float], per_bin: int = 20, last_thin: int = 0) -> Path:
    """Episodes at versions 0.. (bins of 10) whose share reading the line is `shares[bin]`."""
    d = tmp / "trajectories"
    k = 0
    for b, p in shares.items():
        for j in range(per_bin):
            _episode(d, f"ep{k:05d}", b + j % 10, j < round(p * per_bin), k)
            k += 1
    last = max(shares) + 10
    for _ in range(last_thin):  # a final bin with few episodes (training stopped in it)
        _episode(d, f"ep{k:05d}", last, True, k)
        k += 1
    _episode(d, f"ep{k:05d}", 3, None, k)  # inspected, never edited: no choice, left out
    (d / "being-written").mkdir()  # an episode without its files yet: skipped
    return tmp


def test_the_share_per_bin_of_versions(tmp_path: Path) -> None:
    s = summary(_run_dir(tmp_path, {0: 0.5, 10: 0.6, 20: 0.9}) / "trajectories")
    assert s is not None
    assert [(b["versions"], b["episodes"], b["share"]) for b in s["bins"]] == [
        ([0, 9], 20, 0.5), ([10, 19], 20, 0.6), ([20, 29], 20, 0.9)]
    assert s["first"]["share"] == 0.5 and s["last"]["share"] == 0.9 and abs(s["rise"] - 0.4) < 1e-9
    assert 0.1 < s["first"]["half_width"] < 0.3
    assert "0-9 0.50" in line(s) and "20-29 0.90" in line(s) and "+0.40" in line(s)


def test_a_thin_final_bin_is_not_the_last(tmp_path: Path) -> None:
    """Training stops a few versions into a bin: its handful of episodes would make the run's
    final share noise, so the last full bin stands for it."""
    s = summary(_run_dir(tmp_path, {0: 0.5, 10: 0.8}, last_thin=3) / "trajectories")
    assert s is not None and len(s["bins"]) == 3 and s["last"]["versions"] == [10, 19]


def test_no_choice_no_summary(tmp_path: Path) -> None:
    assert summary(tmp_path) is None
    assert "no train episode" in line(None)


def _learning(seed: int, first: float, last: float) -> dict:
    b = lambda v, p: {"versions": [v, v + 9], "episodes": 300, "share": p, "half_width": 0.05,  # noqa: E731
                      "read_but_failed": 0.1}
    return {"seed": seed, "splits": {}, "choice": {"bin": 10, "bins": [b(0, first), b(80, last)],
                                                   "first": b(0, first), "last": b(80, last), "rise": last - first}}


def test_the_choice_across_seeds_beside_the_goals() -> None:
    rl = [_learning(s, 0.5 + 0.01 * s, 0.78 + 0.02 * s) for s in range(3)]
    shuffled = [_learning(s, 0.5, 0.48 + 0.02 * s) for s in range(3)]
    agg = aggregate(rl, shuffled)
    c = agg["choice"]
    assert c["rl"]["rise"]["ci"][0] > 0.2, c["rl"]
    assert c["shuffled"]["rise"]["ci"][0] <= 0.0 <= c["shuffled"]["rise"]["ci"][1], c["shuffled"]
    assert c["rl"]["last"]["n"] == 3
    text = markdown(agg, {"how": "synthetic"})
    assert "| RL | 0.510 [" in text and "| shuffled rewards | 0.500 [" in text
    assert c["rl"]["read_but_failed_last"]["mean"] == 0.1 and "| 0.100 [0.100, 0.100] |" in text
    # a run from before the measurement has none: nothing is made up
    assert aggregate([{"seed": 0, "splits": {}}])["choice"] == {}


def test_a_right_choice_in_a_garbled_command_is_counted(tmp_path: Path) -> None:
    """The policy picks the right edit but garbles the rest of its command (the command exits
    2): that episode's choice still reads the line, and `read_but_failed` counts it."""
    d = tmp_path / "trajectories"
    for k in range(10):
        _episode(d, f"a{k}", 0, True, k, rc=0)
        _episode(d, f"b{k}", 10, k % 2 == 0, k, rc=2 if k < 4 else 0)  # 2 right-but-failed, 2 wrong-and-failed
    s = summary(d)
    assert s is not None
    assert [b["read_but_failed"] for b in s["bins"]] == [0.0, 0.2]
    assert "failed 0.00 -> 0.20" in line(s)


def test_the_choice_in_an_evaluation(tmp_path: Path) -> None:
    """An evaluation's episodes carry no policy version (one policy): evaluated() reads them all
    (the choice, and the share whose first reply named the issue's function), the run's curve
    leaves them out, and the seeds summary shows before / after per arm."""
    from swarl.demo.choice import episodes, evaluated, evaluations

    ev = tmp_path / "eval"
    for k in range(8):
        _episode(ev / "after-heldout", f"e{k}", 0, k < 6, k, rc=2 if k == 0 else 0, misnamed=k in (1, 7))
        _episode(ev / "before-heldout", f"e{k}", 0, k < 4, k, rc=0)
    for split in ("after-heldout", "before-heldout"):
        for m in (ev / split).glob("*/meta.json"):
            m.write_text(json.dumps({"owner": "swarl-eval"}))  # as the evaluation writes it
    after = evaluated(ev / "after-heldout")
    assert after == {"episodes": 8, "share": 0.75, "half_width": after["half_width"], "read_but_failed": 0.125,
                     "named": 0.75}
    assert evaluated(ev / "before-heldout")["named"] == 1.0
    assert episodes(ev / "after-heldout") == []
    assert set(evaluations(ev)) == {"after-heldout", "before-heldout"} and evaluations(tmp_path / "none") == {}
    rl = [{"seed": s, "splits": {}, "eval_choice": {"before-heldout": {"share": 0.5}, "after-heldout": {"share": 0.7 + 0.01 * s},
                                                    "sft-heldout": {"share": 0.5}}} for s in range(3)]
    sh = [{"seed": s, "splits": {}, "eval_choice": {"after-heldout": {"share": 0.5 + 0.01 * s}}} for s in range(3)]
    agg = aggregate(rl, sh)
    row = agg["eval_choice"]["heldout"]
    assert row["before"]["mean"] == 0.5 and row["rl"]["mean"] == 0.71 and row["shuffled"]["mean"] == 0.51
    assert "| held-out combinations | 0.500 [0.500, 0.500] | 0.710 [" in markdown(agg, {"how": "synthetic"})


def test_the_run_report_shows_the_choice_and_the_name_per_evaluation() -> None:
    """The run's last lines give, per split, the evaluated choice and (where recorded) the share
    of first replies that named the issue's function, before / after / SFT control."""
    from swarl.demo.run import learning_lines

    rate = {"rate": 0.5}
    split = {"before": rate, "after": rate, "change": {"change": 0.0, "ci": [0.0, 0.0]}}
    learning = {"splits": {"heldout": split, "train": split},
                "eval_choice": {"before-heldout": {"share": 0.52, "named": 0.19},
                                "after-heldout": {"share": 0.61, "named": 0.94},
                                "before-train": {"share": 0.5, "named": None}}}
    text = learning_lines(learning)
    held = next(x for x in text.splitlines() if x.strip().startswith("heldout") and "evaluation" in x)
    assert "before 0.52, after 0.61" in held and "names the issue's function: before 0.19, after 0.94" in held
    train = next(x for x in text.splitlines() if x.strip().startswith("train") and "evaluation" in x)
    assert "before 0.50" in train and "names" not in train


def test_a_bad_practice_names_value_is_refused_before_anything_starts(tmp_path: Path) -> None:
    """`--practice-names` and `--reading-demos` are checked with the config, before Redis, Docker or
    the warm start."""
    import pytest

    from swarl.config import ConfigError
    from swarl.demo.run import Demo, DemoOptions

    with pytest.raises(ConfigError, match="practice names: one of train, all, got 'wide'"):
        Demo(DemoOptions(run_dir=str(tmp_path / "run"), practice_names="wide")).config()
    assert Demo(DemoOptions(run_dir=str(tmp_path / "run"), practice_names="all")).config().run.seed == 0
    with pytest.raises(ConfigError, match="reading demos: a count of demonstrations, got -1"):
        Demo(DemoOptions(run_dir=str(tmp_path / "run"), reading_demos=-1)).config()
