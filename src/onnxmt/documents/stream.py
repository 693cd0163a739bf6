"""Translated text as it is produced: token by token (greedy search) or sentence by sentence (beam search), for
one sentence or a whole document, in document order.

The pieces streamed join to exactly what `translate_document` returns: the same sentences (documents/segment.py),
the same separators, the same tokens. Sentences are decoded in batches of consecutive sentences, the first alone,
not sorted by length as `translate_document` does, so that the first sentence comes first; their tokens are the
same wherever a text's translation does not depend on its batch (fp32, int4 and per-row int8 models; see
docs/serve.md). Built on the Translator's step-level `generate`.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from .segment import Piece, separator
from .translate import prepare_texts

if TYPE_CHECKING:
    from ..runtime.options import BatchLimits
    from ..runtime.translator import Prepared, Translator

# (sentence index, its translation so far, whether that is all of it); sentences in order.
Update = tuple[int, str, bool]


def translate_stream(translator: Translator, text: str, **arguments: Any) -> Iterator[str]:
    """One text (a sentence or a whole document) translated as a stream of pieces of text: token by token with
    greedy search, unit by unit with beam search. `"".join(...)` is what `translate_document` returns (the model's
    units of text, whitespace and line breaks kept). Keyword arguments as `translate_document`'s; a bad option or
    language raises here, before the first piece."""
    if not isinstance(text, str):
        raise TypeError(f"text must be a string, got {type(text).__name__}")
    plan, prepared, batching = prepare_texts(translator, [text], **arguments)
    return _joined(plan.layouts[0], _updates(translator, prepared, batching))


def _updates(translator: Translator, prepared: list[Prepared], batching: BatchLimits) -> Iterator[Update]:
    """Each sentence's text so far, in order: after every token of the first unfinished one (greedy search),
    once it is done. The last token is held back until the next: it may join it into one word."""
    tokens: list[list[int]] = [[] for _ in prepared]
    done: dict[int, str] = {}
    current = 0  # the first sentence not yet finished: the only one shown while it runs
    events = translator.generate(prepared, batching=batching, in_order=True)
    try:
        for event in events:
            i = event.index
            if event.token is not None:
                tokens[i].append(event.token)
                settings = prepared[i].settings
                if event.token in settings.eos_ids or len(tokens[i]) >= settings.max_length - 1:
                    done[i] = translator.detokenize(tokens[i])  # finished, while its batch goes on
            elif event.translation is not None and i >= current:
                done.setdefault(i, event.translation.text)
            while current in done:
                yield current, done.pop(current), True
                current += 1
            if i == current and event.token is not None:
                yield current, translator.detokenize(tokens[current][:-1]), False
    finally:
        events.close()  # the consumer has gone: the batch stops at its next step


class Joiner:
    """The text of a document's `pieces` as its sentences' translations come in: `update(partial, finished)` with
    the current sentence's translation so far (sentences in order) gives the new text to show; `end()` what
    follows the last sentence. Shown text is never taken back: a partial that does not extend what was shown waits
    for one that does, or for the sentence's end."""

    def __init__(self, pieces: list[Piece]) -> None:
        self._pieces = pieces
        self._next = 0  # the piece of the current sentence
        self._space = ""
        self._previous: str | None = None
        self._shown, self._started = "", False
        self._untranslated()

    def _untranslated(self) -> None:
        while self._next < len(self._pieces) and not self._pieces[self._next].translate:
            self._space += self._pieces[self._next].text
            self._next += 1

    def update(self, partial: str, finished: bool) -> Iterator[str]:
        if not self._started and (partial or finished):
            # The separator depends on the sentence's first character: known once any of it is.
            between = separator(self._previous, self._space, partial)
            if between:
                yield between
            self._started = True
        if partial.startswith(self._shown) and len(partial) > len(self._shown):
            yield partial[len(self._shown) :]
            self._shown = partial
        if finished:
            self._space, self._previous = "", self._shown
            self._shown, self._started = "", False
            self._next += 1
            self._untranslated()

    def end(self) -> Iterator[str]:
        if self._space:
            yield self._space


def _joined(pieces: list[Piece], updates: Iterator[Update]) -> Iterator[str]:
    """The text of `pieces` with each sentence's translation streamed in as `updates` bring it."""
    joiner = Joiner(pieces)
    for _, partial, finished in updates:
        yield from joiner.update(partial, finished)
    yield from joiner.end()
