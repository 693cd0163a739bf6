"""In-flight batching: a running decoder batch whose rows join and leave at step boundaries.

Texts join in cohorts of one setting (`Settings`; for beam search, one but the length limit): texts admitted later
with a setting the last cohort runs are merged into it, so that one set of array operations does a step's search
for all of them, each text at its own length and limit, its logits processors run as `decode` runs them for it
alone (transformers' semantics) on each run of texts of one length. Every cohort's rows
go through one decoder call per step: the decoder graph takes each row's own cache length (manifest format 4), so
rows of different lengths share it, and a row's logits are what they would be alone. A finished or cancelled row
leaves at once; its place goes to whoever is admitted next.

Beam search: a cohort's sentences have `beams` rows each, and the rows of one call must have the same number of
beams per sentence (the graph broadcasts a sentence's cross-attention K/V over its beams), so a running batch holds
cohorts of one beam width. A cohort takes its first step on all its beams (the same row repeated), as `decode`
does: a sentence's first-step logits are then computed in the same matrix shapes whether it starts alone or joins
running rows (one row per sentence would run the cross-attention's products in other kernels, with other roundings).
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

import numpy as np

from .cache import Cache
from .graphs import Graphs
from .search import (
    Advance,
    Cancelled,
    Hypothesis,
    Rows,
    Settings,
    Step,
    forced_bos_rows,
    new_rows,
    search_step,
    spans_of,
)
from .slots import CacheSlots

if TYPE_CHECKING:
    from .decoder_only import DecoderOnlyGraphs


@dataclass
class _Joining:
    """Texts admitted, to be encoded and joined at the next step."""

    ids: Sequence[Sequence[int]]
    settings: Settings
    keys: Sequence[object]
    forced_bos: Sequence[int | None]
    cancelled: Callable[[], np.ndarray]
    caches: list[Cache] | None = None  # each text's encoder cache (`encode_texts`); None: encoded when it joins


def _layout(cohorts: list[Rows], spans: list[slice], advances: list[Advance]) -> list[int]:
    """The cohorts left after a step, in their new order (by index before it): as they were, except that the
    physically last cohort takes the place of one that left entirely, when it has as many rows, so that its rows
    are the only ones that move instead of every row after the gap (rows must be contiguous per cohort; which
    cohort comes first does not matter). Under one-text requests most cohorts have the same number of rows."""
    anchors = {j: j for j, cohort in enumerate(cohorts) if cohort.sentences}  # j -> the place it takes
    for gone in (j for j, cohort in enumerate(cohorts) if not cohort.sentences):
        if not anchors:
            break
        last = max(anchors, key=anchors.__getitem__)
        size = spans[gone].stop - spans[gone].start
        if anchors[last] > gone and len(advances[last].rows) == size == spans[last].stop - spans[last].start:
            anchors[last] = gone
    return sorted(anchors, key=anchors.__getitem__)


def _merged(joining: list[_Joining]) -> list[_Joining]:
    """Texts admitted at one step with one setting, as one cohort: one processors pass, one search step and one
    encoder call for all of them (many requests of one text each join together under load)."""
    groups: dict[Settings, list[_Joining]] = {}
    for join in joining:
        groups.setdefault(join.settings, []).append(join)
    merged = []
    for settings, parts in groups.items():
        if len(parts) == 1:
            merged.append(parts[0])
            continue
        polls = [part.cancelled for part in parts]
        merged.append(
            _Joining(
                ids=[ids for part in parts for ids in part.ids],
                settings=settings,
                keys=[key for part in parts for key in part.keys],
                forced_bos=[f for part in parts for f in (part.forced_bos or [None] * len(part.ids))],
                cancelled=lambda polls=polls: np.concatenate([poll() for poll in polls]),  # type: ignore[misc]
                caches=[cache for part in parts for cache in part.caches or []],
            )
        )
    return merged


def pad_batch(ids: Sequence[Sequence[int]], pad: int) -> tuple[np.ndarray, np.ndarray]:
    """Token id lists as one right-padded (rows, longest) batch and its attention mask (1 for real tokens)."""
    width = max(len(x) for x in ids)
    input_ids = np.full((len(ids), width), pad, dtype=np.int64)
    mask = np.zeros((len(ids), width), dtype=np.int64)
    for row, x in enumerate(ids):
        input_ids[row, : len(x)] = x
        mask[row, : len(x)] = 1
    return input_ids, mask


def decode(
    graphs: Graphs,
    input_ids: np.ndarray,
    attention_mask: np.ndarray,
    s: Settings,
    cancelled: Cancelled | None = None,
    forced_bos: np.ndarray | None = None,
) -> Generator[Step, None, list[list[Hypothesis]]]:
    """A static padded batch: (batch, src_len) ids and mask in, every row at one length. Yields what each step
    did (keys: the batch's row indices; beam search's tokens are known only at the end); returns
    `num_return_sequences` hypotheses per row. Rows that `cancelled` marks leave the batch at the next step.
    `forced_bos`: (batch,) first output token of each row (its target language), overriding the model's
    forced_bos_token_id. The rules are the running batch's (`search_step`); only the cache moves differently."""
    n, k = len(input_ids), s.num_beams
    cache = graphs.encode(input_ids, attention_mask, max_positions=s.max_length - 1)  # the decoder's inputs
    rows = new_rows(range(n), s, cancelled or (lambda: np.zeros(n, dtype=bool)), forced_bos)
    # At the first step a sentence's beams hold only the start token. onnxmt's graphs (one cross-attention K/V per
    # sentence) compute every beam's row, as transformers does and as a running batch does: one row per sentence
    # would run the cross-attention's products in other matrix shapes (other MLAS kernels, other roundings). An
    # Optimum decoder (K/V per row, projected from the encoder states at its first step, the costly one) runs it
    # once per sentence, then repeats it over the beams.
    once = k > 1 and not cache.per_sentence
    if k > 1 and not once:
        cache = cache.expand_beams(k)
    results: dict[object, list[Hypothesis]] = {}
    while rows.sentences:
        tokens = rows.inputs()  # (rows, 1)
        if once:
            logits, cache = graphs.step(tokens[::k], cache)
            logits, cache, once = np.repeat(logits, k, axis=0), cache.expand_beams(k), False
        else:
            logits, cache = graphs.step(tokens, cache)  # (rows, vocab)
        step = Step()
        (advance,) = search_step([rows], logits, graphs.ops, step)
        cache = cache.take(advance.rows, advance.sentences)
        results.update(step.finished)
        yield step
    return [results[i] for i in range(n)]


