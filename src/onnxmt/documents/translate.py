"""Texts translated unit by unit: every unit of every text in one `Translator.translate` call (which sorts them
into batches of similar length), and each text rebuilt around its translated units.

The unit is the model's family's (architectures `text_unit`, overridden by a `unit` argument): a sentence-level
model (Marian, NLLB, M2M100, mBART-50, MADLAD, T5) is given each sentence, a paragraph-level one (the decoder-only
translators) each line whole. Plain text, documents and the service's /translate all cut texts by it.

How a text is cut (`plan_texts`) needs only the model's tokenizer (`Counting`), not the model: the service cuts
documents in a worker process (serve/workers.py) with the same functions.
"""

from __future__ import annotations

import copy
from array import array
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from functools import lru_cache
from itertools import islice
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..architectures import PARAGRAPH, SENTENCE, Prompt, check_text_unit, text_unit
from ..languages import parse
from ..runtime.options import CallOptions, Glossary
from ..tokenization.base import check_unicode
from .limits import DEFAULT_LIMITS, DocumentLimits
from .segment import Piece, fit, join, split_sentences

if TYPE_CHECKING:
    from ..runtime.decoder_only import Prompts
    from ..runtime.options import BatchLimits, DecodeOptions
    from ..runtime.translator import Prepared, Translator

# Sentences per `translate` call when a progress bar is shown: enough to fill many sorted batches.
PROGRESS_CHUNK = 256
Progress = Callable[[int, int], None]  # (sentences done, sentences in all)
Count = Callable[[str], int]
Encode = Callable[[str], tuple[int, ...]]
# Lines `translate_lines` reads ahead: enough to sort into full batches of similar length.
LINES_WINDOW_BATCHES = 8


@dataclass(frozen=True)
class Counting:
    """How a text is cut and counted for one model and language pair: the model's tokenizer (by its directory, so
    a worker process can load it), the prompt put around each text, the model's source positions, the source
    language as sentencex names it, and the unit of text the model is given (`unit`: a sentence, or a paragraph:
    architectures `text_unit`)."""

    directory: str
    tokenizer_kind: str | None
    limit: int
    prompt: Prompt
    lang: str
    unit: str = SENTENCE

    def encoder(self, tokenizer: Any | None = None) -> Encode:
        """Source ids of a sentence under the prompt (a decoder-only model's: its whole chat prompt), never
        truncated (truncation would hide what is too long); each distinct text tokenized once. `tokenizer`: the
        model's, when it is at hand; else loaded from the directory once per process."""
        counter = copy.copy(tokenizer) if tokenizer is not None else _tokenizer(self.directory, self.tokenizer_kind)
        counter.model_max_length = 0
        prompt = self.prompt
        chat = _chat(self.directory, counter) if prompt.chat is not None else None
        seen: dict[str, tuple[int, ...]] = {}

        def encode(text: str) -> tuple[int, ...]:
            if text not in seen:
                if chat is not None:
                    seen[text] = tuple(chat.encode(text, prompt))
                else:
                    seen[text] = tuple(counter.encode(prompt.text + text, prefix=prompt.prefix, suffix=prompt.suffix))
            return seen[text]

        return encode


@lru_cache(maxsize=8)
def _tokenizer(directory: str, kind: str | None) -> Any:
    from ..runtime.tokenizer import load_tokenizer

    return load_tokenizer(directory, kind)


def _chat(directory: str, tokenizer: Any) -> Prompts:
    """A decoder-only model's prompts (its chat template and language table) on `tokenizer`."""
    from ..manifest import read_manifest
    from ..runtime.decoder_only import Prompts

    return Prompts(Path(directory), read_manifest(Path(directory)), tokenizer)


@dataclass(frozen=True)
class Plan:
    """`layouts`: each text of the document as sentences and what is kept between them; `sentences`: those to
    translate, in order; `ids`: each sentence's source ids under the prompt, made while cutting it (what it
    costs, with the decoding settings; `Translator.prepare` takes them, so no sentence is tokenized twice)."""

    layouts: list[list[Piece]]
    sentences: list[str]
    ids: list[array[int]]

    @property
    def tokens(self) -> list[int]:
        return [len(ids) for ids in self.ids]


