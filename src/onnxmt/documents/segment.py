"""Text cut into sentences and the whitespace between them, and sentences joined again after translation.

Sentences come from sentencex (Wikimedia's segmenter; chosen by benchmarks/segment.py: the best boundary F1 of the
candidates on FLORES-200 English and Chinese paragraphs, and lossless: its pieces join back to the exact text).
Line breaks are hard boundaries, so a file keeps its lines, paragraphs and blank lines whatever the model does.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from sentencex import segment

# Where a sentence too long for the model may be cut, best first: after clause punctuation, then after a space.
CLAUSE_MARKS = frozenset(",;:，；：、—–)）»”")


@dataclass(frozen=True)
class Piece:
    """A sentence to translate (`translate`), or what is kept as it is: the whitespace around sentences, and
    pieces without a letter."""

    text: str
    translate: bool


def split_sentences(text: str, lang: str = "en") -> list[Piece]:
    """`text` as sentences and whitespace; `"".join(p.text for p in pieces) == text`."""
    pieces: list[Piece] = []
    space: list[str] = []  # whitespace since the last piece, joined once (a flood of blank lines stays linear)
    for line in text.splitlines(keepends=True):
        body = line.rstrip("\r\n")
        for sentence in segment(lang, body) if body.strip() else [body]:
            core = sentence.strip()
            start = sentence.find(core) if core else len(sentence)
            space.append(sentence[:start])
            if core:
                _add_space(pieces, space)
                # Nothing to translate without a letter ("---", "12:30", "* * *"): kept as it is.
                pieces.append(Piece(core, any(c.isalpha() for c in core)))
            space.append(sentence[start + len(core) :])
        space.append(line[len(body) :])
    _add_space(pieces, space)
    return pieces


def _add_space(pieces: list[Piece], space: list[str]) -> None:
    text = "".join(space)
    if text:
        pieces.append(Piece(text, False))
    space.clear()


def fit(pieces: list[Piece], count: Callable[[str], int], limit: int) -> list[Piece]:
    """Sentences longer than `limit` tokens (by `count`) cut on clause boundaries, else at spaces, else between
    characters, into parts that fit; never truncated. The parts are joined by the space that was between them."""
    out: list[Piece] = []
    for piece in pieces:
        if not piece.translate or count(piece.text) <= limit:
            out.append(piece)
        else:
            out += _cut_sentence(piece.text, count, limit)
    return out


def _cut_sentence(text: str, count: Callable[[str], int], limit: int) -> list[Piece]:
    """`text` as parts that fit and the whitespace between them. Linear in `text`: `count` sees stretches a few
    times as long as the part cut from them (`_window`), never the whole rest of the text."""
    out: list[Piece] = []
    start = 0
    while (window := _window(text, start, count, limit)) is not None:
        part = window[: _cut(window, count, limit)].rstrip()
        end = start + len(part)
        start = end
        while start < len(text) and text[start].isspace():
            start += 1
        out.append(Piece(part, True))
        if start > end:
            out.append(Piece(text[end:start], False))
    if start < len(text):
        out.append(Piece(text[start:], True))
    return out


def _window(text: str, start: int, count: Callable[[str], int], limit: int) -> str | None:
    """None when `text` from `start` on fits. Else the stretch from `start` that holds the next cut: twice as long
    as the first head of `limit`, 2 `limit`, 4 `limit`... characters that does not fit (twice: a head that ends
    inside a word can count more than a longer one). Doubling keeps what is counted to a few times that head."""
    size = max(limit, 1)
    while start + size < len(text) and count(text[start : start + size]) <= limit:
        size *= 2
    window = text[start : start + 2 * size]
    if not window or (start + 2 * size >= len(text) and count(window) <= limit):
        return None
    return window


def _cut(text: str, count: Callable[[str], int], limit: int) -> int:
    """Where to cut `text`: the last clause boundary whose head fits, else the last space, else the most
    characters that fit (binary search: `count` grows with the prefix). Heads are counted as they will be sent,
    without trailing whitespace."""

    def fits(end: int) -> bool:
        return count(text[:end].rstrip()) <= limit

    for boundaries in (_after(text, CLAUSE_MARKS), [i for i, c in enumerate(text) if c.isspace() and i > 0]):
        fitting = _last_fitting(boundaries, fits)
        if fitting is not None:
            return fitting
    low, high = 1, len(text) - 1
    while low < high:
        mid = (low + high + 1) // 2
        if fits(mid):
            low = mid
        else:
            high = mid - 1
    return low


def _after(text: str, marks: Iterable[str]) -> list[int]:
    return [i + 1 for i, c in enumerate(text[:-1]) if c in marks]


def _last_fitting(positions: list[int], fits: Callable[[int], bool]) -> int | None:
    """The last position whose prefix fits, by binary search over the sorted `positions`."""
    low, high, best = 0, len(positions) - 1, None
    while low <= high:
        mid = (low + high) // 2
        if fits(positions[mid]):
            best, low = positions[mid], mid + 1
        else:
            high = mid - 1
    return best


def join(pieces: Sequence[Piece], translations: Iterable[str]) -> str:
    """`pieces` with each sentence replaced by the next of `translations`, joined the target script's way."""
    out: list[str] = []
    texts = iter(translations)
    space = ""  # whitespace since the last sentence
    previous: str | None = None  # the last sentence's translation
    for piece in pieces:
        if not piece.translate:
            space += piece.text
            continue
        text = next(texts)
        out.append(separator(previous, space, text))
        out.append(text)
        space, previous = "", text
    out.append(space)
    return "".join(out)


def separator(previous: str | None, space: str, text: str) -> str:
    """What goes between two translated sentences that had `space` between them in the source: line breaks as
    they were; between Chinese or Japanese sentences nothing; elsewhere the space (a single space where the source,
    Chinese for instance, had none)."""
    if previous is None or "\n" in space or "\r" in space or space.strip():
        return space
    if not previous or not text or (is_cjk(previous[-1]) and is_cjk(text[0])):
        return "" if previous and text else space
    return space or " "


def is_cjk(char: str) -> bool:
    """A character of a script written without spaces between sentences (Han, kana, their punctuation)."""
    if not char:
        return False
    name = unicodedata.name(char, "")
    return name.startswith(("CJK", "HIRAGANA", "KATAKANA", "IDEOGRAPHIC", "FULLWIDTH")) or char in "。！？」』）】〕"