def encode_texts(graphs: Graphs, pad: int, ids: Sequence[Sequence[int]]) -> list[Cache]:
    """Texts' encoder caches from one encoder call over all of them (`Graphs.encode_each` groups them by length),
    each text's its own (one row, cut to its length; views into the call's outputs). A text's is what encoding it
    alone gives (exact in fp32 and per-row int8). Requests that wait for a place are encoded together this way
    before they join: one by one, under load, the encoder would run once per text. A decoder-only model's
    "encoding" is its prompt but the last token prefilled into the text's own cache (the last is its first step's
    input: search.Rows)."""
    if not ids:
        return []
    if graphs.decoder_only:
        return cast("DecoderOnlyGraphs", graphs).prefill_each(prefixes(ids))
    input_ids, mask = pad_batch(ids, pad)
    return [
        Cache(mask=mask[i : i + 1, : len(text)], self_kv=(), cross_kv=cross, per_sentence=True)
        for i, (text, cross) in enumerate(zip(ids, graphs.encode_each(input_ids, mask), strict=True))
    ]


def prefixes(prompts: Sequence[Sequence[int]]) -> list[Sequence[int]]:
    """What a decoder-only model's prompts put in their caches before they join: all but the last token (the start
    token of their search rows: search.Rows)."""
    return [prompt[:-1] for prompt in prompts]


