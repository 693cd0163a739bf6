"""Marks inside a text (inline tags, run boundaries, code spans) carried over to its translation.

A model translates plain text; what sat between its words comes back at the place of the translation that is as
far through it as the mark was through the source, moved to the nearest word boundary (a space, punctuation, any
place between Chinese characters). That keeps every mark, in order, and around the same words wherever the two
languages keep their order; no alignment model is involved.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Sequence
from itertools import pairwise

from .segment import is_cjk


def place(marks: Sequence[int], source_length: int, translation: str) -> list[int]:
    """Positions in `translation` for `marks` (non-decreasing offsets into a source text of `source_length`)."""
    length = len(translation)
    out: list[int] = []
    for mark in marks:
        if mark <= 0:
            position = 0
        elif mark >= source_length:
            position = length
        else:
            position = _boundary(translation, round(mark * length / source_length))
        out.append(max(position, out[-1] if out else 0))
    return out


def _boundary(text: str, position: int) -> int:
    """The word boundary nearest `position` (any character boundary between Chinese or Japanese characters)."""
    for distance in range(len(text) + 1):
        for candidate in (position - distance, position + distance):
            if 0 <= candidate <= len(text) and _is_boundary(text, candidate):
                return candidate
    return position


def _is_boundary(text: str, i: int) -> bool:
    if i in (0, len(text)):
        return True
    before, after = text[i - 1], text[i]
    return before.isspace() or after.isspace() or _loose(before) or _loose(after)


def _loose(char: str) -> bool:
    """A character a mark may stand next to without splitting a word: punctuation, Chinese or Japanese."""
    return unicodedata.category(char).startswith("P") or is_cjk(char)


def cut(translation: str, positions: Sequence[int]) -> list[str]:
    """`translation` cut at `positions`: len(positions) + 1 parts."""
    bounds = [0, *positions, len(translation)]
    return [translation[a:b] for a, b in pairwise(bounds)]
