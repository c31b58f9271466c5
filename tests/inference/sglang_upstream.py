"""The pinned SGLang release's own source, read for the contract tests (test_sglang_contract.py).

The pin is the `sglang==X` of pyproject.toml's `gpu` extra, so moving the pin re-runs the
contract against the new release. Its wheel is fetched once with `pip download --no-deps` into
.swarl/cache/upstream (reused while it is there; never installed, never imported) and read
with `ast`: the routes of srt/entrypoints/http_server.py, the request classes of
srt/managers/io_struct.py (msgspec structs and dataclasses, fields inherited within the module),
the JSON contract of api/v1/api_types.py, and dict literals a handler answers with.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
import tempfile
import tomllib
import zipfile
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
CACHE = REPO / ".swarl" / "cache" / "upstream"
HTTP_SERVER = "sglang/srt/entrypoints/http_server.py"
IO_STRUCT = "sglang/srt/managers/io_struct.py"
API_TYPES = "sglang/api/v1/api_types.py"
SAMPLING = "sglang/srt/sampling/sampling_params.py"
TOKENIZER_MANAGER = "sglang/srt/managers/tokenizer_manager.py"
WEIGHT_VERSIONS = "sglang/srt/utils/weight_versions.py"
ROUTE_DECORATORS = {"get", "post", "put", "delete", "patch", "api_route"}


class UpstreamUnavailable(RuntimeError):
    """The pinned wheel could not be fetched (no network to the package index, no such release)."""


def pinned(package: str, pyproject: Path = REPO / "pyproject.toml") -> str:
    """The exact version of `package` in the `gpu` extra; ValueError unless pinned with ==."""
    from packaging.requirements import Requirement

    extras = tomllib.loads(pyproject.read_text())["project"]["optional-dependencies"]
    for spec in extras.get("gpu", []):
        req = Requirement(spec)
        if req.name.lower() != package.lower():
            continue
        pins = [s.version for s in req.specifier if s.operator == "=="]
        if len(pins) != 1 or len(req.specifier) != 1:
            raise ValueError(f"{pyproject.name}: the gpu extra must pin {package} exactly (==X), got {spec!r}")
        return pins[0]
    raise ValueError(f"{pyproject.name}: the gpu extra has no {package} requirement")


def wheel(package: str, version: str, cache: Path = CACHE, timeout_s: float = 300) -> Path:
    """The release's wheel in `cache`, downloaded (no dependencies, not installed) if absent."""
    stem = re.sub(r"[-_.]+", "_", package).lower()
    found = sorted(cache.glob(f"{stem}-{version}-*.whl"))
    if found:
        return found[0]
    cache.mkdir(parents=True, exist_ok=True)
    # into a directory of its own, then renamed: test workers downloading at once never see half a file
    with tempfile.TemporaryDirectory(dir=cache, prefix=".download-") as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
               "--disable-pip-version-check", "-q", "-d", tmp, f"{package}=={version}"]
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired as e:
            raise UpstreamUnavailable(f"pip download {package}=={version}: no answer in {timeout_s:.0f}s") from e
        got = sorted(Path(tmp).glob(f"{stem}-{version}-*.whl"))
        if done.returncode != 0 or not got:
            raise UpstreamUnavailable(f"pip download {package}=={version} failed ({done.returncode}): "
                                      f"{(done.stderr or done.stdout).strip()[-1500:]}")
        os.replace(got[0], cache / got[0].name)
    return cache / got[0].name


@dataclass(frozen=True)
class Route:
    path: str
    methods: frozenset[str]
    handler: str
    body: str | None  # the request class its JSON body is parsed into
    deprecated: bool  # still served, documented as deprecated
    gone: bool  # deprecated to a 404: not served in any useful sense


@dataclass(frozen=True)
class Answer:
    """One response a handler returns: the keys of its JSON object (None: not a dict literal,
    e.g. plain text) and the status codes it may carry."""

    keys: frozenset[str] | None
    statuses: frozenset[int]


@dataclass(frozen=True)
class FieldSpec:
    name: str
    annotation: str
    required: bool


