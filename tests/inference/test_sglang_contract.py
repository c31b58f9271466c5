"""swarl against the pinned SGLang release's own source (sglang_upstream.py: the wheel of the
`gpu` extra's `sglang==X`, fetched once, read with ast, never installed).

- every request SGLangClient makes (recorded by a real HTTP server on loopback, one call per
  public method) goes to a route the release serves with that method, not a deprecated one;
- every body it sends fits the route's io_struct class field for field: no unknown field, every
  required field present, values of a compatible type; a /generate body also fits the JSON
  contract (api/v1), whose SamplingParams rejects unknown keys, as swarl's SamplingParams must;
- the CPU server and the scripted server (their FastAPI apps, built in-process) serve every route
  the client uses, and nothing the release does not serve (a removed or deprecated-to-404 route);
- the CPU server's /model_info and weight-update answers carry the release's keys;
- every key swarl reads from an answer (READS: the client, the heartbeat through it, the
  coordinator and update group) is one the release writes, traced to where it builds it: the
  handlers' dict literals and status codes in http_server.py, /generate's `out_dict` and
  `meta_info` in tokenizer_manager.py and utils/weight_versions.py; and READS names every key
  those modules read, so a new read is traced before it lands;
- the CPU server's /generate answer has the release's meta_info shape.

They run in every `make test`: the wheel is fetched once into .swarl/cache/upstream, and a
wheel that cannot be fetched fails them (SWARL_SGLANG_WHEEL points them at another copy).
"""

from __future__ import annotations

import ast
import asyncio
import inspect
import json
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from sglang_upstream import (
    API_TYPES,
    HTTP_SERVER,
    IO_STRUCT,
    REPO,
    SAMPLING,
    TOKENIZER_MANAGER,
    WEIGHT_VERSIONS,
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


# What swarl reads from SGLang's answers, and where: keys of the JSON object each route answers.
UPDATE_ROUTES = ("/update_weights_from_disk", "/update_weights_from_distributed", "/init_weights_update_group",
                 "/destroy_weights_update_group", "/begin_weight_update", "/end_weight_update",
                 "/update_weight_version")
READS: dict[str, set[str]] = {
    # SGLangClient._update; update_group._ok/_why; transports disk and distributed
    **{route: {"success", "message"} for route in UPDATE_ROUTES},
    # SGLangClient.get_weight_version: the coordinator's check after a load, the heartbeat
    # (inference.membership via sglang_launch), the eval worker
    "/model_info": {"weight_version"},
    "/generate": {"text", "output_ids", "meta_info"},  # GenerateResult.from_response
    "meta_info": {"output_token_logprobs", "finish_reason", "weight_version", "weight_versions",
                  "prompt_tokens", "completion_tokens", "e2e_latency"},
    "weight_versions[]": {"version", "start", "end"},  # inference.weight_versions.per_token
}
ERROR_KEYS = {"error", "detail", "message"}  # an error body's message (client._message)
# the modules that read SGLang's answers (the coordinator and the heartbeat read them through
# SGLangClient), and what else they read that is no answer's key
READERS = ["inference/client.py", "inference/weight_versions.py", "weight_sync/update_group.py",
           "weight_sync/transports/disk.py", "weight_sync/transports/distributed.py", "inference/sglang_launch.py"]
NOT_ANSWERS = {"LOCAL_RANK",  # the environment
               "path", "bytes",  # a checkpoint manifest
               "already open",  # a substring of begin_weight_update's refusal (SESSION_OPEN)
               "nccl"}  # a substring of torch.distributed's backend name (update_group._nccl_in_use)


@pytest.fixture(scope="module")
def upstream() -> Upstream:
    version = pinned("sglang")
    given = os.environ.get("SWARL_SGLANG_WHEEL")
    try:
        return Upstream(Path(given) if given else wheel("sglang", version), version)
    except UpstreamUnavailable as e:
        pytest.fail(f"the SGLang contract cannot be checked: {e}", pytrace=False)


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


def _handler(upstream: Upstream, path: str, method: str = "POST") -> str:
    (route,) = [r for r in upstream.served(path) if method in r.methods]
    return route.handler


def test_every_update_and_control_answer_carries_what_swarl_reads_with_its_status(upstream):
    for path in UPDATE_ROUTES:
        answers = upstream.answers(HTTP_SERVER, _handler(upstream, path))
        assert answers, f"sglang {upstream.version}: {path} builds no answer this test can read"
        for a in answers:
            assert a.keys is not None and READS[path] <= a.keys, \
                f"sglang {upstream.version}: {path} answers {sorted(a.keys or [])}; swarl reads {sorted(READS[path])}"
            assert a.statuses <= {200, 400}, f"{path}: status {sorted(a.statuses)}; the client takes 200 and 400"
        assert set().union(*(a.statuses for a in answers)) == {200, 400}, path  # success and refusal
    for path in ("/pause_generation", "/continue_generation"):  # the client raises on anything but 2xx
        assert {s for a in upstream.answers(HTTP_SERVER, _handler(upstream, path)) for s in a.statuses} == {200}
    # flush_cache: 400 while requests run, which the client reports as "not flushed"
    flush = upstream.answers(HTTP_SERVER, _handler(upstream, "/flush_cache", "GET"))
    assert set().union(*(a.statuses for a in flush)) == {200, 400}


def test_model_info_carries_the_weight_version_swarl_reads(upstream):
    written = upstream.keys_written(HTTP_SERVER, _handler(upstream, "/model_info", "GET"), "result")
    assert READS["/model_info"] <= written, \
        f"sglang {upstream.version}'s /model_info writes no {sorted(READS['/model_info'] - written)}: the " \
        "coordinator's version check, the heartbeat and the eval worker read it"


def _meta_written(upstream: Upstream) -> set[str]:
    return (upstream.keys_written(TOKENIZER_MANAGER, "_handle_batch_output", "meta_info")
            | upstream.keys_written(TOKENIZER_MANAGER, "add_logprob_to_meta_info", "meta_info")
            | upstream.keys_written(WEIGHT_VERSIONS, "add_weight_versions_to_meta_info", "meta_info"))


def test_generate_answers_have_the_shape_swarl_reads(upstream):
    out = upstream.keys_written(TOKENIZER_MANAGER, "_handle_batch_output", "out_dict")
    assert READS["/generate"] <= out, READS["/generate"] - out
    meta = _meta_written(upstream)
    assert READS["meta_info"] <= meta, f"sglang {upstream.version} writes no meta_info {READS['meta_info'] - meta}"
    spans = upstream.dict_keys(WEIGHT_VERSIONS, "add_weight_versions_to_meta_info")
    assert READS["weight_versions[]"] <= spans
    # output_token_logprobs: one (logprob, token id, text or None) per token, in that order
    fn = upstream.function(TOKENIZER_MANAGER, "detokenize_logprob_tokens")
    rows = [n.elt for n in ast.walk(fn) if isinstance(n, ast.ListComp) and isinstance(n.elt, ast.Tuple)]
    rows += [ast.Tuple(elts=n.args) for n in ast.walk(fn) if isinstance(n, ast.Call) and ast.unparse(n.func) == "zip"
             and len(n.args) == 3]
    assert rows and all(len(r.elts) == 3 and "logprob" in ast.unparse(r.elts[0])
                        and ("id" in ast.unparse(r.elts[1]) or "idx" in ast.unparse(r.elts[1])) for r in rows)


def test_reads_names_every_key_swarl_takes_from_an_answer():
    """Every string key read with .get("k"), ["k"] or "k" in ... in the modules that read SGLang's
    answers is in READS (or an error body's): a new read must be traced above first."""
    traced = set().union(*READS.values()) | ERROR_KEYS | NOT_ANSWERS
    read: dict[str, set[str]] = {}
    for rel in READERS:
        for node in ast.walk(ast.parse((REPO / rel).read_text())):
            key = None
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get" \
                    and node.args and isinstance(node.args[0], ast.Constant):
                key = node.args[0].value
            elif isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load) \
                    and isinstance(node.slice, ast.Constant):
                key = node.slice.value
            elif isinstance(node, ast.Compare) and isinstance(node.ops[0], ast.In | ast.NotIn) \
                    and isinstance(node.left, ast.Constant):
                key = node.left.value
            if isinstance(key, str):
                read.setdefault(key, set()).add(rel)
    untraced = {k: sorted(v) for k, v in read.items() if k not in traced}
    assert not untraced, f"keys read from answers but not traced to SGLang in READS: {untraced}"


