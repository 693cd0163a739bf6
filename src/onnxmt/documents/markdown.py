"""Markdown translated line by line, its syntax kept: code blocks (fenced, indented) and raw HTML blocks found by
markdown-it-py (CommonMark) are left as they are; in other lines the block markers (`#`, `>`, list bullets, table
pipes) stay in front, and code spans, link and image targets, autolinks, inline HTML and emphasis markers are
kept as marks that go back around the translated words (inline.py)."""

from __future__ import annotations

import re
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Sequence
from itertools import accumulate

from markdown_it import MarkdownIt

from .inline import cut, place

Translate = Callable[[Sequence[str]], list[str]]
KEPT_BLOCKS = ("fence", "code_block", "html_block")
_BACKTICKS = re.compile("`+")


def _kept_lines(source: str) -> set[int]:
    kept: set[int] = set()
    # Blocks alone: their inline content is not needed, and parsing it costs more than all the rest.
    for token in MarkdownIt("commonmark").enable("table").disable("inline").parse(source):
        if token.type in KEPT_BLOCKS and token.map:
            kept.update(range(*token.map))
    return kept


# One block marker at the start of a line and the spaces after it: a `>`, a task or list bullet, a table's `|`, a
# heading's `#`s (1 to 6, then whitespace), a list number (1 to 9 digits, then `. ` or `) `).
_MARKER = re.compile(r"(?:>|[-*] \[[ x]\] |[-*+|] |#{1,6}(?=\s)|[0-9]{1,9}[.)](?= ))[ \t]*")


def _prefix(line: str) -> int:
    """Length of the line's block markers: indentation, `>`s, a heading's `#`s, a list bullet or number, `|`."""
    i = len(line) - len(line.lstrip())
    while marker := _MARKER.match(line, i):
        i = marker.end()
    return i


class _Line:
    """A line's text and the searches `_atom_at` makes in it while reading it from left to right, each linear
    over the whole line: what a search found stays the answer until the reading passes it, and what it did not
    find is not further on either (else every `<`, `](` or backtick run without its closing one would search to
    the end of the line)."""

    def __init__(self, text: str) -> None:
        self.text = text
        self._found: dict[str, int] = {}
        runs = list(_BACKTICKS.finditer(text))
        self._run_starts = [run.start() for run in runs]
        self._run_lengths = [len(run.group()) for run in runs]
        # The longest run from each run on: where none is as long as an opening run, it is unclosed, unsearched.
        self._longest = list(accumulate(reversed(self._run_lengths), max))[::-1]

    def find(self, char: str, start: int) -> int:
        found = self._found.get(char)
        if found is None or 0 <= found < start:
            found = self._found[char] = self.text.find(char, start)
        return found

    def run(self, start: int) -> int:
        """How many backticks there are from `start` (a backtick) on."""
        r = bisect_right(self._run_starts, start) - 1
        return self._run_starts[r] + self._run_lengths[r] - start

    def closing(self, start: int, length: int) -> int:
        """Where `length` backticks are next, from `start` (not inside a run): -1 for nowhere."""
        r = bisect_left(self._run_starts, start)
        if r == len(self._run_starts) or self._longest[r] < length:
            return -1
        while self._run_lengths[r] < length:  # runs skipped here are inside the code span it closes
            r += 1
        return self._run_starts[r]


def _atoms(text: str) -> list[tuple[int, int]]:
    """(start, end) of the spans of `text` kept as they are, in order."""
    line = _Line(text)
    spans: list[tuple[int, int]] = []
    i = 0
    while i < len(text):
        end = _atom_at(line, i)
        if end > i:
            spans.append((i, end))
            i = end
        else:
            i += 1
    return spans


def _atom_at(line: _Line, i: int) -> int:
    text = line.text
    c = text[i]
    if c == "\\" and i + 1 < len(text):
        return i + 2
    if c == "`":
        run = line.run(i)
        close = line.closing(i + run, run)
        return close + run if close >= 0 else i + run
    if text.startswith("]:", i):  # a link reference definition: its target (and title) to the end of the line
        return len(text)
    if text.startswith("](", i):
        close = line.find(")", i + 2)
        return close + 1 if close >= 0 else i + 2
    if c == "<":
        close = line.find(">", i)
        return close + 1 if close > i + 1 and " " not in text[i + 1 : i + 2] else i
    if text.startswith("![", i):
        return i + 2
    if c in "[]|" or text.startswith(("**", "__", "~~"), i):
        return i + (2 if text[i : i + 2] in ("**", "__", "~~") else 1)
    if c in "*_" and (i == 0 or not text[i - 1].isalnum() or i + 1 == len(text) or not text[i + 1].isalnum()):
        return i + 1
    return i


def _split(content: str) -> tuple[str, list[str], list[int]]:
    """`content` as the text to translate, the atoms taken out of it, and where each was in the text."""
    chunks: list[str] = []
    atoms: list[str] = []
    marks: list[int] = []
    position = length = 0
    for a, b in _atoms(content):
        chunks.append(content[position:a])
        length += a - position
        marks.append(length)
        atoms.append(content[a:b])
        position = b
    chunks.append(content[position:])
    return "".join(chunks), atoms, marks


def translate_markdown(source: str, translate: Translate) -> str:
    texts, rebuild = prepare_markdown(source)
    return rebuild(translate(texts) if texts else [])


def prepare_markdown(source: str) -> tuple[list[str], Callable[[list[str]], str]]:
    """The texts to translate in `source`, and the function that writes it again with their translations."""
    # Lines as markdown-it counts them: by "\n" alone.
    lines = [line + "\n" for line in source.split("\n")]
    lines[-1] = lines[-1][:-1]
    kept = _kept_lines(source)
    jobs: list[tuple[int, str, list[str], list[int], str]] = []  # line, prefix, atoms, marks, ending
    texts: list[str] = []
    for n, line in enumerate(lines):
        body = line.rstrip("\r\n")
        if n in kept or not any(c.isalpha() for c in body):
            continue
        start = _prefix(body)
        text, atoms, marks = _split(body[start:])
        if not any(c.isalpha() for c in text):
            continue
        jobs.append((n, body[:start], atoms, marks, line[len(body) :]))
        texts.append(text)

    def rebuild(translated: list[str]) -> str:
        out = list(lines)
        for (n, prefix, atoms, marks, ending), text, translation in zip(jobs, texts, translated, strict=True):
            parts = cut(translation, place(marks, len(text), translation))
            rebuilt = parts[0] + "".join(atom + part for atom, part in zip(atoms, parts[1:], strict=True))
            out[n] = prefix + rebuilt + ending
        return "".join(out)

    return texts, rebuild
