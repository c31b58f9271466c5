"""Fuzzing swarl's HTTP services from their own OpenAPI schemas (schemathesis + hypothesis).

`fuzz_openapi(url, token)` reads the live service's /openapi.json, and for every operation sends
`examples` schema-valid and `examples` schema-violating requests (schemathesis's positive and
negative modes) with the token. It returns the problems found: a 5xx, a 4xx without an error
message, or a 422 that names no field. The number of examples is bounded for `make test`;
`make fuzz` (SWARL_FUZZ_EXAMPLES=...) runs the same tests longer (marker `fuzz`).
"""

from __future__ import annotations

import os
from typing import Any

import httpx

# Imported while the tests are collected: pytest rewrites schemathesis (a pytest plugin) as it is
# imported, and that parse is better done once, before any test (see tests/ast_guard.py).
import schemathesis
import schemathesis.specs.openapi.schemas

FUZZ_EXAMPLES = int(os.environ.get("SWARL_FUZZ_EXAMPLES", "10"))


def settings(examples: int = FUZZ_EXAMPLES) -> Any:
    from hypothesis import HealthCheck
    from hypothesis import settings as hsettings

    return hsettings(max_examples=examples, deadline=None, database=None, derandomize=False,
                     suppress_health_check=list(HealthCheck), print_blob=True)


def error_of(resp: Any) -> str:
    """The error text of a swarl error answer ({ok: false, error}, SGLang's {error: {message}} or
    {success: false, message}, OpenAI's {object: "error", message})."""
    try:
        body = resp.json()
    except ValueError:
        return resp.text
    err = body.get("error") if isinstance(body, dict) else None
    if isinstance(body, dict) and (body.get("object") == "error" or body.get("success") is False):
        err = body.get("message")  # OpenAI's shape; SGLang's weight-update answers
    if isinstance(err, dict):
        err = err.get("message")
    return err if isinstance(err, str) else ""


def _bind(check: Any, op: Any, mode: Any) -> Any:
    def one_case(case: Any) -> None:
        check(op, mode, case)
    return one_case


def fuzz_openapi(url: str, token: str, skip: tuple[str, ...] = (), examples: int = FUZZ_EXAMPLES) -> list[str]:
    from hypothesis import given
    from hypothesis.errors import Unsatisfiable
    from schemathesis import GenerationMode

    headers = {"Authorization": f"Bearer {token}"}
    spec = httpx.get(f"{url}/openapi.json", headers=headers, timeout=30).json()
    schema = schemathesis.openapi.from_dict(spec)
    problems: list[str] = []
    session = __import__("requests").Session()
    tried = 0
    def check(op: Any, mode: Any, case: Any) -> None:
        nonlocal tried
        tried += 1
        resp = case.call(base_url=url, session=session, headers=headers, timeout=60)
        where = f"{op.method.upper()} {op.path} [{mode.value}] body={str(case.body)[:200]!r}"
        if resp.status_code >= 500:
            problems.append(f"{where}: {resp.status_code} {resp.text[:300]}")
        elif 400 <= resp.status_code < 500:
            err = error_of(resp)
            if not err.strip():
                problems.append(f"{where}: {resp.status_code} without an error message: {resp.text[:200]}")
            elif resp.status_code == 422 and "field" not in err:
                problems.append(f"{where}: 422 names no field: {err[:200]}")

    for result in schema.get_all_operations():
        op = result.ok()
        if op.path in skip or op.method.upper() not in ("GET", "POST"):
            continue
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            try:
                settings(examples)(given(case=op.as_strategy(generation_mode=mode))(_bind(check, op, mode)))()
            except Unsatisfiable:
                continue  # nothing to violate (e.g. a GET without parameters)
    session.close()
    assert tried > 0, "no operation was fuzzed"
    return problems
