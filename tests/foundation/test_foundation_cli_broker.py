import json
import subprocess
import sys
from pathlib import Path

SWARL = [str(Path(sys.executable).parent / "swarl")]


def run(args, redis_url, **kw):
    env = {"SWARL_REDIS_URL": redis_url, "SWARL_RUN_ID": "clitest", "PATH": "/usr/bin:/bin"}
    return subprocess.run(SWARL + args, capture_output=True, text=True, env=env, timeout=60, **kw)


def write_rows(path: Path) -> None:
    seed_row = {"text": "add() is wrong", "metadata": {"instance": {
        "instance_id": "demo__calc-1", "problem_statement": "add() is wrong", "repo": "demo/calc",
        "FAIL_TO_PASS": '["tests/test_a.py::test_add"]', "PASS_TO_PASS": "[]",
        "eval_script": "pytest -rA"},
        "data_source": "demo/ds"}}
    raw_row = {"instance_id": "demo__calc-2", "problem_statement": "sub() is wrong", "repo": "demo/calc",
               "FAIL_TO_PASS": ["tests/test_a.py::test_sub"], "PASS_TO_PASS": [], "eval_script": "pytest -rA"}
    lines = [json.dumps(seed_row), "{not json", json.dumps(raw_row), json.dumps({"instance_id": "x"})]
    path.write_text("\n".join(lines) + "\n")


def test_enqueue_reports_bad_rows_and_is_idempotent(redis_url, tmp_path):
    data = tmp_path / "d.jsonl"
    write_rows(data)
    r = run(["enqueue", "--data", str(data), "--n-samples", "3"], redis_url)
    assert r.returncode == 0, r.stderr
    assert "enqueued 6 jobs" in r.stdout
    assert "line 2: not valid JSON" in r.stderr
    assert "line 4: problem_statement: missing" in r.stderr
    r = run(["enqueue", "--data", str(data), "--n-samples", "3"], redis_url)
    assert "enqueued 0 jobs (6 already queued or done)" in r.stdout
    r = run(["enqueue", "--data", str(data), "--fail-on-bad"], redis_url)
    assert r.returncode == 2 and "line 2" in r.stderr


def test_status_json(redis_url, tmp_path):
    data = tmp_path / "d.jsonl"
    write_rows(data)
    run(["enqueue", "--data", str(data), "--n-samples", "2"], redis_url)
    r = run(["status", "--json"], redis_url)
    assert r.returncode == 0, r.stderr
    st = json.loads(r.stdout)
    assert st["run"] == "clitest" and st["queue"]["depth"] == 4
    assert st["policy"]["current"] == 0 and st["stream"]["length"] == 0
    r = run(["status"], redis_url)
    assert "queue depth" in r.stdout


def test_config_error_exit_code(redis_url):
    r = run(["status", "--set", "admission.batch_size=x"], redis_url)
    assert r.returncode == 2 and "admission.batch_size" in r.stderr


def queued_groups(redis_url: str) -> list[str]:
    """The arq queue oldest first (the order workers take it), as instance:group."""
    import redis

    r = redis.Redis.from_url(redis_url, decode_responses=True)
    try:
        keys = [k for k in r.keys("*clitest*") if k.endswith(":queue")]
        assert len(keys) == 1, keys
        ids = r.zrange(keys[0], 0, -1)  # by score = enqueue time, arq's order
    finally:
        r.close()
    out = []
    for i in ids:
        _, iid, group, _ = i.rsplit(":", 3)  # <run>:<instance>:g<epoch>:s<index>
        if not out or out[-1] != f"{iid}:{group}":
            out.append(f"{iid}:{group}")
    return out


def family_sorted(tmp_path, families: int, per_family: int) -> tuple[Path, list[dict]]:
    """A data file sorted by bug family, as the bundled splits are."""
    data = tmp_path / "sorted.jsonl"
    rows = [{"instance_id": f"fam{f}__repo-{k}", "problem_statement": "x", "repo": f"fam{f}/repo",
             "FAIL_TO_PASS": ["t::a"], "PASS_TO_PASS": [], "eval_script": "pytest"}
            for f in range(families) for k in range(per_family)]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return data, rows


def test_enqueue_is_epoch_major_and_shuffled_per_epoch(redis_url, tmp_path):
    data, rows = family_sorted(tmp_path, families=3, per_family=6)
    r = run(["enqueue", "--data", str(data), "--n-samples", "2", "--epochs", "2", "--seed", "7"], redis_url)
    assert r.returncode == 0, r.stderr
    order = queued_groups(redis_url)
    assert len(order) == 36
    # every instance's group 0 before any group 1, each epoch holding every instance once
    assert [g.split(":")[1] for g in order] == ["g0"] * 18 + ["g1"] * 18
    file_order = [row["instance_id"] for row in rows]
    first, second = ([g.split(":")[0] for g in order[i:i + 18]] for i in (0, 18))
    assert sorted(first) == sorted(second) == sorted(file_order)
    # shuffled, and differently in each epoch: the first six are not one family
    assert first != file_order and first != second
    assert len({iid.split("__")[0] for iid in first[:6]}) > 1


def test_enqueue_in_order_keeps_the_file_order(redis_url, tmp_path):
    data, rows = family_sorted(tmp_path, families=2, per_family=4)
    r = run(["enqueue", "--data", str(data), "--n-samples", "1", "--in-order"], redis_url)
    assert r.returncode == 0, r.stderr
    assert [g.split(":")[0] for g in queued_groups(redis_url)] == [row["instance_id"] for row in rows]
