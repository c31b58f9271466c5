"""Title casing for headlines."""

from __future__ import annotations

SMALL_WORDS = frozenset({"a", "an", "and", "at", "by", "for", "in", "of", "on", "or", "the", "to"})


def title_case(text: str, small_words: frozenset[str] = SMALL_WORDS) -> str:
    """Capitalise every word except small words, which stay lower-case unless first or last."""
    words = text.lower().split()
    out = []
    for i, word in enumerate(words):
        if word in small_words and i != 0 and i != len(words) - 1:
            out.append(word)
        else:
            out.append(word.capitalize())
    return " ".join(out)
