"""Translated text as it is produced: token by token (greedy search) or sentence by sentence (beam search), for
one sentence or a whole document, in document order.

The pieces streamed join to exactly what `translate_document` returns: the same sentences (documents/segment.py),
the same separators, the same tokens. Sentences are decoded in batches of consecutive sentences, not sorted by
length as `translate_document` does, so that the first sentence comes first; their tokens are the same wherever
a text's translation does not depend on its batch (fp32, int4 and per-row int8 models; see docs/serve.md).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

from ..runtime.decoding import decode
from ..runtime.options import DecodeOptions
from ..runtime.translator import pad_batch, resolve_settings
from .segment import Piece, separator
from .translate import layout

if TYPE_CHECKING:
    from ..runtime.translator import Translator

# (sentence index, its translation so far, whether that is all of it); sentences in order.
Event = tuple[int, str, bool]


def stream_document(translator: Translator, text: str, **overrides: Any) -> Iterator[str]:
    """Pieces of the translation of `text`, as they are produced: `"".join(...)` is the whole translation."""
    options = translator.decoding.merged(**overrides)
    settings = resolve_settings(translator.manifest, options)
    if options.batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {options.batch_size}")
    pieces = layout(translator, text, options.target_lang)
    sentences = [p.text for p in pieces if p.translate]
    if settings.num_beams == 1:
        events = _tokens(translator, sentences, options)
    else:
        events = _sentences(translator, sentences, options)
    return _joined(pieces, events)


def _joined(pieces: list[Piece], events: Iterator[Event]) -> Iterator[str]:
    """The text of `pieces` with each sentence's translation streamed in as `events` bring it."""
    space, previous = "", None
    for piece in pieces:
        if not piece.translate:
            space += piece.text
            continue
        shown, started = "", False
        for _, partial, done in events:
            if not started and (partial or done):
                # The separator depends on the sentence's first character: known once any of it is.
                between = separator(previous, space, partial)
                if between:
                    yield between
                started = True
            if partial.startswith(shown) and len(partial) > len(shown):
                yield partial[len(shown) :]
                shown = partial
            if done:
                break
        space, previous = "", shown
    if space:
        yield space


def _ranges(n: int, size: int) -> Iterator[tuple[int, int]]:
    """Batches of consecutive sentences: the first alone, so that it comes soonest; then `size` at a time."""
    start, end = 0, min(n, 1)
    while start < n:
        yield start, end
        start, end = end, min(n, end + size)


def _sentences(translator: Translator, sentences: list[str], options: DecodeOptions) -> Iterator[Event]:
    """Beam search: each batch of consecutive sentences, once translated."""
    for start, end in _ranges(len(sentences), options.batch_size):
        batch = translator.translate(sentences[start:end], **vars(options))
        for i, result in enumerate(batch, start):
            yield i, result.text, True


def _tokens(translator: Translator, sentences: list[str], options: DecodeOptions) -> Iterator[Event]:
    """Greedy search: each sentence's text after every token, decoded on a worker thread batch by batch."""
    for start, end in _ranges(len(sentences), options.batch_size):
        yield from _batch_tokens(translator, sentences[start:end], start, options)


def _batch_tokens(translator: Translator, batch: list[str], offset: int, options: DecodeOptions) -> Iterator[Event]:
    settings = resolve_settings(translator.manifest, options)
    prompt = translator.prompt(options.source_lang, options.target_lang)
    ids = [translator.encode(s, prompt) for s in batch]
    input_ids, mask = pad_batch(ids, translator.manifest.tokens["pad"])
    # The target language as the first generated token (NLLB, M2M100), as Translator.translate forces it.
    forced_bos = None if prompt.forced_bos is None else np.full(len(batch), prompt.forced_bos, dtype=np.int64)
    steps: queue.Queue[tuple[np.ndarray, np.ndarray] | BaseException | None] = queue.Queue()
    stop = threading.Event()  # the consumer has gone: the batch stops at its next step

    def run() -> None:
        try:
            decode(
                translator.graphs,
                input_ids,
                mask,
                settings,
                cancelled=lambda: np.full(len(batch), stop.is_set()),
                on_step=lambda rows, chosen: steps.put((rows.copy(), chosen.copy())),
                forced_bos=forced_bos,
            )
            steps.put(None)
        except BaseException as e:  # raised again on the consumer's side
            steps.put(e)

    worker = threading.Thread(target=run, name="onnxmt-stream", daemon=True)
    worker.start()
    tokens: list[list[int]] = [[] for _ in batch]
    finished = [False] * len(batch)
    current = 0  # the first sentence not yet finished: the only one shown while it runs
    try:
        while current < len(batch):
            item = steps.get()
            if isinstance(item, BaseException):
                raise item
            if item is None:  # the batch is over: whatever is left is finished
                finished = [True] * len(batch)
            else:
                for row, chosen in zip(*item, strict=True):
                    tokens[row].append(int(chosen))
                    if int(chosen) in settings.eos_ids or len(tokens[row]) >= settings.max_length - 1:
                        finished[row] = True
            while current < len(batch) and finished[current]:
                yield offset + current, translator.tokenizer.decode(tokens[current]), True
                current += 1
            if current < len(batch) and tokens[current]:
                # The last token held back: the next one may join it into one word.
                yield offset + current, translator.tokenizer.decode(tokens[current][:-1]), False
    finally:
        stop.set()
        worker.join()