class Upstream:
    """One release's source, read from its wheel."""

    def __init__(self, path: Path, version: str) -> None:
        self.path, self.version = path, version

    def source(self, member: str) -> str:
        with zipfile.ZipFile(self.path) as z:
            return z.read(member).decode()

    def tree(self, member: str) -> ast.Module:
        return ast.parse(self.source(member), filename=member)

    @cached_property
    def routes(self) -> list[Route]:
        src = self.source(HTTP_SERVER)
        out = []
        for fn in ast.walk(ast.parse(src)):
            if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            doc = (ast.get_docstring(fn) or "").lower()
            text = ast.get_source_segment(src, fn) or ""
            deprecated = "deprecated" in doc
            gone = deprecated and ("404" in text or "NOT_FOUND" in text)
            for dec in fn.decorator_list:
                route = _route_of(dec)
                if route is not None:
                    path, methods = route
                    out.append(Route(path, methods, fn.name, _body_class(fn), deprecated, gone))
        return out

    def served(self, path: str) -> list[Route]:
        return [r for r in self.routes if r.path == path and not r.gone]

    def classes(self, member: str) -> dict[str, dict[str, FieldSpec]]:
        """Every class of `member` with its fields (annotated class attributes, the module's own
        base classes' first), each required when it has no default."""
        tree = self.tree(member)
        aliases = _aliases(tree)
        own: dict[str, tuple[list[str], dict[str, FieldSpec]]] = {}
        for node in tree.body:
            if not isinstance(node, ast.ClassDef):
                continue
            fields = {}
            for stmt in node.body:
                if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
                    ann = _expand(ast.unparse(stmt.annotation), aliases)
                    if ann.startswith(("ClassVar", "typing.ClassVar")):
                        continue
                    fields[stmt.target.id] = FieldSpec(stmt.target.id, ann, stmt.value is None)
            own[node.name] = ([ast.unparse(b) for b in node.bases], fields)

        def resolve(name: str, seen: frozenset[str] = frozenset()) -> dict[str, FieldSpec]:
            bases, fields = own[name]
            merged: dict[str, FieldSpec] = {}
            for b in bases:
                if b in own and b not in seen:
                    merged.update(resolve(b, seen | {name}))
            merged.update(fields)
            return merged

        return {name: resolve(name) for name in own}

    def function(self, member: str, function: str) -> ast.FunctionDef | ast.AsyncFunctionDef:
        for fn in ast.walk(self.tree(member)):
            if isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef) and fn.name == function:
                return fn
        raise KeyError(f"{member}: no function {function}")

    def dict_keys(self, member: str, function: str) -> set[str]:
        """The string keys of the dict literals in `function` (what a handler answers with)."""
        return {k for d in ast.walk(self.function(member, function)) if isinstance(d, ast.Dict)
                for k in _str_keys(d)}

    def keys_written(self, member: str, function: str, target: str) -> set[str]:
        """The keys `function` gives the dict named `target`: `target = {...}`,
        `target["k"] = ...` and `target.update({...})`."""
        keys: set[str] = set()
        for node in ast.walk(self.function(member, function)):
            if isinstance(node, ast.Assign | ast.AnnAssign):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for t in targets:
                    if _named(t, target) and isinstance(node.value, ast.Dict):
                        keys |= _str_keys(node.value)
                    if isinstance(t, ast.Subscript) and _named(t.value, target) \
                            and isinstance(t.slice, ast.Constant) and isinstance(t.slice.value, str):
                        keys.add(t.slice.value)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "update" \
                    and _named(node.func.value, target) and node.args and isinstance(node.args[0], ast.Dict):
                keys |= _str_keys(node.args[0])
        return keys

    def answers(self, member: str, function: str) -> list[Answer]:
        """Every `...Response(content, status_code=...)` the handler returns: the content's keys
        (a dict literal, or a name assigned one in the handler) and its status codes."""
        fn = self.function(member, function)
        named: dict[str, frozenset[str]] = {}
        for node in ast.walk(fn):
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Dict):
                for t in node.targets:
                    if isinstance(t, ast.Name):
                        named[t.id] = frozenset(_str_keys(node.value))
        out = []
        for call in ast.walk(fn):
            if not (isinstance(call, ast.Call) and ast.unparse(call.func).endswith("Response")):
                continue
            kw = {k.arg: k.value for k in call.keywords}
            content = call.args[0] if call.args else kw.get("content")
            keys = None
            if isinstance(content, ast.Dict):
                keys = frozenset(_str_keys(content))
            elif isinstance(content, ast.Name):
                keys = named.get(content.id)
            status = kw.get("status_code")
            out.append(Answer(keys, frozenset(_statuses(status)) if status is not None else frozenset({200})))
        return out


