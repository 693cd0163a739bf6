"""How much of a document onnxmt reads: every size a user controls has a bound, checked before the work it
would cause. The library, the CLI and the service share these limits; the service takes them from its settings
(`onnxmt serve --max-document-...`), the library's defaults are the same.

A .docx is a zip of XML parts: its compressed size says little about what it expands to (a 40 KB file of
compressed zeros is gigabytes), so every member's size is bounded after decompression, while it is read, and the
XML by its element count. Every format is bounded by the texts and sentences it gives and the characters of each.
"""

from __future__ import annotations

from dataclasses import dataclass


class DocumentTooLarge(ValueError):
    """A document past one of its limits: the message names the limit and the setting that raises it."""


@dataclass(frozen=True)
class DocumentLimits:
    """max_unpacked_bytes: bytes of a .docx after decompression, all its members together. max_ratio: most a zip
    member may expand (uncompressed / compressed bytes; Word's own XML compresses 5-20x). max_xml_elements: XML
    elements in a .docx, all parts together. max_texts: paragraphs, cues or blocks of text in one document.
    max_sentences: sentences to translate in one document. max_sentence_chars: characters of one sentence, before
    a sentence too long for the model is cut (the service uses its max_chars, as for a /translate text).
    max_tokens: source tokens of all the document's sentences (None: no bound; the service uses its
    max_document_cost, which a document costs at least)."""

    max_unpacked_bytes: int = 64 << 20
    max_ratio: float = 200.0
    max_xml_elements: int = 500_000
    max_texts: int = 50_000
    max_sentences: int = 50_000
    max_sentence_chars: int = 50_000
    max_tokens: int | None = None

    def __post_init__(self) -> None:
        for name in ("max_unpacked_bytes", "max_xml_elements", "max_texts", "max_sentences", "max_sentence_chars"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if not self.max_ratio >= 1:
            raise ValueError(f"max_ratio must be at least 1, got {self.max_ratio}")

    def check_texts(self, count: int) -> None:
        if count > self.max_texts:
            raise DocumentTooLarge(
                f"the document has {count} blocks of text (paragraphs, cues, cells); the limit is {self.max_texts} "
                "(max_document_texts)"
            )

    def check_sentences(self, sentences: list[str]) -> None:
        if len(sentences) > self.max_sentences:
            raise DocumentTooLarge(
                f"the document has {len(sentences)} sentences; the limit is {self.max_sentences} "
                "(max_document_sentences)"
            )
        for i, sentence in enumerate(sentences):
            if len(sentence) > self.max_sentence_chars:
                raise DocumentTooLarge(
                    f"sentence {i + 1} of the document has {len(sentence)} characters; the limit is "
                    f"{self.max_sentence_chars} (max_chars)"
                )

    def check_tokens(self, count: int) -> None:
        if self.max_tokens is not None and count > self.max_tokens:
            raise DocumentTooLarge(
                f"the document's sentences have over {self.max_tokens} source tokens; the limit is "
                f"{self.max_tokens} (max_document_cost)"
            )


DEFAULT_LIMITS = DocumentLimits()
