"""No code lists Docker objects with the SDK's high-level list() that inspects each one after
listing it: another process (envd's warm reaper, its image budget, a concurrent test) may
remove one in between, and the 404 fails the whole call. The low-level list
(`client.api.containers(...)`, `client.api.images(...)`) or `ignore_removed=True` instead."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DIRS = ("envd", "actors", "swe", "swarl", "common", "broker", "learner", "inference", "weight_sync", "benchmarks",
        "tests")


def offending(source: str) -> list[int]:
    """Lines calling `<x>.containers.list(...)` without ignore_removed / sparse, or `<x>.images.list(...)`."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "list"):
            continue
        owner = node.func.value
        if not isinstance(owner, ast.Attribute) or owner.attr not in ("containers", "images"):
            continue
        safe = {k.arg for k in node.keywords if isinstance(k.value, ast.Constant) and k.value.value is True}
        if owner.attr == "images" or not safe & {"ignore_removed", "sparse"}:
            lines.append(node.lineno)
    return lines


def test_the_guard_sees_a_list_then_inspect() -> None:
    assert offending("c.containers.list(all=True)\nc.images.list()\n") == [1, 2]
    assert offending("c.containers.list(all=True, ignore_removed=True)\nc.api.containers(all=True)\n") == []


def test_nothing_lists_docker_objects_then_inspects_them() -> None:
    found = {}
    for d in DIRS:
        for path in (ROOT / d).rglob("*.py"):
            if ".venv" in path.parts:
                continue
            hits = offending(path.read_text())
            if hits:
                found[str(path.relative_to(ROOT))] = hits
    assert not found, found
