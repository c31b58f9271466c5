"""`swarl eval` end to end: a scripted policy server (the gold fix, then submit), the real pool
and envd, the bundled task images; per-episode artifacts, results.jsonl, summary.json, resume."""

import json
import os
import secrets
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from common.services import free_port
from swe.tasks import load_tasks

SWARL = str(Path(sys.executable).parent / "swarl")


@pytest.fixture
def scripted_server(tiny_model_dir, tmp_path):
    def start(rows: list[dict], mode: str) -> tuple[str, str, subprocess.Popen]:
        port, key = free_port(), secrets.token_hex(8)
        tasks = tmp_path / f"tasks-{mode}.jsonl"
        tasks.write_text("".join(json.dumps(r) + "\n" for r in rows))
        log = open(tmp_path / f"scripted-{mode}.log", "wb")  # closed at teardown
        proc = subprocess.Popen([SWARL, "scripted-policy", "serve", "--tokenizer", str(tiny_model_dir),
                                 "--mode", mode, "--port", str(port), "--tasks", str(tasks)],
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                env={**os.environ, "SWARL_INFERENCE_API_KEY": key})
        started.append((proc, log))
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            assert proc.poll() is None, (tmp_path / f"scripted-{mode}.log").read_text()
            try:
                if httpx.get(f"{url}/health", headers={"Authorization": f"Bearer {key}"}, timeout=2).is_success:
                    return url, key, proc
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise AssertionError("scripted policy server did not come up")

    started: list = []
    yield start
    for proc, log in started:
        proc.terminate()
        proc.wait(20)
        log.close()


@pytest.mark.docker
def test_eval_writes_artifacts_and_resumes(task_images, pool_server, scripted_server, tmp_path):
    rows = load_tasks("train")[:2]
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "out"

    def run_eval(url: str, key: str, out_dir: Path) -> dict:
        env = {**os.environ, "SWARL_ENVD_TOKEN": pool_server.token, "SWARL_INFERENCE_API_KEY": key}
        r = subprocess.run([SWARL, "eval", "--data", str(data), "--server", url, "--out", str(out_dir),
                            "--pool-url", pool_server.url, "--max-concurrent", "2", "--step-limit", "4",
                            "--max-tokens", "128"],
                           capture_output=True, text=True, env=env, timeout=400)
        assert r.returncode == 0, r.stderr[-3000:]
        return json.loads(r.stdout.strip().splitlines()[-1])

    url, key, _ = scripted_server(rows, "fix")
    summary = run_eval(url, key, out)
    assert summary["resolve_rate"] == 1.0 and summary["episodes"] == 2 and not summary["errors"]
    assert json.loads((out / "summary.json").read_text()) == summary
    results = [json.loads(x) for x in (out / "results.jsonl").read_text().splitlines()]
    assert sorted(r["instance_id"] for r in results) == sorted(r["instance_id"] for r in rows)
    for r in results:
        d = Path(r["traj_dir"])
        assert {"traj.json", "patch.diff", "meta.json"} <= {p.name for p in d.iterdir()}
        assert "diff --git" in (d / "patch.diff").read_text()
        assert json.loads((d / "traj.json").read_text())["resolved"] is True
    # resumable: a second run finds every instance in results.jsonl and runs nothing
    again = run_eval(url, key, out)
    assert again == summary
    assert len((out / "results.jsonl").read_text().splitlines()) == 2
    # a wrong fix is graded unresolved
    url_w, key_w, _ = scripted_server(rows, "wrong")
    wrong = run_eval(url_w, key_w, tmp_path / "out-wrong")
    assert wrong["resolve_rate"] == 0.0 and wrong["episodes"] == 2 and not wrong["errors"]
