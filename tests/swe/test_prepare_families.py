"""`swarl data prepare` takes each dataset family (`--family`, a listed dataset id, or a family's
name as `--source`); a file with one bad row writes nothing and names the row and the field, and
`swarl enqueue` of such a file queues nothing (a real redis-server)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import redis
from test_adapters import FAMILIES, bad_row

from broker.keys import Keys
from common.services import free_port
from swarl.data_prepare import DataError, prepare, resolve_source

REPO = Path(__file__).resolve().parents[2]
SWARL = str(Path(sys.executable).parent / "swarl")
# one bad row per family, each the way real rows go wrong
BAD_ONE = {
    "swe-bench": ({"FAIL_TO_PASS": "[\"test_a\""}, "FAIL_TO_PASS"),
    "swe-gym": ({"instance_id": 5752}, "instance_id"),
    "swe-smith": ({"image_name": None}, "image_name"),
    "r2e-gym": ({"expected_output_json": "{}"}, "expected_output_json"),
}


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([SWARL, *args], capture_output=True, text=True, timeout=120,
                          env={**os.environ, **(env or {})}, cwd=REPO)


def _write(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _good_rows(family: str) -> list[dict[str, Any]]:
    first = FAMILIES[family]()
    if family == "r2e-gym":
        return [first, {**first, "commit_hash": "77aa01c", "docker_image": "namanjain12/pandas_final:77aa01c"}]
    return [first, {**first, "instance_id": first["instance_id"] + "2"}]


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_each_family_prepares_and_names_its_rows(tmp_path: Path, family: str) -> None:
    src = _write(tmp_path / "rows.jsonl", _good_rows(family))
    p = _cli("data", "prepare", "--source", str(src), "--family", family, "--out", str(tmp_path / "o"))
    assert p.returncode == 0, p.stderr
    summary = json.loads(p.stdout.strip().splitlines()[-1])
    assert summary["rows_written"] == 2 and summary["family"] == family
    recs = [json.loads(x) for x in (tmp_path / "o" / "train.jsonl").read_text().splitlines()]
    assert {r["metadata"]["instance"]["dataset_family"] for r in recs} == {family}
    images = (tmp_path / "o" / "docker_images.txt").read_text().split()
    assert images == list(dict.fromkeys(r["metadata"]["instance"]["image_name"] for r in recs))
    # the same file without --family: the rows' shape says the same
    assert prepare(str(src), tmp_path / "o2").family is None
    assert (tmp_path / "o2" / "train.jsonl").read_text() == (tmp_path / "o" / "train.jsonl").read_text()


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_a_bad_row_writes_nothing(tmp_path: Path, family: str) -> None:
    changes, field = BAD_ONE[family]
    src = _write(tmp_path / "bad.jsonl", [_good_rows(family)[0], bad_row(family, changes)])
    out = tmp_path / "o"
    p = _cli("data", "prepare", "--source", str(src), "--family", family, "--out", str(out))
    assert p.returncode == 2
    assert "1 invalid row(s)" in p.stderr and "nothing written" in p.stderr
    assert "bad.jsonl line 2" in p.stderr and f"field {field!r}" in p.stderr, p.stderr
    assert not out.exists()
    # --on-error skip writes the good row and lists the bad one
    res = prepare(str(src), out, family=family, on_error="skip")
    assert res.rows_written == 1 and res.errors == 1
    err = json.loads((out / "errors.jsonl").read_text())
    assert err["where"] == "bad.jsonl line 2" and err["field"] == field


def test_a_file_of_one_family_read_as_another_fails(tmp_path: Path) -> None:
    src = _write(tmp_path / "smith.jsonl", _good_rows("swe-smith"))
    with pytest.raises(DataError, match=r"field 'base_commit': missing: required to build the eval script"):
        prepare(str(src), tmp_path / "o", family="swe-gym")
    assert not (tmp_path / "o").exists()


def test_family_names_and_dataset_ids_as_the_source() -> None:
    assert resolve_source("swe-smith", None) == ("SWE-bench/SWE-smith", "swe-smith")
    assert resolve_source("r2e-gym", None) == ("R2E-Gym/R2E-Gym-Lite", "r2e-gym")
    assert resolve_source("swe-gym", None) == ("SWE-Gym/SWE-Gym", "swe-gym")
    assert resolve_source("SWE-Gym/SWE-Gym", None) == ("SWE-Gym/SWE-Gym", "swe-gym")
    assert resolve_source("swarl", None) == ("swarl-tasks", "swarl")
    assert resolve_source("someone/SWE-Gym-mirror", None) == ("someone/SWE-Gym-mirror", None)  # no substring
    assert resolve_source("someone/mirror", "swe-gym") == ("someone/mirror", "swe-gym")
    with pytest.raises(DataError, match="--family: unknown dataset family 'swe-bench-pro'"):
        resolve_source("x.jsonl", "swe-bench-pro")
    with pytest.raises(DataError, match="is a swe-gym dataset, but --family says swe-bench"):
        resolve_source("SWE-Gym/SWE-Gym", "swe-bench")


def test_a_family_name_as_source_reads_its_hub_dataset(tmp_path: Path) -> None:
    env = {"HF_ENDPOINT": f"http://127.0.0.1:{free_port()}", "HF_HOME": str(tmp_path / "hf")}
    p = _cli("data", "prepare", "--source", "r2e-gym", "--out", str(tmp_path / "o"), env=env)
    assert p.returncode == 2 and "R2E-Gym/R2E-Gym-Lite" in p.stderr and "not reachable" in p.stderr
    p = _cli("data", "prepare", "--source", "rows.jsonl", "--family", "nope", "--out", str(tmp_path / "o"))
    assert p.returncode == 2 and "--family: unknown dataset family 'nope'" in p.stderr


def test_enqueue_queues_nothing_from_a_bad_file(tmp_path: Path, redis_url: str) -> None:
    keys = Keys(prefix="swarl", run="fam")
    sets = ["--set", f"redis.url={redis_url}", "--set", "run.id=fam", "--set", f"run.dir={tmp_path}"]
    r = redis.Redis.from_url(redis_url)
    try:
        for family, (changes, _field) in BAD_ONE.items():
            src = _write(tmp_path / f"{family}.jsonl", [_good_rows(family)[0], bad_row(family, changes)])
            p = _cli("enqueue", "--data", str(src), "--fail-on-bad", "--n-samples", "2", *sets)
            assert p.returncode == 2 and f"{family}.jsonl line 2" in p.stderr, p.stderr
            assert r.zcard(keys.queue) == 0
        # prepared rows of every family are queued
        for family in FAMILIES:
            prepare(str(_write(tmp_path / f"ok-{family}.jsonl", _good_rows(family))), tmp_path / family)
            p = _cli("enqueue", "--data", str(tmp_path / family / "train.jsonl"), "--n-samples", "2", *sets)
            assert p.returncode == 0, p.stderr
        assert r.zcard(keys.queue) == 2 * 2 * len(FAMILIES)
    finally:
        r.close()
