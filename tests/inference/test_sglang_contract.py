"""swarl against the pinned SGLang release's own source (sglang_upstream.py: the wheel of the
`gpu` extra's `sglang==X`, fetched once, read with ast, never installed).

- every request SGLangClient makes (recorded by a real HTTP server on loopback, one call per
  public method) goes to a route the release serves with that method, not a deprecated one;
- every body it sends fits the route's io_struct class field for field: no unknown field, every
  required field present, values of a compatible type; a /generate body also fits the JSON
  contract (api/v1), whose SamplingParams rejects unknown keys, as swarl's SamplingParams must;
- the CPU server and the scripted server (their FastAPI apps, built in-process) serve every route
  the client uses, and nothing the release does not serve (a removed or deprecated-to-404 route);
- the CPU server's /model_info and weight-update answers carry the release's keys.

Without the wheel (no package index) the tests skip, and fail under CI=true.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import os
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import uvicorn
from sglang_upstream import (
    API_TYPES,
    HTTP_SERVER,
    IO_STRUCT,
    SAMPLING,
    Upstream,
    UpstreamUnavailable,
    pinned,
    type_fits,
    wheel,
)
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route as StarletteRoute

from common.services import free_port
from inference.client import SGLangClient
from inference.sampling import SamplingParams

FASTAPI_OWN = {"/docs", "/redoc", "/openapi.json", "/docs/oauth2-redirect"}
SWARL_OWN = "/swarl/"  # swarl's own routes (stats, checksums, faults), outside SGLang's API

# one call per public method of SGLangClient, with every optional argument it can send
CALLS: list[tuple[str, dict[str, Any]]] = [
    ("generate", {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 8, "temperature": 0.7},
                  "rid": "r-1", "return_logprob": True}),
    ("update_weights_from_disk", {"model_path": "/ckpt/v1", "weight_version": "1", "abort_all_requests": False}),
    ("init_weights_update_group", {"master_address": "127.0.0.1", "master_port": 29500, "rank_offset": 1,
                                   "world_size": 2, "group_name": "g", "backend": "nccl"}),
    ("update_weights_from_distributed", {"names": ["model.norm.weight"], "dtypes": ["bfloat16"], "shapes": [[8]],
                                         "group_name": "g", "flush_cache": True, "weight_version": "1"}),
    ("destroy_weights_update_group", {"group_name": "g"}),
    ("begin_weight_update", {}),
    ("end_weight_update", {}),
    ("get_weight_version", {}),
    ("update_weight_version", {"new_version": "2", "abort_all_requests": True}),
    ("get_weights_by_name", {"name": "model.norm.weight", "truncate_size": 4}),
    ("pause_generation", {"mode": "retract"}),
    ("continue_generation", {}),
    ("abort_request", {"rid": "r-1", "abort_all": False}),
    ("flush_cache", {}),
    ("model_info", {}),
    ("server_info", {}),
    ("health", {}),
    ("health_generate", {}),
]


@pytest.fixture(scope="module")
def upstream() -> Upstream:
    version = pinned("sglang")
    try:
        return Upstream(wheel("sglang", version), version)
    except UpstreamUnavailable as e:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"the SGLang contract cannot be checked: {e}", pytrace=False)
        pytest.skip(f"the pinned SGLang wheel is not available here: {e}")


@pytest.fixture(scope="module")
def recorded() -> Iterator[list[tuple[str, str, Any]]]:
    """What SGLangClient sends: every call of CALLS against a recording HTTP server on loopback
    that answers each one as SGLang would answer a success."""
    seen: list[tuple[str, str, Any]] = []

    async def record(request: Request) -> JSONResponse:
        raw = await request.body()
        seen.append((request.method, request.url.path, json.loads(raw) if raw.strip() else None))
        return JSONResponse({"success": True, "message": "Success", "weight_version": "0", "text": "",
                             "output_ids": [], "meta_info": {"finish_reason": {"type": "stop"}}})

    app = Starlette(routes=[StarletteRoute("/{path:path}", record, methods=["GET", "POST", "PUT", "DELETE"])])
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "recording server did not start"
        time.sleep(0.02)

    async def run() -> None:
        async with SGLangClient(f"http://127.0.0.1:{port}", api_key="k", timeout_s=10, retries=0) as c:
            for name, kwargs in CALLS:
                await getattr(c, name)(**kwargs)

    try:
        asyncio.run(run())
        yield seen
    finally:
        server.should_exit = True
        thread.join(10)


def test_every_public_client_method_is_in_the_contract():
    methods = {name for name, fn in inspect.getmembers(SGLangClient, inspect.iscoroutinefunction)
               if not name.startswith("_") and name not in ("aclose", "__aenter__", "__aexit__")}
    aliases = {"get_model_info", "get_server_info"}  # the same functions as model_info, server_info
    assert SGLangClient.get_model_info is SGLangClient.model_info
    assert SGLangClient.get_server_info is SGLangClient.server_info
    assert methods - aliases == {name for name, _ in CALLS}


def test_every_route_the_client_calls_is_served_with_its_method(upstream, recorded):
    assert len(recorded) == len(CALLS)
    for method, path, _ in recorded:
        served = upstream.served(path)
        assert served, f"sglang {upstream.version} serves no {path} (swarl's SGLangClient calls it)"
        assert any(method in r.methods for r in served), \
            f"sglang {upstream.version} serves {path} with {sorted(set().union(*(r.methods for r in served)))}, " \
            f"not {method}"
        assert not any(r.deprecated for r in served), f"sglang {upstream.version} deprecates {path}"


def test_every_body_the_client_sends_fits_its_io_struct(upstream, recorded):
    classes = upstream.classes(IO_STRUCT)
    for method, path, body in recorded:
        (route,) = [r for r in upstream.served(path) if method in r.methods]
        if route.body is None:
            assert not body, f"{path}: sglang {upstream.version} reads no body, swarl sends {body}"
            continue
        fields = classes[route.body]
        body = body or {}
        unknown = sorted(set(body) - set(fields))
        assert not unknown, f"{path}: {route.body} of sglang {upstream.version} has no field {unknown}"
        missing = sorted(f.name for f in fields.values() if f.required and f.name not in body)
        assert not missing, f"{path}: {route.body} requires {missing}"
        for key, value in body.items():
            assert type_fits(fields[key].annotation, value, classes), \
                f"{path}: {route.body}.{key} is {fields[key].annotation}; swarl sends {value!r}"


def test_generate_fits_the_json_contract_and_sampling_params(upstream, recorded):
    contract = upstream.classes(API_TYPES)
    (body,) = [b for _, p, b in recorded if p == "/generate"]
    request = contract["GenerateRequest"]
    assert set(body) <= set(request), set(body) - set(request)
    for key, value in body.items():
        assert type_fits(request[key].annotation, value, contract), (key, request[key].annotation, value)
    # api/v1's SamplingParams rejects unknown keys with a 400: every key swarl's own sampling
    # params accept must be one of them, and one the scheduler's SamplingParams knows
    accepted = set(SamplingParams.model_fields)
    for where, fields in (("api/v1 SamplingParams", set(contract["SamplingParams"])),
                          ("srt SamplingParams", set(upstream.classes(SAMPLING)["SamplingParams"]))):
        assert accepted <= fields, f"sglang {upstream.version} {where} has no {sorted(accepted - fields)}"
    assert set(body["sampling_params"]) <= accepted


def _app_routes(app: Any) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for r in app.routes:
        methods = getattr(r, "methods", None)
        if methods and r.path not in FASTAPI_OWN and not r.path.startswith(SWARL_OWN):
            out.setdefault(r.path, set()).update(m for m in methods if m != "HEAD")
    return out


@pytest.fixture(scope="module")
def swarl_apps(tiny_model_dir) -> dict[str, dict[str, set[str]]]:
    from transformers import AutoTokenizer

    from inference import cpu_server, scripted

    cpu = cpu_server.create_app(cpu_server.ServerSettings(model_dir=str(tiny_model_dir), api_key="k"))
    policy = scripted.ScriptedPolicy(AutoTokenizer.from_pretrained(tiny_model_dir))
    return {"CPU server": _app_routes(cpu), "scripted server": _app_routes(scripted.create_app(policy, "k"))}


def test_swarl_servers_serve_what_the_client_calls_and_nothing_sglang_does_not(upstream, recorded, swarl_apps):
    calls = {(m, p) for m, p, _ in recorded}
    cpu = swarl_apps["CPU server"]
    for method, path in sorted(calls):
        assert method in cpu.get(path, set()), f"the CPU server does not serve {method} {path}"
    for name, routes in swarl_apps.items():
        for path, methods in sorted(routes.items()):
            served = upstream.served(path)
            assert served, f"the {name} serves {path}; sglang {upstream.version} does not"
            theirs = set().union(*(r.methods for r in served))
            assert methods <= theirs, f"the {name} serves {path} with {sorted(methods - theirs)}; sglang does not"
    assert "/get_weight_version" not in cpu  # gone from SGLang 0.5.21 on


async def test_cpu_server_answers_carry_sglangs_keys(upstream, cpu_server):
    model_info = upstream.dict_keys(HTTP_SERVER, "model_info") - {"embedding"}  # embedding models only
    async with httpx.AsyncClient(base_url=cpu_server.url, timeout=30,
                                 headers={"Authorization": f"Bearer {cpu_server.api_key}"}) as http:
        info = (await http.get("/model_info")).json()
        assert model_info <= set(info), model_info - set(info)
        assert (await http.get("/get_model_info")).json() == info
        for path in ("/begin_weight_update", "/end_weight_update"):
            ans = (await http.post(path, json={})).json()
            assert set(ans) == upstream.dict_keys(HTTP_SERVER, path.lstrip("/")) == {"success", "message"}
        version = info["weight_version"]
        ans = (await http.post("/update_weight_version", json={"new_version": version})).json()
        assert set(ans) == {"success", "message", "new_version"} <= upstream.dict_keys(HTTP_SERVER,
                                                                                      "update_weight_version")
        r = await http.post("/abort_request", json={"rid": "none"})
        assert (r.status_code, r.content) == (200, b"")  # SGLang's empty 200
        server_info = (await http.get("/server_info")).json()
        assert {"internal_states", "version"} <= set(server_info)


def test_the_pin_must_be_exact_and_a_missing_release_is_named(tmp_path):
    from sglang_upstream import REPO

    assert pinned("sglang") == pinned("sglang", REPO / "pyproject.toml")
    loose = tmp_path / "pyproject.toml"
    loose.write_text('[project.optional-dependencies]\ngpu = ["sglang[srt]>=0.5,<0.6"]\n')
    with pytest.raises(ValueError, match=r"must pin sglang exactly \(==X\), got 'sglang\[srt\]>=0.5,<0.6'"):
        pinned("sglang", loose)
    loose.write_text('[project.optional-dependencies]\ngpu = ["torch"]\n')
    with pytest.raises(ValueError, match="the gpu extra has no sglang requirement"):
        pinned("sglang", loose)
    with pytest.raises(UpstreamUnavailable, match=r"pip download sglang==0\.0\.0 failed"):
        wheel("sglang", "0.0.0", cache=tmp_path / "cache")
