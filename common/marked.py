"""Generated sections of hand-written Markdown (docs/*.md, benchmarks/RESULTS.md): a block between
two marker comments that a script rewrites while the text around it stays as people wrote it."""

from __future__ import annotations


def replace_marked(text: str, begin: str, end: str, block: str, absent: str = "") -> str:
    """`text` with everything from marker `begin` through the first `end` after it (both included)
    replaced by `block`, which carries its own markers. Without both markers `block` is appended,
    after `absent` (a heading, say), so a first run creates the section."""
    i = text.find(begin)
    j = text.find(end, i + len(begin)) if i >= 0 else -1
    if j < 0:
        return text.rstrip("\n") + "\n\n" + absent + block + "\n"
    return text[:i] + block + text[j + len(end):]
