"""HTML translated with the standard library's parser: text translated, markup kept byte for byte.

The page is read as a stream of events (tags, text, comments...), each with the exact source text it came from,
so attributes, entities outside text, comments and doctype are written back unchanged. Text between block
boundaries (any tag that is not inline) is one unit: its inline tags (`<b>`, `<a href>`, `<i>`...) are taken out,
the unit is translated sentence by sentence, and the tags go back in at the same relative places (inline.py).
Everything inside `<script>`, `<style>`, `<code>`, `<pre>`, `<textarea>` is left as it is.
"""

from __future__ import annotations

import html
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from html.parser import HTMLParser
from itertools import groupby

from .inline import cut, place

INLINE = frozenset("a abbr b bdi bdo cite data dfn em font i ins del mark q s small span strong sub sup time u".split())
UNTOUCHED = frozenset("script style code pre textarea kbd samp svg math template".split())
VOID = frozenset("area base br col embed hr img input link meta param source track wbr".split())

Translate = Callable[[Sequence[str]], list[str]]


@dataclass(frozen=True)
class Event:
    kind: str  # "start", "end", "startend", "data", "other"
    tag: str
    raw: str


class _Events(HTMLParser):
    """Parser events with their raw source text, cut from the source at the parser's positions.

    The source is fed whole, so a construct the parser finds unclosed runs to the end of the document, as in a
    browser (an unclosed comment swallows the rest): it is one "other" event. Left to `close`, the parser would
    take it as text up to the next `>` or `<` and parse on, searching the rest again for each unclosed construct
    after it: quadratic (`<!--` or `<a b='` repeated). Character references stay in the text (`convert_charrefs`),
    unescaped with it rather than each an event."""

    def __init__(self, source: str) -> None:
        super().__init__(convert_charrefs=True)
        self.source = source
        self.events: list[tuple[int, str, str]] = []  # (offset, kind, tag)
        self._unclosed_section = False  # a `<![` section was found without its end
        self._lines = [0]  # where each line starts; the parser counts lines by "\n" alone
        for line in source.split("\n")[:-1]:
            self._lines.append(self._lines[-1] + len(line) + 1)

    def _offset(self) -> int:
        line, column = self.getpos()
        return self._lines[line - 1] + column

    def _add(self, kind: str, tag: str = "") -> None:
        self.events.append((self._offset(), kind, tag))

    def _to_the_end(self, end: int) -> int:
        """`end`, or the end of the document (as one "other" event) where the parser found no end (-1)."""
        if end >= 0:
            return end
        self._add("other")
        return len(self.rawdata)

    def parse_starttag(self, i: int) -> int:
        return self._to_the_end(super().parse_starttag(i))

    def parse_endtag(self, i: int) -> int:
        return self._to_the_end(super().parse_endtag(i))

    def parse_comment(self, i: int, report: bool = True) -> int:
        return self._to_the_end(super().parse_comment(i, report))

    def parse_pi(self, i: int) -> int:
        return self._to_the_end(super().parse_pi(i))

    def parse_html_declaration(self, i: int) -> int:
        if not self.rawdata.startswith("<![", i):
            return self._to_the_end(super().parse_html_declaration(i))
        # A `<![` section without its `]]>` (or `]>`) is what a browser makes of it: a comment to the next `>`. Once
        # one has none, the later ones are not searched for theirs (each search would run to the end again).
        end = -1 if self._unclosed_section else super().parse_html_declaration(i)
        if end < 0:
            self._unclosed_section = True
            end = self.parse_bogus_comment(i)
        return self._to_the_end(end)

    def handle_starttag(self, tag: str, attrs: object) -> None:
        self._add("start", tag)

    def handle_startendtag(self, tag: str, attrs: object) -> None:
        self._add("startend", tag)

    def handle_endtag(self, tag: str) -> None:
        self._add("end", tag)

    def handle_data(self, data: str) -> None:
        self._add("data")

    def handle_comment(self, data: str) -> None:
        self._add("other")

    def handle_decl(self, decl: str) -> None:
        self._add("other")

    def handle_pi(self, data: str) -> None:
        self._add("other")

    def unknown_decl(self, data: str) -> None:
        self._add("other")


