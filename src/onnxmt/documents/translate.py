"""Texts translated sentence by sentence: every sentence of every text in one `Translator.translate` call (which
sorts them into batches of similar length), and each text rebuilt around its translated sentences."""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import langcodes

from .segment import Piece, fit, join, split_sentences

if TYPE_CHECKING:
    from ..runtime.translator import Translator

# Sentences per `translate` call when a progress bar is shown: enough to fill many sorted batches.
PROGRESS_CHUNK = 256
Progress = Callable[[int, int], None]  # (sentences done, sentences in all)


def source_lang(translator: Translator) -> str:
    """The model's source language as sentencex names languages (ISO 639-1 where there is one)."""
    code = translator.manifest.languages.get("source")
    if not isinstance(code, str) or not code:
        return "en"
    try:
        return str(langcodes.standardize_tag(code))
    except ValueError:
        return code


def layout(translator: Translator, text: str, target_lang: str | None = None) -> list[Piece]:
    """`text` cut into the sentences the model will see: each fits the model's source positions."""
    decoding = translator.decoding
    prompt = translator.prompt(decoding.source_lang, target_lang if target_lang is not None else decoding.target_lang)
    limit = translator.tokenizer.model_max_length
    # Counted without truncation (the translator's tokenizer cuts at the limit, which would hide what is too long).
    counter = copy.copy(translator.tokenizer)
    counter.model_max_length = 0

    def count(sentence: str) -> int:
        return len(counter.encode(prompt.text + sentence, prefix=prompt.prefix, suffix=prompt.suffix))

    return fit(split_sentences(text, source_lang(translator)), count, limit)


def translate_texts(
    translator: Translator, texts: Sequence[str], progress: Progress | None = None, **overrides: Any
) -> list[str]:
    """Each of `texts` translated sentence by sentence, its whitespace and line breaks kept. Keyword arguments
    override the translator's DecodeOptions, as in `Translator.translate`."""
    layouts = [layout(translator, text, overrides.get("target_lang")) for text in texts]
    sentences = [p.text for pieces in layouts for p in pieces if p.translate]
    if progress is None:
        translated = [t.text for t in translator.translate(sentences, **overrides)]
    else:
        translated = []
        progress(0, len(sentences))
        for start in range(0, len(sentences), PROGRESS_CHUNK):
            chunk = sentences[start : start + PROGRESS_CHUNK]
            translated += [t.text for t in translator.translate(chunk, **overrides)]
            progress(len(translated), len(sentences))
    out, position = [], 0
    for pieces in layouts:
        n = sum(p.translate for p in pieces)
        out.append(join(pieces, translated[position : position + n]))
        position += n
    return out


def translate_document(translator: Translator, text: str, **overrides: Any) -> str:
    """One text (a paragraph, a page, a whole file) translated sentence by sentence."""
    return translate_texts(translator, [text], **overrides)[0]
