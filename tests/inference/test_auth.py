"""The API key as SGLang's add_api_key_middleware applies it, on swarl's CPU server and on the
scripted policy server alike: OPTIONS and paths under /health, /ready and /metrics are open;
everything else needs `Authorization: Bearer <key>` (scheme in any case) or gets
`401 {"error": "Unauthorized"}`."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from inference.client import InferenceError, SGLangClient
from inference.local_server import CpuServerHandle, start_scripted_server

ROW = {"instance_id": "auth__t-1", "problem_statement": "[auth] nothing to fix", "swarl_fix_command": "true"}
PROTECTED = [("POST", "/generate"), ("GET", "/model_info"), ("GET", "/get_model_info"),
             ("POST", "/update_weights_from_disk"), ("POST", "/update_weight_version")]


@pytest.fixture(scope="module")
def scripted(tiny_model_dir, tmp_path_factory) -> Iterator[CpuServerHandle]:
    h = start_scripted_server(tiny_model_dir, [ROW], log_dir=tmp_path_factory.mktemp("scripted-auth"))
    yield h
    h.stop()


@pytest.fixture(params=["cpu", "scripted"])
def server(request, cpu_server, scripted) -> CpuServerHandle:
    return cpu_server if request.param == "cpu" else scripted


async def test_everything_but_probes_needs_the_key(server):
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
        for method, path in PROTECTED:
            for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": server.api_key},
                            {"x-api-key": server.api_key}):
                r = await http.request(method, path, json={"input_ids": [1]}, headers=headers)
                assert (r.status_code, r.json()) == (401, {"error": "Unauthorized"}), (path, headers)
        # probes and scrapers written for SGLang need no key: served (200) or simply absent (404)
        assert (await http.get("/health")).status_code == 200
        assert (await http.get("/health_generate")).status_code == 200
        assert (await http.get("/metrics")).status_code == 404
        assert (await http.get("/ready")).status_code == 404
        assert (await http.options("/generate")).status_code != 401
        # the scheme is case-insensitive, the key is not
        for scheme in ("Bearer", "bearer", "BEARER"):
            r = await http.get("/model_info", headers={"Authorization": f"{scheme} {server.api_key}"})
            assert r.status_code == 200 and "weight_version" in r.json(), scheme
        r = await http.get("/model_info", headers={"Authorization": f"Bearer {server.api_key.upper()}"})
        assert r.status_code == 401
    async with SGLangClient(server.url, api_key="wrong", retries=0) as c:
        with pytest.raises(InferenceError) as ei:
            await c.get_model_info()
        assert ei.value.status == 401 and ei.value.message == "Unauthorized"
        assert await c.health() is True
    async with SGLangClient(server.url, api_key=server.api_key, retries=0) as c:
        assert (await c.get_model_info())["is_generation"] is True