def plan_texts(
    texts: Sequence[str], counting: Counting, limits: DocumentLimits = DEFAULT_LIMITS, tokenizer: Any | None = None
) -> Plan:
    """`texts` cut into the model's units of text (`counting.unit`): sentences, or paragraphs (lines, see
    `split_lines`), each fitting the model; DocumentTooLarge past `limits`."""
    limits.check_texts(len(texts))
    check_unicode(texts)  # before the sentence splitter, which cannot take a lone surrogate either
    encode = counting.encoder(tokenizer)
    fits = _surely_fits(lambda text: len(encode(text)), counting.limit, terms=bool(counting.prompt.glossary))
    if counting.unit == PARAGRAPH:
        split = [split_lines(text, fits, counting.limit, counting.lang) for text in texts]
    else:
        split = [split_sentences(text, counting.lang) for text in texts]
    limits.check_sentences([p.text for pieces in split for p in pieces if p.translate])
    layouts = [fit(pieces, fits, counting.limit) for pieces in split]
    sentences = [p.text for pieces in layouts for p in pieces if p.translate]
    limits.check_sentences(sentences)
    ids, total = [], 0
    for sentence in sentences:
        ids.append(array("i", encode(sentence)))  # 4 bytes a token, in the worker and in the service alike
        total += len(ids[-1])
        limits.check_tokens(total)
    return Plan(layouts, sentences, ids)


def _surely_fits(count: Count, limit: int, terms: bool = False) -> Count:
    """`count`, without tokenizing a text too short to pass `limit`: what it returns for one is no count, only a
    number within the limit (for cutting, never for costs). A tokenizer gives at most 4 tokens a character (UTF-8
    byte fallback), one more for a word-start marker, and the prompt's own (`count("")`). With a glossary
    (`terms`) a text's prompt also holds the pairs of the terms it contains, which its characters do not bound:
    every text is counted. ValueError when the prompt alone leaves no room for a text (a context as long as the
    model's positions): cut to fit, every character would be a text of its own, each under the whole prompt."""
    prompt = count("")
    if prompt >= limit:
        raise ValueError(
            f"the prompt around each text (its language tokens, or the chat template with its context) has {prompt} "
            f"tokens; this model takes at most {limit} in all, so no text fits: shorten the context"
        )
    if terms:
        return count

    def fits(text: str) -> int:
        return prompt if 4 * len(text) + 1 + prompt <= limit else count(text)

    return fits


def split_lines(text: str, count: Count, limit: int, lang: str) -> list[Piece]:
    """The paragraph's rule: each line is one text for the model, as `Translator.translate` takes it, the
    whitespace around it kept; a line too long for the model (more than `limit` tokens by `count`) is cut into its
    sentences (and `fit` cuts those still too long). What is kept as it is between two texts is one piece (a
    million blank lines are one piece, not a million). `"".join(p.text for p in pieces) == text`."""
    pieces: list[Piece] = []
    kept: list[str] = []  # since the last text to translate: joined once

    def translate(core: str) -> None:
        if kept:
            pieces.append(Piece("".join(kept), False))
            kept.clear()
        pieces.append(Piece(core, True))

    for line in text.splitlines(keepends=True):
        body = line.rstrip("\r\n")
        core = body.strip()
        if not any(c.isalpha() for c in core):  # nothing to translate without a letter: "", "12:30", "---"
            kept.append(line)
            continue
        if count(core) > limit:
            for piece in split_sentences(body, lang):
                if piece.translate:
                    translate(piece.text)
                else:
                    kept.append(piece.text)
        else:
            start = body.find(core)
            kept.append(body[:start])
            translate(core)
            kept.append(body[start + len(core) :])
        kept.append(line[len(body) :])
    if kept:
        pieces.append(Piece("".join(kept), False))
    return [p for p in pieces if p.text]


def segmenter_lang(translator: Translator, source_lang: str | None = None) -> str:
    """The language a text from `source_lang` is cut into sentences by (None: the model's own or default source),
    as sentencex names languages: the bare ISO 639 code (`de` for NLLB's `deu_Latn`, `zh` for `cmn_Hans`), which
    it needs to know a language's abbreviations ("3. Okt.", "Sra."); English for a language it cannot name."""
    code = translator.source_code(source_lang) if source_lang else None
    languages = translator.manifest.languages
    code = code or languages.get("source") or languages.get("default_source")
    parsed = parse(code) if isinstance(code, str) and code else None
    return parsed.language if parsed is not None else "en"


def counting(
    translator: Translator,
    source_lang: str | None = None,
    target_lang: str | None = None,
    *,
    unit: str | None = None,
    glossary: Glossary = (),
    context: str | None = None,
) -> Counting:
    """How `translator` cuts and counts a text from `source_lang` into `target_lang` (None: its defaults), with a
    glossary or context (`Translator.prompt`); `unit`: sentence or paragraph, None: the model's family's
    (architectures `text_unit`). ValueError for a language it does not translate, or a bad unit."""
    return Counting(
        str(translator.directory),
        translator.manifest.tokenizer.get("kind"),
        translator.tokenizer.model_max_length,
        translator.prompt(source_lang, target_lang, glossary=glossary, context=context),
        segmenter_lang(translator, source_lang),
        check_text_unit(unit) or text_unit(translator.manifest.architecture),
    )


