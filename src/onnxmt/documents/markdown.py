"""Markdown translated line by line, its syntax kept: code blocks (fenced, indented) and raw HTML blocks found by
markdown-it-py (CommonMark) are left as they are; in other lines the block markers (`#`, `>`, list bullets, table
pipes) stay in front, and code spans, link and image targets, autolinks, inline HTML and emphasis markers are
kept as marks that go back around the translated words (inline.py)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from markdown_it import MarkdownIt

from .inline import cut, place

Translate = Callable[[Sequence[str]], list[str]]
KEPT_BLOCKS = ("fence", "code_block", "html_block")


def _kept_lines(source: str) -> set[int]:
    kept: set[int] = set()
    for token in MarkdownIt("commonmark").enable("table").parse(source):
        if token.type in KEPT_BLOCKS and token.map:
            kept.update(range(*token.map))
    return kept


def _prefix(line: str) -> int:
    """Length of the line's block markers: indentation, `>`s, a heading's `#`s, a list bullet or number, `|`."""
    i = len(line) - len(line.lstrip())
    while True:
        rest = line[i:]
        if rest.startswith(">"):
            i += 1
        elif rest.startswith(("- [ ] ", "- [x] ", "* [ ] ", "* [x] ")):
            i += 6
        elif rest[:2] in ("- ", "* ", "+ ", "| "):
            i += 2
        elif rest.startswith("#"):
            hashes = len(rest) - len(rest.lstrip("#"))
            if hashes > 6 or not rest[hashes : hashes + 1].isspace():
                return i
            i += hashes
        else:
            digits = len(rest) - len(rest.lstrip("0123456789"))
            if not (0 < digits < 10 and rest[digits : digits + 2] in (". ", ") ")):
                return i
            i += digits + 1
        i += len(line[i:]) - len(line[i:].lstrip(" \t"))


def _atoms(text: str) -> list[tuple[int, int]]:
    """(start, end) of the spans of `text` kept as they are, in order."""
    spans: list[tuple[int, int]] = []
    i = 0
    while i < len(text):
        end = _atom_at(text, i)
        if end > i:
            spans.append((i, end))
            i = end
        else:
            i += 1
    return spans


def _atom_at(text: str, i: int) -> int:
    c = text[i]
    if c == "\\" and i + 1 < len(text):
        return i + 2
    if c == "`":
        run = len(text[i:]) - len(text[i:].lstrip("`"))
        close = text.find("`" * run, i + run)
        return close + run if close >= 0 else i + run
    if text.startswith("]:", i):  # a link reference definition: its target (and title) to the end of the line
        return len(text)
    if text.startswith("](", i):
        close = text.find(")", i + 2)
        return close + 1 if close >= 0 else i + 2
    if c == "<":
        close = text.find(">", i)
        return close + 1 if close > i + 1 and " " not in text[i + 1 : i + 2] else i
    if text.startswith("![", i):
        return i + 2
    if c in "[]|" or text.startswith(("**", "__", "~~"), i):
        return i + (2 if text[i : i + 2] in ("**", "__", "~~") else 1)
    if c in "*_" and (i == 0 or not text[i - 1].isalnum() or i + 1 == len(text) or not text[i + 1].isalnum()):
        return i + 1
    return i


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
        content, text, atoms, marks, position = body[start:], "", [], [], 0
        for a, b in _atoms(content):
            text += content[position:a]
            marks.append(len(text))
            atoms.append(content[a:b])
            position = b
        text += content[position:]
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
