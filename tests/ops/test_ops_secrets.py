"""No secret in `swarl config show`: tokens, API keys and URL passwords are masked."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from swarl.config import MASK, redact

SWARL = str(Path(__file__).resolve().parents[2] / ".venv" / "bin" / "swarl")


def test_redact_masks_secret_keys_and_url_passwords():
    doc = {"redis": {"url": "rediss://actor:pw@10.0.0.2:6379/0?ssl_ca_certs=/ca.crt", "prefix": "swarl"},
           "envd": {"token": "t0k", "max_body_bytes": 5}, "inference": {"api_key": "k", "max_prefill_tokens": 8},
           "actor": {"inference_api_key": None, "tokenizer": "/tok"}, "pool": {"exec_urls": ["http://a:5000"]}}
    out = redact(doc)
    assert out["redis"]["url"] == f"rediss://actor:{MASK}@10.0.0.2:6379/0?ssl_ca_certs=/ca.crt"
    assert out["envd"] == {"token": MASK, "max_body_bytes": 5}
    assert out["inference"] == {"api_key": MASK, "max_prefill_tokens": 8}
    assert out["actor"] == {"inference_api_key": None, "tokenizer": "/tok"}  # unset stays visible
    assert out["pool"] == doc["pool"]


def test_config_show_prints_no_secret():
    secrets = {"SWARL_ENVD_TOKEN": "envd-s3cret-token", "SWARL_REDIS_URL": "redis://u:redis-s3cret-pw@10.0.0.2:6379/0",
               "SWARL_INFERENCE__API_KEY": "infer-s3cret-key"}
    p = subprocess.run([SWARL, "config", "show", "--set", "weight_sync.api_key=ws-s3cret-key",
                        "--set", "actor.inference_api_key=actor-s3cret-key"],
                       capture_output=True, text=True, timeout=60, env={"PATH": "/usr/bin:/bin", "PYTHONPATH": os.environ.get("PYTHONPATH", ""), **secrets})
    assert p.returncode == 0, p.stderr
    for leaked in ["envd-s3cret-token", "redis-s3cret-pw", "infer-s3cret-key", "ws-s3cret-key", "actor-s3cret-key"]:
        assert leaked not in p.stdout + p.stderr, leaked
    assert "url: redis://u:***@10.0.0.2:6379/0" in p.stdout and "token: '***'" in p.stdout