def _str_keys(d: ast.Dict) -> set[str]:
    return {k.value for k in d.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)}


def _named(node: ast.expr, name: str) -> bool:
    return isinstance(node, ast.Name) and node.id == name


def _statuses(node: ast.expr) -> set[int]:
    """The status codes an expression may be: 200, HTTPStatus.OK, `a if c else b`."""
    from http import HTTPStatus

    if isinstance(node, ast.Constant) and isinstance(node.value, int):
        return {node.value}
    if isinstance(node, ast.Attribute) and ast.unparse(node.value) == "HTTPStatus":
        return {HTTPStatus[node.attr].value}
    if isinstance(node, ast.IfExp):
        return _statuses(node.body) | _statuses(node.orelse)
    raise ValueError(f"status code {ast.unparse(node)!r}: not a literal this reader knows")


def _aliases(tree: ast.Module) -> dict[str, str]:
    """Module-level type aliases (`TokenIds = List[int]`) by name, as text."""
    out = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name) \
                and isinstance(node.value, ast.Subscript | ast.BinOp):
            out[node.targets[0].id] = ast.unparse(node.value)
    return out


def _expand(annotation: str, aliases: dict[str, str], rounds: int = 6) -> str:
    """`annotation` with the aliases it names written out (nested ones too)."""
    for _ in range(rounds):
        expanded = re.sub(r"\b[A-Za-z_][A-Za-z0-9_]*\b", lambda m: aliases.get(m.group(0), m.group(0)), annotation)
        if expanded == annotation:
            break
        annotation = expanded
    return annotation


def _literal_path(node: ast.expr) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    # os.environ.get("SGLANG_..._ROUTE", "/default"): the default is what is served
    if isinstance(node, ast.Call) and ast.unparse(node.func) in ("os.environ.get", "os.getenv") \
            and len(node.args) == 2:
        return _literal_path(node.args[1])
    return None


def _route_of(dec: ast.expr) -> tuple[str, frozenset[str]] | None:
    if not (isinstance(dec, ast.Call) and isinstance(dec.func, ast.Attribute)
            and isinstance(dec.func.value, ast.Name) and dec.func.value.id == "app"
            and dec.func.attr in ROUTE_DECORATORS and dec.args):
        return None
    path = _literal_path(dec.args[0])
    if path is None:
        return None
    if dec.func.attr != "api_route":
        return path, frozenset({dec.func.attr.upper()})
    for kw in dec.keywords:
        if kw.arg == "methods":
            return path, frozenset(str(m).upper() for m in ast.literal_eval(kw.value))
    return path, frozenset({"GET"})  # FastAPI's default


def _body_class(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> str | None:
    for arg in fn.args.args:
        ann = arg.annotation
        if ann is None:
            continue
        if isinstance(ann, ast.Subscript) and ast.unparse(ann.value) == "Annotated":
            elts = ann.slice.elts if isinstance(ann.slice, ast.Tuple) else [ann.slice]
            ann = elts[0]
        name = ast.unparse(ann)
        if name.endswith(("ReqInput", "Req", "Request")) and name not in ("Request", "fastapi.Request"):
            return name
    return None


def type_fits(annotation: str, value: Any, structs: Iterable[str] = ()) -> bool:
    """A cheap check that a JSON value fits an annotation's text (Optional, Union, List, Dict,
    Literal, the scalars; a JSON object also fits one of the module's `structs`); Any fits
    everything."""
    ann = annotation.replace("typing.", "")
    if re.search(r"\bAny\b", ann):
        return True
    if value is None:
        return "Optional" in ann or "None" in ann
    if isinstance(value, bool):
        return "bool" in ann
    if isinstance(value, int):
        return bool(re.search(r"\b(int|float)\b", ann))
    if isinstance(value, float):
        return "float" in ann
    if isinstance(value, str):
        literals = re.findall(r"Literal\[([^\]]*)\]", ann)
        if literals and not re.search(r"\bstr\b", ann):
            return any(repr(value) in lit or f'"{value}"' in lit for lit in literals)
        return bool(re.search(r"\bstr\b", ann))
    if isinstance(value, list):
        return bool(re.search(r"\b(List|list|Sequence)\b", ann))
    if isinstance(value, dict):
        return bool(re.search(r"\b(Dict|dict|Mapping)\b", ann)) or any(
            re.search(rf"\b{re.escape(s)}\b", ann) for s in structs)
    return False
