"""Documents and long text: sentences, HTML, Markdown, subtitles, Word files, and streams of translated text."""

from __future__ import annotations

from .files import format_of, translate_file, translate_string
from .segment import Piece, split_sentences
from .stream import translate_stream
from .translate import translate_document, translate_texts

__all__ = [
    "Piece",
    "format_of",
    "split_sentences",
    "translate_document",
    "translate_file",
    "translate_stream",
    "translate_string",
    "translate_texts",
]