def parse(source: str) -> list[Event]:
    """`source` as events whose raw texts join back to it; ValueError where the parser gives up (Python's
    html.parser asserts on some malformed `<![` sections)."""
    parser = _Events(source)
    try:
        parser.feed(source)
        parser.close()
    except AssertionError as e:
        raise ValueError(f"malformed HTML: {e}") from e
    offsets = [o for o, _, _ in parser.events]
    ends = [*offsets[1:], len(source)] if offsets else []
    events = [Event(kind, tag, source[a:b]) for (a, kind, tag), b in zip(parser.events, ends, strict=True)]
    if offsets and offsets[0] > 0:  # nothing is lost, even before the first event
        events.insert(0, Event("data", "", source[: offsets[0]]))
    if not events and source:
        events = [Event("data", "", source)]
    return _merge_data(events)


def _merge_data(events: list[Event]) -> list[Event]:
    """Adjacent data events as one, each run joined once."""
    out: list[Event] = []
    for is_data, run in groupby(events, key=lambda event: event.kind == "data"):
        if is_data:
            out.append(Event("data", "", "".join(event.raw for event in run)))
        else:
            out += run
    return out


@dataclass
class _Unit:
    """A run of text and inline tags between block boundaries: `parts` are event indices."""

    parts: list[int]


def _units(events: list[Event]) -> list[_Unit]:
    units: list[_Unit] = []
    current: list[int] = []
    untouched = 0  # depth inside elements whose content is kept as it is
    for i, event in enumerate(events):
        if event.tag in UNTOUCHED and event.kind in ("start", "end"):
            untouched = max(0, untouched + (1 if event.kind == "start" else -1))
            current = _close(units, current)
            continue
        inline = event.kind == "data" or (event.tag in INLINE and event.kind in ("start", "end", "startend"))
        if untouched or not inline:
            current = _close(units, current)
        else:
            current.append(i)
    _close(units, current)
    return [u for u in units if any(events[i].kind == "data" and events[i].raw.strip() for i in u.parts)]


def _close(units: list[_Unit], current: list[int]) -> list[int]:
    if current:
        units.append(_Unit(current))
    return []


def translate_html(source: str, translate: Translate) -> str:
    """`source` (a page or a fragment) with its text translated by `translate` (texts in, texts out, in one call)."""
    texts, rebuild = prepare_html(source)
    return rebuild(translate(texts) if texts else [])


def prepare_html(source: str) -> tuple[list[str], Callable[[list[str]], str]]:
    """The texts to translate in `source`, and the function that writes the page again with their translations."""
    events = parse(source)
    units = _units(events)
    texts, marks = [], []
    for unit in units:
        text, unit_marks = _text(events, unit)
        texts.append(text)
        marks.append(unit_marks)

    def rebuild(translated: list[str]) -> str:
        out = [e.raw for e in events]
        for unit, text, unit_marks, translation in zip(units, texts, marks, translated, strict=True):
            _rebuild(events, out, unit, text, unit_marks, translation)
        return "".join(out)

    return texts, rebuild


def _text(events: list[Event], unit: _Unit) -> tuple[str, list[int]]:
    """The unit's text, and where its tags were in it."""
    chunks: list[str] = []
    marks: list[int] = []
    length = 0
    for i in unit.parts:
        if events[i].kind == "data":
            chunks.append(html.unescape(events[i].raw))
            length += len(chunks[-1])
        else:
            marks.append(length)
    return "".join(chunks), marks


def _rebuild(events: list[Event], out: list[str], unit: _Unit, text: str, marks: list[int], translation: str) -> None:
    """The unit's events in `out` rewritten: its tags in order at their new places, the translation between them."""
    lead, trail = text[: len(text) - len(text.lstrip())], text[len(text.rstrip()) :]
    body, core = translation.strip(), len(text.strip())
    # Marks in the source's leading or trailing whitespace stay outside the translated words.
    core_marks = [min(max(m - len(lead), 0), core) for m in marks]
    positions = place(core_marks, core, body)
    parts = cut(body, positions)
    tags = [i for i in unit.parts if events[i].kind != "data"]
    pieces = [html.escape(lead + parts[0], quote=False)]
    for tag, part in zip(tags, parts[1:], strict=True):
        pieces.append(events[tag].raw)
        pieces.append(html.escape(part, quote=False))
    pieces[-1] += html.escape(trail, quote=False)
    for i in unit.parts:
        out[i] = ""
    out[unit.parts[0]] = "".join(pieces)