def plan_document(translator: Translator, text: str, **request: Any) -> Plan:
    """`text` cut into the units of text the model will see, each fitting its positions; keyword arguments as
    `counting`'s."""
    return plan_texts([text], counting(translator, **request), tokenizer=translator.tokenizer)


def layout(translator: Translator, text: str, **request: Any) -> list[Piece]:
    """`text` as its units of text and what is kept between them (`plan_document`'s layout)."""
    return plan_document(translator, text, **request).layouts[0]


def prepare_texts(
    translator: Translator,
    texts: Sequence[str],
    limits: DocumentLimits = DEFAULT_LIMITS,
    *,
    source_lang: str | None = None,
    target_lang: str | None = None,
    unit: str | None = None,
    glossary: Glossary = (),
    context: str | None = None,
    options: DecodeOptions | None = None,
    batching: BatchLimits | None = None,
    **overrides: Any,
) -> tuple[Plan, list[Prepared], BatchLimits]:
    """`texts` cut into units of text (`unit`: sentence or paragraph, None: the model's family's; see `plan_texts`)
    and the units prepared for the decoder, with the batch limits to run them by: what `translate_texts` and
    `translate_stream` do first. `options`, `batching` and keyword arguments as `Translator.translate`'s.
    DocumentTooLarge past `limits`; a bad option or language raises here, before any decoding."""
    given = CallOptions(source_lang, target_lang, glossary, context, options)
    call, batching = translator.call_options(overrides, given, batching)
    where = counting(translator, source_lang, target_lang, unit=unit, glossary=glossary, context=context)
    plan = plan_texts(texts, where, limits, tokenizer=translator.tokenizer)
    return plan, translator.prepare(plan.sentences, call, ids=plan.ids), batching


def translate_texts(
    translator: Translator,
    texts: Sequence[str],
    progress: Progress | None = None,
    limits: DocumentLimits = DEFAULT_LIMITS,
    **arguments: Any,
) -> list[str]:
    """Each of `texts` translated unit by unit, its whitespace and line breaks kept; keyword arguments (the
    language pair, `unit`, options) as `prepare_texts`'. `progress(done, total)`: told as units are done."""
    plan, prepared, batching = prepare_texts(translator, texts, limits, **arguments)
    if progress is None:
        return join_texts(plan.layouts, [t.text for t in translator.translate_prepared(prepared, batching=batching)])
    translated: list[str] = []
    progress(0, len(prepared))
    for start in range(0, len(prepared), PROGRESS_CHUNK):
        chunk = prepared[start : start + PROGRESS_CHUNK]
        translated += [t.text for t in translator.translate_prepared(chunk, batching=batching)]
        progress(len(translated), len(prepared))
    return join_texts(plan.layouts, translated)


def join_texts(layouts: Sequence[Sequence[Piece]], translated: Sequence[str]) -> list[str]:
    """Each text of `layouts` written with its sentences' translations (`translated`, all texts' in order)."""
    out, position = [], 0
    for pieces in layouts:
        n = sum(p.translate for p in pieces)
        out.append(join(pieces, translated[position : position + n]))
        position += n
    return out


def translate_lines(
    translator: Translator, texts: Iterable[str], *, batching: BatchLimits | None = None, **arguments: Any
) -> Iterator[str]:
    """Plain text, the one rule of the CLI, `translate-corpus` and `/translate_file` for .txt: each line of each
    text translated unit by unit, as `translate_texts` (a sentence-level model's sentences, a paragraph-level
    model's line whole unless too long); read lazily, in order, in windows of many batches of `batching` (default:
    the translator's). Keyword arguments as `translate_texts`'."""
    batching = batching or translator.batching
    iterator = iter(texts)
    while chunk := list(islice(iterator, batching.batch_size * LINES_WINDOW_BATCHES)):
        yield from translate_texts(translator, chunk, None, DEFAULT_LIMITS, batching=batching, **arguments)


def translate_document(translator: Translator, text: str, **arguments: Any) -> str:
    """One text (a paragraph, a page, a whole file) translated unit by unit; keyword arguments as
    `translate_texts`'."""
    return translate_texts(translator, [text], **arguments)[0]
