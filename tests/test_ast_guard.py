"""tests/ast_guard.py: a parse during which a collection runs a finalizer that parses again."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from ast_guard import _AFFECTED

# A module-sized parse while reference cycles whose __del__ formats a traceback (which parses
# the failing line, as traceback does on 3.11) wait to be collected.
PROGRAM = """
import ast, sys, traceback
sys.path.insert(0, {tests!r})
if {guard!r}:
    import ast_guard
    ast_guard.install()
src = open(ast.__file__.replace("ast.py", "typing.py")).read()
class Cycle:
    def __del__(self):
        try:
            [][1]
        except IndexError:
            traceback.format_exc()
            ast.parse("a + b")
for _ in range(10):
    for _ in range(2000):
        a, b = Cycle(), Cycle()
        a.other, b.other = b, a
    del a, b
    ast.parse(src)
print("parsed")
"""


def run(guard: bool) -> subprocess.CompletedProcess:
    code = PROGRAM.format(tests=str(Path(__file__).parent), guard=guard)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)


def test_guarded_parse_survives_a_nested_parse_in_a_finalizer() -> None:
    proc = run(guard=True)
    assert proc.returncode == 0 and "parsed" in proc.stdout, proc.stderr


@pytest.mark.skipif(not _AFFECTED, reason="the CPython bug is fixed in 3.11.8")
def test_unguarded_parse_fails_on_this_python() -> None:
    """The guard is needed here: without it the same program hits the CPython bug."""
    proc = run(guard=False)
    assert proc.returncode != 0 and "AST constructor recursion depth mismatch" in proc.stderr
