"""Record a benchmark's figures in benchmarks/RESULTS.md (each benchmark owns one section)."""

from __future__ import annotations

import json
import platform
import time
from pathlib import Path

from common.marked import replace_marked
from common.provenance import code_version, describe

RESULTS = Path(__file__).resolve().parent / "RESULTS.md"
CODE = code_version()  # read when the benchmark starts, before it writes its own outputs into the checkout
HEADER = "# Benchmark results\n\nEach section is rewritten by its script (`.venv/bin/python benchmarks/<name>.py`).\n"


def record(name: str, table_md: str, summary: dict, notes: str = "") -> None:
    """Replace the section of `name` in RESULTS.md with this run's table and summary JSON."""
    text = RESULTS.read_text() if RESULTS.exists() else HEADER
    stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    body = (
        f"<!-- {name}:start -->\n## {name}\n\n"
        f"Run {stamp} at {describe(CODE)} on {platform.machine()}, {_cores()} cores, "
        f"Python {platform.python_version()}.\n\n"
        f"{table_md.strip()}\n\n"
        + (f"{notes.strip()}\n\n" if notes else "")
        + f"```json\n{json.dumps(summary, sort_keys=True)}\n```\n<!-- {name}:end -->"
    )
    RESULTS.write_text(replace_marked(text, f"<!-- {name}:start -->", f"<!-- {name}:end -->", body))


def markdown_table(headers: list[str], rows: list[list[object]]) -> str:
    def fmt(v: object) -> str:
        return f"{v:.3g}" if isinstance(v, float) else str(v)

    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(fmt(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def _cores() -> int:
    import os

    return os.cpu_count() or 0
