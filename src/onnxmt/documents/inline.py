"""Marks inside a text (inline tags, run boundaries, code spans) carried over to its translation.

A model translates plain text; what sat between its words comes back at the place of the translation that is as
far through it as the mark was through the source, moved to the nearest word boundary (a space, punctuation, any
place between Chinese characters). That keeps every mark, in order, and around the same words wherever the two
languages keep their order; no alignment model is involved.
"""

from __future__ import annotations

import unicodedata
from bisect import bisect_left
from collections.abc import Sequence
from itertools import pairwise

from .segment import is_cjk


def place(marks: Sequence[int], source_length: int, translation: str) -> list[int]:
    """Positions in `translation` for `marks` (non-decreasing offsets into a source text of `source_length`)."""
    length = len(translation)
    inside = any(0 < mark < source_length for mark in marks)
    boundaries = _boundaries(translation) if inside else []
    out: list[int] = []
    for mark in marks:
        if mark <= 0:
            position = 0
        elif mark >= source_length:
            position = length
        else:
            position = _nearest(boundaries, round(mark * length / source_length))
        out.append(max(position, out[-1] if out else 0))
    return out


def _boundaries(text: str) -> list[int]:
    """The word boundaries of `text`, in order: found once for all marks (a search outward from each mark would
    be quadratic in a long text without boundaries)."""
    out = [0]
    for i, char in enumerate(text):
        if char.isspace() or _loose(char):
            if out[-1] < i:
                out.append(i)
            out.append(i + 1)
    if out[-1] < len(text):
        out.append(len(text))
    return out


def _nearest(boundaries: list[int], position: int) -> int:
    """The boundary nearest `position` (0 <= position <= the last boundary), the earlier of two as near."""
    i = bisect_left(boundaries, position)
    if boundaries[i] == position:
        return position
    before, after = boundaries[i - 1], boundaries[i]
    return before if position - before <= after - position else after


def _loose(char: str) -> bool:
    """A character a mark may stand next to without splitting a word: punctuation, Chinese or Japanese."""
    return unicodedata.category(char).startswith("P") or is_cjk(char)


def cut(translation: str, positions: Sequence[int]) -> list[str]:
    """`translation` cut at `positions`: len(positions) + 1 parts."""
    bounds = [0, *positions, len(translation)]
    return [translation[a:b] for a, b in pairwise(bounds)]