async def test_cpu_server_generate_has_sglangs_meta_info(upstream, cpu_server):
    async with httpx.AsyncClient(base_url=cpu_server.url, timeout=60,
                                 headers={"Authorization": f"Bearer {cpu_server.api_key}"}) as http:
        r = await http.post("/generate", json={"input_ids": [1, 2, 3], "return_logprob": True,
                                               "sampling_params": {"max_new_tokens": 3, "temperature": 0}})
        assert r.status_code == 200
        body = r.json()
        ended = (await http.post("/end_weight_update", json={})).status_code  # no session open: refused
        paused = (await http.post("/pause_generation", json={"mode": "retract"})).status_code
        resumed = (await http.post("/continue_generation", json={})).status_code
    assert READS["/generate"] <= set(body)
    meta = body["meta_info"]
    assert READS["meta_info"] <= set(meta) <= _meta_written(upstream), set(meta) - _meta_written(upstream)
    assert meta["weight_versions"] == [{"version": meta["weight_version"], "start": 0, "end": 3}]
    assert [len(t) for t in meta["output_token_logprobs"]] == [3, 3, 3]
    assert (ended, paused, resumed) == (400, 200, 200)


def _server_flags(upstream: Upstream) -> set[str]:
    """Every command-line flag of the release's server: `--` + each field name of
    srt/arg_groups/fields/ (underscores as dashes) and every alias given there."""
    import zipfile

    flags: set[str] = set()
    with zipfile.ZipFile(upstream.path) as z:
        members = [m for m in z.namelist() if m.startswith("sglang/srt/arg_groups/fields/") and m.endswith(".py")]
    for member in members:
        for node in ast.walk(upstream.tree(member)):
            if isinstance(node, ast.ClassDef):
                flags |= {"--" + s.target.id.replace("_", "-") for s in node.body
                          if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)}
            if isinstance(node, ast.keyword) and node.arg == "aliases" and isinstance(node.value, ast.List):
                flags |= {e.value for e in node.value.elts if isinstance(e, ast.Constant)}
    return flags


def test_the_launch_flags_swarl_refuses_or_sets_are_the_releases_own(upstream):
    from inference.sglang_launch import GROUP_BREAKING, OWN_FLAGS, SGLangLaunch, build_command

    flags = _server_flags(upstream)
    assert {"--tp-size", "--pp-size", "--dp-size"} <= flags  # the reader finds the parallel sizes
    unknown = sorted((set(GROUP_BREAKING) | set(OWN_FLAGS)) - flags)
    assert not unknown, f"sglang {upstream.version} has no flag {unknown}"
    cmd = build_command(SGLangLaunch(model="m", mem_fraction=0.5, api_key="k", base_gpu_id=0, python="python"))
    assert {a for a in cmd if a.startswith("--")} <= flags