class RunningBatch:
    """The decoder batch of one beam width, rows joining (`admit`) and leaving (`step`) at step boundaries.

    >>> batch = RunningBatch(graphs, beams=1)               # doctest: +SKIP
    >>> batch.admit(ids, settings, keys=["a", "b"])          # doctest: +SKIP
    >>> while batch.rows: done = batch.step().finished       # doctest: +SKIP
    """

    def __init__(self, graphs: Graphs, beams: int, pad: int) -> None:
        if not graphs.per_row or not graphs.per_sentence:
            raise ValueError("in-flight batching needs a decoder that takes one cache length per row (format 4)")
        self.graphs = graphs
        self.beams = beams
        self.pad = pad
        self.cohorts: list[Rows] = []
        self.slots: CacheSlots | None = None
        self._joining: list[_Joining] = []

    @property
    def rows(self) -> int:
        """Decoder rows running, and those of the texts admitted to join at the next step."""
        return sum(c.rows for c in self.cohorts) + sum(len(j.ids) * self.beams for j in self._joining)

    @property
    def texts(self) -> int:
        return sum(c.sentences for c in self.cohorts) + sum(len(j.ids) for j in self._joining)

    def admit(
        self,
        ids: Sequence[Sequence[int]],
        settings: Settings,
        keys: Sequence[object],
        forced_bos: Sequence[int | None] = (),
        cancelled: Callable[[], np.ndarray] | None = None,
        encoded: list[Cache] | None = None,
    ) -> None:
        """Admit texts (their source ids) as one cohort: they take their first step with the next `step`. `keys`
        name them in what `step` returns; `forced_bos`: each text's forced first token (its target language), if
        any; `cancelled()`: (texts,) bool, polled once a step; `encoded`: their encoder caches (`encode_texts`),
        if encoded already, else they are encoded with the next step, together with the other texts joining."""
        if settings.num_beams != self.beams:
            raise ValueError(f"this running batch searches with {self.beams} beams, not {settings.num_beams}")
        if encoded is not None and len(encoded) != len(ids):
            raise ValueError(f"{len(ids)} texts admitted with {len(encoded)} encoder caches")
        polled = cancelled or (lambda: np.zeros(len(ids), dtype=bool))
        self._joining.append(_Joining(ids, settings, keys, forced_bos, polled, encoded))

    def _join(self) -> None:
        """The admitted cohorts encoded (those not encoded yet in one call) and added, each sentence with all its
        beams' rows."""
        missing = [join for join in self._joining if join.caches is None]
        caches = iter(encode_texts(self.graphs, self.pad, [ids for join in missing for ids in join.ids]))
        for join in missing:
            join.caches = [next(caches) for _ in join.ids]
        for join in _merged(self._joining):
            settings = join.settings
            forced = forced_bos_rows(list(join.forced_bos) or [None] * len(join.ids), settings)
            prompts = join.ids if self.graphs.decoder_only else None
            cohort = new_rows(join.keys, settings, join.cancelled, forced, prompts)
            last = self.cohorts[-1] if self.cohorts else None
            if last is not None and last.merges(cohort):
                last.merge(cohort)  # its rows are the last ones: the slots append this cohort's after them
            else:
                self.cohorts.append(cohort)
            texts = join.caches or []
            if self.slots is None:
                self.slots = CacheSlots.like(self.graphs.empty_self_kv(0, capacity=1), texts[0])
            self.slots.add(texts, self.beams, max_positions=settings.max_length - 1)
        self._joining = []

    def step(self) -> Step:
        """One decoder call for every row; the tokens taken and the texts finished (which leave the batch)."""
        self._join()
        assert self.slots is not None and self.cohorts
        tokens = np.concatenate([c.inputs() for c in self.cohorts])  # (rows, 1)
        logits, cache = self.graphs.step(tokens, self.slots.view())  # (rows, vocab)
        self.slots.stepped(cache)
        spans = spans_of(self.cohorts)
        step = Step()
        counts = [c.sentences for c in self.cohorts]  # before the step
        advances = search_step(self.cohorts, logits, self.graphs.ops, step)
        self._close_up(spans, counts, advances)
        return step

    def release(self) -> None:
        """An empty batch lets go of its cache buffers, made again when texts join. Rows that leave keep them
        (`CacheSlots.keep`): under a closed loop of clients a batch often empties for a moment, and its next texts
        would otherwise reallocate every buffer in fresh memory."""
        if not self.rows:
            self.slots = None

    def leave(self, keys: Iterable[object]) -> None:
        """The texts `keys` leave before the next step (the scheduler preempted them): their rows go, and nothing
        is returned for them."""
        gone = set(keys)
        self._joining = [join for join in (_without(join, gone) for join in self._joining) if join.ids]
        if not any(key in gone for cohort in self.cohorts for key in cohort.keys):
            return
        assert self.slots is not None
        spans = spans_of(self.cohorts)
        counts = [c.sentences for c in self.cohorts]
        advances = [c.leave(np.array([key in gone for key in c.keys], dtype=bool)) for c in self.cohorts]
        self._close_up(spans, counts, advances)

    def _close_up(self, spans: list[slice], counts: list[int], advances: list[Advance]) -> None:
        """The cache after the cohorts moved their rows (`advances`: beams reordered, rows gone); `spans` and
        `counts`: each cohort's rows and sentences before."""
        assert self.slots is not None
        starts = np.cumsum([0, *counts[:-1]])  # each cohort's first sentence before
        order = _layout(self.cohorts, spans, advances)
        rows = [advances[j].rows + spans[j].start for j in order]
        sentences = [advances[j].sentences + starts[j] for j in order]
        shared: list[np.ndarray] = []
        row0 = 0
        for j in order:  # positions a row's place holds already: only where its cohort stays in place
            held = advances[j].shared
            in_place = held is not None and row0 == spans[j].start
            shared.append(held if held is not None and in_place else np.zeros(len(advances[j].rows), np.int64))
            row0 += len(advances[j].rows)
        self.cohorts = [self.cohorts[j] for j in order]
        none = [np.zeros(0, np.int64)]
        self.slots.keep(np.concatenate(rows or none), np.concatenate(sentences or none), np.concatenate(shared or none))


def _without(join: _Joining, gone: set[object]) -> _Joining:
    """`join` without the texts `gone`."""
    kept = [i for i, key in enumerate(join.keys) if key not in gone]
    if len(kept) == len(join.keys):
        return join
    poll = join.cancelled
    return _Joining(
        ids=[join.ids[i] for i in kept],
        settings=join.settings,
        keys=[join.keys[i] for i in kept],
        forced_bos=[join.forced_bos[i] for i in kept] if join.forced_bos else [],
        cancelled=lambda: poll()[kept],
        caches=None if join.caches is None else [join.caches[i] for i in kept],
    )
