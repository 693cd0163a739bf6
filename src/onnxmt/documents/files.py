"""Files translated whole, their format chosen by extension: .txt (paragraphs and blank lines kept), .srt and
.vtt, .html/.htm, .md, .docx. Each format gives the texts to translate and a function that writes the file again
with their translations (`prepare`), so that the library, the CLI and the service translate them the same way."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .html import prepare_html
from .limits import DEFAULT_LIMITS, DocumentLimits
from .markdown import prepare_markdown
from .subtitles import prepare_subtitles
from .translate import Progress, translate_texts

if TYPE_CHECKING:
    from ..runtime.translator import Translator

FORMATS = {
    ".txt": "text",
    ".srt": "srt",
    ".vtt": "vtt",
    ".html": "html",
    ".htm": "html",
    ".md": "markdown",
    ".markdown": "markdown",
    ".docx": "docx",
}
Rebuild = Callable[[list[str]], Any]  # translations in, the translated document out (str, or bytes for docx)
TEXT_FORMATS: dict[str, Callable[[str], tuple[list[str], Callable[[list[str]], str]]]] = {
    "text": lambda source: ([source], lambda translated: translated[0]),
    "srt": prepare_subtitles,
    "vtt": prepare_subtitles,
    "html": prepare_html,
    "markdown": prepare_markdown,
}
ALL_FORMATS = (*TEXT_FORMATS, "docx")


def format_of(path: str | Path, given: str | None = None) -> str:
    """The format named by `given`, or else by the file's extension; ValueError naming the valid ones."""
    if given is not None:
        if given not in ALL_FORMATS:
            raise ValueError(f"unknown format {given!r}; valid formats: {', '.join(ALL_FORMATS)}")
        return given
    suffix = Path(path).suffix.lower()
    if suffix not in FORMATS:
        raise ValueError(
            f"cannot tell the format of {Path(path).name!r} from its extension; valid extensions: "
            f"{', '.join(FORMATS)} (or give the format)"
        )
    return FORMATS[suffix]


def prepare(data: bytes, format: str, limits: DocumentLimits = DEFAULT_LIMITS) -> tuple[list[str], Rebuild]:
    """The texts to translate in the file `data` of `format`, and the function that writes it with their
    translations (bytes). ValueError for a file that cannot be read as that format, DocumentTooLarge (a
    ValueError) past `limits`."""
    if format == "docx":
        from .office import prepare_docx

        return prepare_docx(data, limits)
    if format not in TEXT_FORMATS:
        raise ValueError(f"unknown format {format!r}; valid formats: {', '.join(ALL_FORMATS)}")
    try:
        source = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise ValueError(f"a {format} file must be UTF-8 text ({e})") from e
    texts, rebuild = TEXT_FORMATS[format](source)
    limits.check_texts(len(texts))
    return texts, lambda translated: rebuild(translated).encode("utf-8")


def translate_string(
    translator: Translator,
    source: str,
    format: str = "text",
    progress: Progress | None = None,
    limits: DocumentLimits = DEFAULT_LIMITS,
    **arguments: Any,
) -> str:
    """`source` in `format` (text, html, markdown, srt, vtt) translated, its structure kept; keyword arguments as
    `translate_texts`'."""
    if format not in TEXT_FORMATS:
        raise ValueError(f"unknown format {format!r}; valid formats: {', '.join(TEXT_FORMATS)}")
    texts, rebuild = TEXT_FORMATS[format](source)
    limits.check_texts(len(texts))
    return rebuild(translate_texts(translator, texts, progress, limits, **arguments) if texts else [])


def translate_file(
    translator: Translator,
    source: str | Path,
    target: str | Path,
    format: str | None = None,
    progress: Progress | None = None,
    limits: DocumentLimits = DEFAULT_LIMITS,
    **arguments: Any,
) -> None:
    """The file at `source` translated into `target`, in the format its extension names (or `format`); keyword
    arguments as `translate_texts`'."""
    kind = format_of(source, format)
    texts, rebuild = prepare(Path(source).read_bytes(), kind, limits)
    translated = translate_texts(translator, texts, progress, limits, **arguments) if texts else []
    Path(target).write_bytes(rebuild(translated))
