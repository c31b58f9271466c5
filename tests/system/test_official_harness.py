"""The official SWE-bench harness grades `swarl eval`'s preds.json as swarl graded the episodes.

What is official: `python -m swebench.harness.run_evaluation` of the swebench pinned in
pyproject's dev extra, run unchanged as a subprocess (its argument parsing, main(), predictions
reader, image lookup, container, three-way patch application, its own eval script built from
the row's test_patch, parse_log_pytest, get_eval_report and the run report read here).
What is swarl's: the episodes (`swarl eval` on a scripted policy: per task the gold fix, a wrong
fix or no change), the task images (built from Debian packages by swe/envd, never pulled), the
extra tag each gets under the name the harness looks up, and official_harness.register, which
adds the bundled repos to the harness's repo maps (a Python repo tested with pytest on the
test_patch's files; swebench 4.1 has no other way to add a repo). The harness's Python eval
script also activates conda, which the Debian task images lack: those two lines fail and the
script goes on (it runs without `set -e`), so the tests run under the image's python3.

Local images: with a namespace (`--namespace swarl-local`) the harness takes the instance image
`swarl-local/sweb.eval.x86_64.<instance_id, __ as _1776_>:latest` as it is (docker images.get,
a pull only when absent), so each task image is tagged under that name first. Without one
(`--namespace none`) it would build base and environment images from Dockerfiles that install
from the internet.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from official_harness import TEST_CMD, registered

from swe.tasks import load_tasks

pytestmark = [pytest.mark.docker, pytest.mark.slow, pytest.mark.timeout(900)]

SWARL = str(Path(sys.executable).parent / "swarl")
HERE = Path(__file__).resolve().parent
NAMESPACE = "swarl-local"
# per task the scripted policy's answer: the gold fix, a wrong fix, nothing (an empty patch)
MODES = {"invoicekit": "fix", "textkit": "wrong", "pagekit": "noop", "stockroom": "fix"}


def pick_rows() -> list[dict]:
    """The first train task of each repo in MODES, with its scripted mode."""
    rows: dict[str, dict] = {}
    for r in load_tasks("train"):
        name = r["repo"].split("/", 1)[1]
        if name in MODES and name not in rows:
            rows[name] = {**r, "swarl_scripted_mode": MODES[name]}
    assert set(rows) == set(MODES), rows.keys()
    return list(rows.values())


def test_official_harness_resolves_what_swarl_resolved(task_images, pool_server, cpu_server_factory,
                                                       tiny_model_dir, docker_client, tmp_path):
    from swebench.harness.test_spec.test_spec import make_test_spec

    rows = pick_rows()
    ids = {r["instance_id"] for r in rows}
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))

    # swarl's grading: `swarl eval` through the pool and envd, two samples per task
    server = cpu_server_factory.start_scripted(tiny_model_dir, rows)
    out = tmp_path / "eval"
    env = {**os.environ, "SWARL_ENVD_TOKEN": pool_server.token, "SWARL_INFERENCE_API_KEY": server.api_key}
    r = subprocess.run([SWARL, "eval", "--data", str(data), "--server", server.url, "--out", str(out),
                        "--pool-url", pool_server.url, "--max-concurrent", "2", "--step-limit", "4",
                        "--max-tokens", "128", "--n-samples", "2"],
                       capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    results = [json.loads(x) for x in (out / "results.jsonl").read_text().splitlines() if x.strip()]
    assert len(results) == 8 and not [x for x in results if x.get("error")], results
    by_mode = {m: {r["instance_id"] for r in rows if r["swarl_scripted_mode"] == m} for m in MODES.values()}
    swarl_resolved = [{x["instance_id"] for x in results if x["resolved"] and x["sample"] == k} for k in (0, 1)]
    assert swarl_resolved == [by_mode["fix"]] * 2  # both outcomes present: the comparison can fail

    summary = json.loads((out / "summary.json").read_text())
    model = str(tiny_model_dir)  # the scripted server's served_model_name
    assert summary["model_name_or_path"] == model and summary["preds"] == ["preds.json", "preds-1.json"]
    assert summary["pass_at_k"] == {"1": 0.5, "2": 0.5}  # 2 of 4 tasks resolved in both samples
    for name in summary["preds"]:
        preds = json.loads((out / name).read_text())
        assert [p["instance_id"] for p in preds] == [r["instance_id"] for r in rows]
        assert {p["model_name_or_path"] for p in preds} == {model}
        assert {p["instance_id"] for p in preds if not p["model_patch"]} == by_mode["noop"]

    # the harness's images: each task image under the name the harness looks up
    tags = []
    for row in rows:
        with registered(rows):
            spec = make_test_spec(row, namespace=NAMESPACE)
        assert spec.instance_image_key == (f"{NAMESPACE}/sweb.eval.x86_64."
                                           f"{row['instance_id'].replace('__', '_1776_')}:latest")
        # the harness runs the test command the row's own eval script runs
        assert spec.eval_script.split(": '>>>>> Start Test Output'\n")[1].split("\n")[0] == \
            row["eval_script"].split(": '>>>>> Start Test Output'\n")[1].split("\n")[0]
        assert TEST_CMD in spec.eval_script
        repo, tag = spec.instance_image_key.rsplit(":", 1)
        docker_client.images.get(task_images[row["instance_id"]]).tag(repo, tag)
        tags.append(spec.instance_image_key)
    work = tmp_path / "harness"
    work.mkdir()
    reports = []
    try:
        for k, name in enumerate(summary["preds"]):  # one harness run per sample, each its own run id
            run_id = f"swarl-{uuid.uuid4().hex[:8]}-s{k}"
            for _ in range(3):
                h = subprocess.run([sys.executable, str(HERE / "official_harness.py"), str(data),
                                    "--dataset_name", str(data), "--predictions_path", str(out / name),
                                    "--run_id", run_id, "--namespace", NAMESPACE, "--max_workers", "2",
                                    "--cache_level", "instance", "--timeout", "300"],
                                   cwd=work, capture_output=True, text=True, timeout=600)
                # swebench 4.1's make_run_report lists every container on the engine, then inspects
                # each: one another test removes in between is a 404 there, after the grading. The
                # harness run again keeps the graded instances (their report.json) and reports.
                if h.returncode == 0 or "make_run_report" not in h.stderr or "No such container" not in h.stderr:
                    break
            assert h.returncode == 0, (h.stdout + h.stderr)[-4000:]
            report = json.loads((work / f"{model.replace('/', '__')}.{run_id}.json").read_text())
            logs = work / "logs" / "run_evaluation" / run_id
            assert not report["error_ids"], (report, [p.read_text()[-2000:] for p in logs.rglob("run_instance.log")])
            reports.append(report)
    finally:
        for t in tags:  # only the extra names: the task images keep their own
            docker_client.images.remove(t)
    for k, report in enumerate(reports):
        assert set(report["submitted_ids"]) == ids
        assert set(report["empty_patch_ids"]) == by_mode["noop"]
        # every non-empty prediction was run and graded by the harness itself
        assert set(report["completed_ids"]) == ids - by_mode["noop"]
        harness_resolved = set(report["resolved_ids"])
        assert harness_resolved - swarl_resolved[k] == set(), f"sample {k}: resolved by the harness only"
        assert swarl_resolved[k] - harness_resolved == set(), f"sample {k}: resolved by swarl only"
