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
    for line in text.splitlines(keepends=True):
        body = line.rstrip("\r\n")
        for sentence in segment(lang, body) if body.strip() else [body]:
            core = sentence.strip()
            start = sentence.find(core) if core else len(sentence)
            _add_space(pieces, sentence[:start])
            if core:
                # Nothing to translate without a letter ("---", "12:30", "* * *"): kept as it is.
                pieces.append(Piece(core, any(c.isalpha() for c in core)))
            _add_space(pieces, sentence[start + len(core) :])
        _add_space(pieces, line[len(body) :])
    return pieces


def _add_space(pieces: list[Piece], space: str) -> None:
    if not space:
        return
    if pieces and not pieces[-1].translate and not pieces[-1].text.strip():
        pieces[-1] = Piece(pieces[-1].text + space, False)
    else:
        pieces.append(Piece(space, False))


def fit(pieces: list[Piece], count: Callable[[str], int], limit: int) -> list[Piece]:
    """Sentences longer than `limit` tokens (by `count`) cut on clause boundaries, else at spaces, else between
    characters, into parts that fit; never truncated. The parts are joined by the space that was between them."""
    out: list[Piece] = []
    for piece in pieces:
        if not piece.translate or count(piece.text) <= limit:
            out.append(piece)
            continue
        rest = piece.text
        while count(rest) > limit:
            cut = _cut(rest, count, limit)
            head, rest = rest[:cut], rest[cut:]
            out.append(Piece(head.rstrip(), True))
            space = head[len(head.rstrip()) :] + rest[: len(rest) - len(rest.lstrip())]
            rest = rest.lstrip()
            _add_space(out, space)
        if rest:
            out.append(Piece(rest, True))
    return out


def _cut(text: str, count: Callable[[str], int], limit: int) -> int:
    """Where to cut `text`: the last clause boundary whose head fits, else the last space, else the most
    characters that fit (binary search: `count` grows with the prefix)."""
    for boundaries in (_after(text, CLAUSE_MARKS), [i for i, c in enumerate(text) if c.isspace() and i > 0]):
        fitting = _last_fitting(boundaries, text, count, limit)
        if fitting is not None:
            return fitting
    low, high = 1, len(text) - 1
    while low < high:
        mid = (low + high + 1) // 2
        if count(text[:mid]) <= limit:
            low = mid
        else:
            high = mid - 1
    return low


def _after(text: str, marks: Iterable[str]) -> list[int]:
    return [i + 1 for i, c in enumerate(text[:-1]) if c in marks]


def _last_fitting(positions: list[int], text: str, count: Callable[[str], int], limit: int) -> int | None:
    """The last position whose prefix fits, by binary search over the sorted `positions`."""
    low, high, best = 0, len(positions) - 1, None
    while low <= high:
        mid = (low + high) // 2
        if count(text[: positions[mid]]) <= limit:
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
