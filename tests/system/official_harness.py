"""A thin wrapper that runs the official SWE-bench harness (the pinned swebench's
`python -m swebench.harness.run_evaluation`, unchanged: its own argument parser, main(), image
lookup, patch application, eval script, log parser and report) on repositories it does not know.

swebench 4.1 has no plug-in point for new repositories: a repo is known when it is in three
module-level dicts (MAP_REPO_VERSION_TO_SPECS, MAP_REPO_TO_EXT, MAP_REPO_TO_PARSER), which
every harness module imports by reference. `register(rows)` adds swarl's bundled repos to them —
the only thing that is swarl's — and `python official_harness.py ROWS.jsonl ARGS...` registers
the rows' repos, then runs the harness's module as __main__ with ARGS. `registered(rows)` is
register for a block, the maps restored after it (a test process imports the harness too).

What a registered repo says: a Python repo ("py": the harness's own Python eval script), whose
tests run with TEST_CMD (the harness appends the test files of the row's test_patch, as for every
SWE-bench repo), graded by the harness's parse_log_<row's log_parser> (pytest for the bundled
suite). `python` is only read when building an environment image, which a run with a namespace
never does.
"""

from __future__ import annotations

import contextlib
import copy
import json
import runpy
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

# What the bundled suite's own eval scripts run (swe.tasks: `python3 -m pytest ... <test file>`).
TEST_CMD = "python3 -m pytest -rA -p no:cacheprovider"


def register(rows: list[dict[str, Any]]) -> None:
    """Make the harness know each row's repo and version; a repo and version SWE-bench itself
    ships is never redefined (ValueError)."""
    from swebench.harness.constants import MAP_REPO_TO_EXT, MAP_REPO_VERSION_TO_SPECS
    from swebench.harness.log_parsers import MAP_REPO_TO_PARSER
    from swebench.harness.log_parsers import python as py_parsers

    for row in rows:
        repo, version = row["repo"], row["version"]
        spec = {"python": "3.11", "test_cmd": TEST_CMD}
        known = MAP_REPO_VERSION_TO_SPECS.get(repo, {}).get(version)
        if known is not None and known != spec:
            raise ValueError(f"repo: {repo} {version} is SWE-bench's own; not redefined")
        parser = getattr(py_parsers, f"parse_log_{row.get('log_parser') or 'pytest'}")
        MAP_REPO_VERSION_TO_SPECS.setdefault(repo, {})[version] = spec
        MAP_REPO_TO_EXT[repo] = "py"
        MAP_REPO_TO_PARSER[repo] = parser


@contextlib.contextmanager
def registered(rows: list[dict[str, Any]]) -> Iterator[None]:
    from swebench.harness.constants import MAP_REPO_TO_EXT, MAP_REPO_VERSION_TO_SPECS
    from swebench.harness.log_parsers import MAP_REPO_TO_PARSER

    maps = (MAP_REPO_VERSION_TO_SPECS, MAP_REPO_TO_EXT, MAP_REPO_TO_PARSER)
    saved = [copy.copy(m) for m in maps]
    try:
        register(rows)
        yield
    finally:
        for m, old in zip(maps, saved, strict=True):
            m.clear()
            m.update(old)


def main() -> None:
    rows_path, *args = sys.argv[1:]
    register([json.loads(line) for line in Path(rows_path).read_text().splitlines() if line.strip()])
    sys.argv = ["swebench.harness.run_evaluation", *args]
    runpy.run_module("swebench.harness.run_evaluation", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
