"""A guard against CPython < 3.11.8's "SystemError: AST constructor recursion depth mismatch".

On 3.11.0–3.11.7 the AST constructor keeps its recursion depth in per-interpreter state. When a
garbage collection runs during `ast.parse` and a finalizer parses again (formatting a traceback
parses the failing line; hypothesis parses lambdas to describe them), the nested parse resets that
depth and the outer one fails with SystemError (gh-106905; reproduced here: a cycle whose __del__
formats a traceback, collected during ast.parse of a large module). pytest's assertion rewriting,
hypothesis and traceback all call `ast.parse` by attribute, so the tests wrap it: no collection
runs during a parse, hence no nested parse. Fixed upstream in 3.11.8; a no-op there.
"""

from __future__ import annotations

import ast
import functools
import gc
import sys
from typing import Any

_AFFECTED = (3, 11) <= sys.version_info[:3] < (3, 11, 8)


def install() -> None:
    if not _AFFECTED or getattr(ast.parse, "_swarl_gc_guard", False):
        return
    parse = ast.parse

    @functools.wraps(parse)
    def guarded(*args: Any, **kwargs: Any) -> Any:
        enabled = gc.isenabled()
        gc.disable()
        try:
            return parse(*args, **kwargs)
        finally:
            if enabled:
                gc.enable()

    guarded._swarl_gc_guard = True  # type: ignore[attr-defined]
    ast.parse = guarded
