"""Files translated whole, their format chosen by extension: .txt (paragraphs and blank lines kept), .srt and
.vtt, .html/.htm, .md, .docx."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .html import translate_html
from .markdown import translate_markdown
from .subtitles import translate_subtitles
from .translate import Progress, translate_texts

if TYPE_CHECKING:
    from ..runtime.translator import Translator

FORMATS = {".txt": "text", ".srt": "srt", ".vtt": "vtt", ".html": "html", ".htm": "html", ".md": "markdown"}
FORMATS[".markdown"] = "markdown"
FORMATS[".docx"] = "docx"
TEXT_FORMATS: dict[str, Callable[[str, Callable[[Sequence[str]], list[str]]], str]] = {
    "text": lambda source, translate: translate([source])[0],
    "srt": translate_subtitles,
    "vtt": translate_subtitles,
    "html": translate_html,
    "markdown": translate_markdown,
}


def format_of(path: str | Path, given: str | None = None) -> str:
    """The format named by `given`, or else by the file's extension; ValueError naming the valid ones."""
    if given is not None:
        if given not in (*TEXT_FORMATS, "docx"):
            raise ValueError(f"unknown format {given!r}; valid formats: {', '.join([*TEXT_FORMATS, 'docx'])}")
        return given
    suffix = Path(path).suffix.lower()
    if suffix not in FORMATS:
        raise ValueError(
            f"cannot tell the format of {Path(path).name!r} from its extension; valid extensions: "
            f"{', '.join(FORMATS)} (or give the format)"
        )
    return FORMATS[suffix]


def translate_string(
    translator: Translator, source: str, format: str = "text", progress: Progress | None = None, **overrides: Any
) -> str:
    """`source` in `format` (text, html, markdown, srt, vtt) translated, its structure kept."""
    if format not in TEXT_FORMATS:
        raise ValueError(f"unknown format {format!r}; valid formats: {', '.join(TEXT_FORMATS)}")
    return TEXT_FORMATS[format](source, lambda texts: translate_texts(translator, texts, progress, **overrides))


def translate_file(
    translator: Translator,
    source: str | Path,
    target: str | Path,
    format: str | None = None,
    progress: Progress | None = None,
    **overrides: Any,
) -> None:
    """The file at `source` translated into `target`, in the format its extension names (or `format`)."""
    kind = format_of(source, format)
    if kind == "docx":
        from .office import translate_docx

        translate_docx(Path(source), Path(target), lambda t: translate_texts(translator, t, progress, **overrides))
        return
    text = Path(source).read_text(encoding="utf-8-sig")
    Path(target).write_text(translate_string(translator, text, kind, progress, **overrides), encoding="utf-8")
