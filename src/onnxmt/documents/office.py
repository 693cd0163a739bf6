"""Word documents (.docx) with python-docx: every paragraph (body, tables, headers and footers) translated as one
text, its runs kept: the translation is cut at the run boundaries' relative places (inline.py), so each run keeps
its formatting (bold, italic, font, size, colour) and each paragraph its style."""

from __future__ import annotations

import io
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from .inline import cut, place

Translate = Callable[[Sequence[str]], list[str]]


def _docx() -> Any:
    try:
        import docx
    except ImportError as e:
        raise ImportError("translating .docx files needs python-docx: pip install onnxmt[documents]") from e
    return docx


def paragraphs(document: Any) -> Iterator[Any]:
    """Every paragraph of the document once: body, table cells (nested too; a merged cell is listed once per grid
    cell it spans), headers and footers."""
    # Keyed by id, holding the element: lxml keeps one proxy per node while it is referenced, so ids stay unique.
    seen: dict[int, Any] = {}
    containers = [document] + [
        part
        for section in document.sections
        for part in (section.header, section.footer)
        if not part.is_linked_to_previous
    ]
    for container in containers:
        for paragraph in _in(container):
            if id(paragraph._p) not in seen:
                seen[id(paragraph._p)] = paragraph._p
                yield paragraph


def _in(container: Any) -> Iterator[Any]:
    yield from container.paragraphs
    for table in container.tables:
        for row in table.rows:
            for cell in row.cells:
                yield from _in(cell)


def translate_docx(source: Path, target: Path, translate: Translate) -> None:
    texts, rebuild = prepare_docx(source.read_bytes())
    target.write_bytes(rebuild(translate(texts) if texts else []))


def prepare_docx(data: bytes) -> tuple[list[str], Callable[[list[str]], bytes]]:
    """The paragraphs' texts of the .docx file `data`, and the function that writes the file again with their
    translations. ValueError when `data` is not a Word document."""
    docx = _docx()
    try:
        document = docx.Document(io.BytesIO(data))
    except Exception as e:  # python-docx raises what zipfile and lxml raise: BadZipFile, KeyError, XMLSyntaxError
        raise ValueError(f"not a .docx document ({type(e).__name__}: {e})") from e
    todo = [p for p in paragraphs(document) if any(c.isalpha() for c in p.text) and p.runs]
    texts = ["".join(run.text for run in p.runs) for p in todo]

    def rebuild(translated: list[str]) -> bytes:
        for paragraph, text, translation in zip(todo, texts, translated, strict=True):
            runs = paragraph.runs
            marks, position = [], 0
            for run in runs[:-1]:
                position += len(run.text)
                marks.append(position)
            for run, part in zip(runs, cut(translation, place(marks, len(text), translation)), strict=True):
                run.text = part
        out = io.BytesIO()
        document.save(out)
        return out.getvalue()

    return texts, rebuild
