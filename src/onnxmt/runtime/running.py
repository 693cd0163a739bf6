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

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import cast

import numpy as np

from .decoding import (
    Hypothesis,
    LogitsProcessor,
    Settings,
    _advance,
    _apply,
    _Beams,
    _cancelled_hypotheses,
    _hypotheses,
    build_processors,
    forced_bos_rows,
    initial_beams,
    is_eos,
    pad_batch,
)
from .graphs import Cache, Graphs
from .slots import CacheSlots


@dataclass
class Step:
    """What one step of a running batch did: the tokens greedy rows took, (key, token) in row order, and the texts
    it finished, (key, hypotheses)."""

    tokens: list[tuple[object, int]] = field(default_factory=list)
    finished: list[tuple[object, list[Hypothesis]]] = field(default_factory=list)


@dataclass
class _Joining:
    """Texts admitted, to be encoded and joined at the next step."""

    ids: Sequence[Sequence[int]]
    settings: Settings
    keys: Sequence[object]
    forced_bos: Sequence[int | None]
    cancelled: Callable[[], np.ndarray]
    caches: list[Cache] | None = None  # each text's encoder cache (`encode_texts`); None: encoded when it joins


@dataclass
class _Advance:
    """A cohort's part of a step: its rows to keep, as indices into its rows before the step (beams reordered),
    and its sentences to keep, as indices into its sentences before the step; `shared`: per row kept, how many of
    its cache positions the row at its place already holds, if the cohort's rows stay where they are (beams of one
    sentence with a common prefix: see `_shared`)."""

    rows: np.ndarray
    sentences: np.ndarray
    shared: np.ndarray | None = None


class _Cohort:
    """Texts of one setting in the running batch (greedy: one setting; beam search: one but the length limits),
    each at its own length. `keys` name them to the caller; `cancelled` polls which of the texts admitted are no
    longer wanted ((n,) bool); `forced`: each text's forced first token, where texts have their own. Their logits
    processors are the settings' but the renormalisation, which the batch does once for all its rows."""

    polls: list[tuple[Callable[[], np.ndarray], int]]  # each text's request poll, and its place in it

    def __init__(
        self,
        keys: Sequence[object],
        settings: Settings,
        cancelled: Callable[[], np.ndarray],
        forced: np.ndarray | None = None,
    ) -> None:
        self.keys = list(keys)
        self.s = settings
        self.forced = forced
        self.keep = max(2, 1 + len(settings.eos_ids)) * settings.num_beams  # beam search: continuations per row
        self.polls = [(cancelled, i) for i in range(len(self.keys))]
        self._start()

    def _start(self) -> None:
        """The search state of the texts admitted."""
        raise NotImplementedError

    @property
    def rows(self) -> int:
        raise NotImplementedError

    @property
    def sentences(self) -> int:
        return len(self.keys)

    def inputs(self) -> np.ndarray:
        """(rows, 1): each row's last token."""
        raise NotImplementedError

    def merges(self, other: _Cohort) -> bool:
        """Whether `other` (just admitted) can be merged into this cohort."""
        raise NotImplementedError

    def merge(self, other: _Cohort) -> None:
        """`other`'s texts (just admitted) after this cohort's."""
        raise NotImplementedError

    def _appended(self, other: _Cohort) -> None:
        """`other`'s texts' keys, polls and forced tokens after this cohort's (each cohort merges its own arrays)."""
        self.keys += other.keys
        self.polls += other.polls
        if self.forced is not None and other.forced is not None:
            self.forced = np.concatenate([self.forced, other.forced])

    def _kept(self, texts: np.ndarray) -> None:
        """Only the texts `texts` (indices) keep their keys, polls and forced tokens, in that order."""
        self.keys = [self.keys[i] for i in texts.tolist()]
        self.polls = [self.polls[i] for i in texts.tolist()]
        self.forced = None if self.forced is None else self.forced[texts]

    def _cancelled(self) -> np.ndarray:
        """(texts,) bool: each request's poll called once, each text's flag taken from its request's answer."""
        polled: dict[int, np.ndarray] = {}
        for poll, _ in self.polls:
            if id(poll) not in polled:
                polled[id(poll)] = poll()
        return np.array([polled[id(poll)][i] for poll, i in self.polls], dtype=bool)


class _GreedyCohort(_Cohort):
    """Greedy texts of one setting, each at its own length: texts that join later with the same setting are merged
    into the running cohort (`merge`), so that a step's bookkeeping is one set of array operations for all of them,
    not one per request. The processors run on each run of rows of one length, with that run's history, as they
    would alone. Arrays hold the texts still running only; a text that leaves gives its row to the last one
    (`_filled`)."""

    def _start(self) -> None:
        n, s = len(self.keys), self.s
        self.sequences = np.full((n, s.max_length), s.pad, dtype=np.int64)  # (n, max_length)
        self.sequences[:, 0] = s.decoder_start
        self.lengths = np.ones(n, dtype=np.int64)  # tokens so far, the decoder start counted
        self.totals = np.zeros(n, dtype=np.float32)
        self.processors = build_processors(s, None, self.forced)

    @property
    def rows(self) -> int:
        return len(self.keys)

    def inputs(self) -> np.ndarray:
        return self.sequences[np.arange(len(self.keys)), self.lengths - 1][:, None]

    def merges(self, other: _Cohort) -> bool:
        return (
            isinstance(other, _GreedyCohort) and other.s == self.s and (other.forced is None) == (self.forced is None)
        )

    def merge(self, other: _Cohort) -> None:
        assert isinstance(other, _GreedyCohort)
        self._appended(other)
        self.sequences = np.concatenate([self.sequences, other.sequences])
        self.lengths = np.concatenate([self.lengths, other.lengths])
        self.totals = np.concatenate([self.totals, other.totals])

    def process(self, logits: np.ndarray) -> None:
        """The processors on each run of texts of one length, with that run's history (and its forced tokens)."""
        for start, stop in _runs(self.lengths):
            length = int(self.lengths[start])
            processors = self.processors
            if length == 1 and self.forced is not None:
                processors = build_processors(self.s, None, self.forced[start:stop])
            _apply(processors, self.sequences[start:stop, :length], logits[start:stop])

    def advance(self, chosen: np.ndarray, log_probs: np.ndarray, step: Step) -> _Advance:
        """As `greedy_search`'s step, for this cohort's rows: the tokens they chose from their processed logits and
        those tokens' log-probabilities."""
        s, n = self.s, len(self.keys)
        self.totals += log_probs
        self.sequences[np.arange(n), self.lengths] = chosen
        step.tokens += list(zip(self.keys, chosen.tolist(), strict=True))
        done = is_eos(chosen, s.eos_ids) | (self.lengths + 1 >= s.max_length)
        dropped = self._cancelled() & ~done
        for i in np.flatnonzero(done | dropped).tolist():
            tokens = self.sequences[i, 1 : self.lengths[i] + 1].tolist()
            step.finished.append((self.keys[i], [Hypothesis(tokens, float(self.totals[i]), bool(dropped[i]))]))
        self.lengths += 1
        keep = _filled(done | dropped)
        if len(keep) < n:
            self._kept(keep)
            self.sequences, self.lengths, self.totals = self.sequences[keep], self.lengths[keep], self.totals[keep]
        return _Advance(keep, keep)


def _runs(*values: np.ndarray) -> list[tuple[int, int]]:
    """(start, stop) of each run of texts along which all of `values` (one entry per text each) stay the same."""
    change = np.zeros(max(len(values[0]) - 1, 0), dtype=bool)
    for v in values:
        change |= np.diff(v) != 0
    bounds = (np.flatnonzero(change) + 1).tolist()
    return list(zip([0, *bounds], [*bounds, len(values[0])], strict=True))


def _filled(gone: np.ndarray) -> np.ndarray:
    """The rows left when the rows `gone` (bool) leave, each gap taken by one of the last rows: only those move
    in the cache, where closing up in order would move every row after the first gap (in a cohort the oldest texts,
    at the front, finish first). Row order within a greedy cohort does not matter."""
    left = len(gone) - int(gone.sum())
    order = np.arange(left)
    order[np.flatnonzero(gone[:left])] = np.flatnonzero(~gone[left:]) + left
    return order


class _BeamCohort(_Cohort):
    """Beam-search texts of one setting but their length limits (`max_new_tokens`), each sentence at its own length
    and limit: texts that join later are merged into the running cohort (`merge`), so that a step's search is one
    set of array operations for all of them (`_advance` with per-sentence lengths), not one per request, as for
    greedy texts. The processors run on each run of sentences of one length and limit, with that run's history.
    A sentence's beams are its rows, together; a sentence that leaves gives its place to the last one (`_filled`).
    `forced`: each sentence's forced first token, where texts have their own."""

    def _start(self) -> None:
        n = len(self.keys)
        self.state = initial_beams(n, self.s)  # as wide as the longest limit
        self.lengths = np.ones(n, dtype=np.int64)  # tokens so far, the decoder start counted
        self.limits = np.full(n, self.s.max_length, dtype=np.int64)  # each sentence's max_length
        self._built: dict[int, list[LogitsProcessor]] = {}  # processors per limit, past the first step

    @property
    def rows(self) -> int:
        return self.sentences * self.s.num_beams

    def inputs(self) -> np.ndarray:
        last = self.state.running[np.arange(self.sentences), :, self.lengths - 1]  # (n, beams)
        return last.reshape(-1, 1)

    def merges(self, other: _Cohort) -> bool:
        return (
            isinstance(other, _BeamCohort)
            and replace(other.s, max_length=0) == replace(self.s, max_length=0)
            and (other.forced is None) == (self.forced is None)
        )

    def merge(self, other: _Cohort) -> None:
        assert isinstance(other, _BeamCohort)
        width = max(self.state.running.shape[2], other.state.running.shape[2])
        mine, theirs = _widened(self.state, width, self.s.pad), _widened(other.state, width, self.s.pad)
        parts = zip(vars(mine).values(), vars(theirs).values(), strict=True)
        self.state = _Beams(*(np.concatenate([a, b]) for a, b in parts))
        self._appended(other)
        self.lengths = np.concatenate([self.lengths, other.lengths])
        self.limits = np.concatenate([self.limits, other.limits])

    def process(self, scores: np.ndarray) -> None:
        """The processors on each run of sentences of one length and limit, with that run's history (and forced
        tokens): what they would see alone."""
        beams = self.s.num_beams
        for start, stop in _runs(self.lengths, self.limits):
            length, limit = int(self.lengths[start]), int(self.limits[start])
            history = self.state.running[start:stop, :beams, :length].reshape((stop - start) * beams, length)
            _apply(self._processors(length, limit, start, stop, beams), history, scores[start * beams : stop * beams])

    def _processors(self, length: int, limit: int, start: int, stop: int, beams: int) -> list[LogitsProcessor]:
        """The processors of the sentences `start:stop` (renormalisation left to the batch): their own forced
        first tokens at their first step; past it, those of their limit (a forced token is only ever applied at
        the first step, but whether one is forced decides which step `begin_suppress_tokens` applies to)."""
        if length == 1 and self.forced is not None:
            own = np.repeat(self.forced[start:stop], beams)
            return build_processors(replace(self.s, max_length=limit), None, own)
        if limit not in self._built:
            some = None if self.forced is None else self.forced[start : start + 1]
            self._built[limit] = build_processors(replace(self.s, max_length=limit), None, some)
        return self._built[limit]

    def advance(self, values: np.ndarray, tokens: np.ndarray, vocab: int, step: Step) -> _Advance:
        """As `beam_search`'s step, for this cohort's sentences, each at its own length and limit: each row's best
        `keep` processed log-probabilities and their tokens, (rows, keep) each."""
        s, k, state = self.s, self.s.num_beams, self.state
        n, lengths, limits = self.sentences, self.lengths, self.limits
        totals = (values.reshape(n, k, self.keep) + state.running_scores[:, :, None]).reshape(n, k * self.keep)
        flat_ids = (np.arange(k)[None, :, None] * vocab + tokens.reshape(n, k, self.keep)).reshape(n, k * self.keep)
        history = state.running  # (`_advance` replaces it)
        rows = _advance(state, totals, flat_ids, vocab, self.keep, lengths, s, limits)  # (n * k,) into the old rows
        frozen = ~state.improvable | (lengths + 1 >= limits)
        if s.early_stopping is True:
            frozen |= state.is_finished.all(axis=1)
        dropped = self._cancelled() & ~frozen
        for i in np.flatnonzero(frozen | dropped).tolist():
            one = _cut(state.take(np.array([i])), int(limits[i]))
            hyps = _cancelled_hypotheses(one, int(lengths[i]) + 1, s) if dropped[i] else _hypotheses(one, s)
            step.finished.append((self.keys[i], hyps))
        live = _filled(frozen | dropped)
        kept = rows.reshape(n, k)[live].reshape(-1)
        shared = _shared(history, kept, live, lengths)
        self.state = state.take(live)
        self.lengths, self.limits = lengths[live] + 1, limits[live]
        if len(live) < n:
            self._kept(live)
            if len(live) and int(self.limits.max()) < self.state.running.shape[2]:
                self.state = _cut(self.state, int(self.limits.max()))  # no wider than the longest limit left
        return _Advance(kept, live, shared)


def _shared(history: np.ndarray, rows: np.ndarray, live: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Per row kept (`rows`: its source among the rows before the step), how many cache positions the row at its
    place before the step already holds: where both were beams of one sentence, the positions of their common
    prefix. A position's K/V is a function of the sentence's source and the tokens up to it, all beams of a
    sentence are computed in one decoder call per step, and a row's values do not depend on its neighbours (what
    makes in-flight batching exact), so those positions are equal and need no copy: beams mostly differ in their
    last tokens, and a reorder then copies those instead of whole rows. `history`: (n, beams, width) tokens before
    the step; `lengths`: (n,) each sentence's tokens (and cache positions) before it."""
    n, beams, _ = history.shape
    if not len(rows):
        return np.zeros(0, np.int64)
    flat = history.reshape(n * beams, -1)
    places = np.arange(len(rows))
    held = np.repeat(lengths[live], beams)  # the positions each kept sentence's cache holds
    width = int(held.max(initial=0))
    same = flat[places, :width] == flat[rows, :width]
    prefix = np.where(same.all(axis=1), width, same.argmin(axis=1))
    in_place = np.repeat(live == np.arange(len(live)), beams)  # the sentence kept its place: same sentence there
    return np.where(in_place, np.minimum(prefix, held), 0)


def _widened(state: _Beams, width: int, pad: int) -> _Beams:
    """`state` with room for `width` tokens per hypothesis (padded)."""
    have = state.running.shape[2]
    if have == width:
        return state
    extra = ((0, 0), (0, 0), (0, width - have))
    return replace(
        state,
        running=np.pad(state.running, extra, constant_values=pad),
        finished=np.pad(state.finished, extra, constant_values=pad),
    )


def _cut(state: _Beams, max_length: int) -> _Beams:
    """A finished sentence's state as wide as its own limit: its hypotheses are what it would have alone."""
    return replace(state, running=state.running[:, :, :max_length], finished=state.finished[:, :, :max_length])


def _layout(cohorts: list[_Cohort], spans: list[slice], advances: list[_Advance]) -> list[int]:
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


def encode_texts(graphs: Graphs, pad: int, ids: Sequence[Sequence[int]]) -> list[Cache]:
    """Texts' encoder caches from one encoder call over all of them (`Graphs.encode_each` groups them by length),
    each text's its own (one row, cut to its length; views into the call's outputs). A text's is what encoding it
    alone gives (exact in fp32 and per-row int8). Requests that wait for a place are encoded together this way
    before they join: one by one, under load, the encoder would run once per text."""
    if not ids:
        return []
    input_ids, mask = pad_batch(ids, pad)
    return [
        Cache(mask=mask[i : i + 1, : len(text)], self_kv=(), cross_kv=cross, per_sentence=True)
        for i, (text, cross) in enumerate(zip(ids, graphs.encode_each(input_ids, mask), strict=True))
    ]


class RunningBatch:
    """The decoder batch of one beam width, rows joining (`admit`) and leaving (`step`) at step boundaries.

    >>> batch = RunningBatch(graphs, beams=1)               # doctest: +SKIP
    >>> batch.admit(ids, settings, keys=["a", "b"])          # doctest: +SKIP
    >>> while batch.rows: done = batch.step().finished       # doctest: +SKIP
    """

    def __init__(self, graphs: Graphs, beams: int, pad: int) -> None:
        if not getattr(graphs, "per_row", False) or not getattr(graphs, "per_sentence", False):
            raise ValueError("in-flight batching needs a decoder that takes one cache length per row (format 4)")
        self.graphs = graphs
        self.beams = beams
        self.pad = pad
        self.cohorts: list[_Cohort] = []
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
            cohort: _Cohort
            if self.beams > 1:
                cohort = _BeamCohort(join.keys, settings, join.cancelled, forced)
            else:
                cohort = _GreedyCohort(join.keys, settings, join.cancelled, forced)
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
        spans, row0 = [], 0
        for cohort in self.cohorts:
            spans.append(slice(row0, row0 + cohort.rows))
            row0 += cohort.rows
        step = Step()
        counts = [c.sentences for c in self.cohorts]  # before the step
        advances = self._greedy(logits, spans, step) if self.beams == 1 else self._beam(logits, spans, step)
        starts = np.cumsum([0, *counts[:-1]])  # each cohort's first sentence before the step
        order = _layout(self.cohorts, spans, advances)
        # Beams reordered, finished rows gone.
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
        return step

    def _greedy(self, logits: np.ndarray, spans: list[slice], step: Step) -> list[_Advance]:
        """Every cohort's processors on its rows' logits; then the argmax and the log-softmax of all rows at once."""
        for cohort, span in zip(self.cohorts, spans, strict=True):
            cast(_GreedyCohort, cohort).process(logits[span])
        chosen = logits.argmax(axis=-1)
        log_probs = self.graphs.ops.log_softmax_inplace(logits)  # the logits are not needed any more
        picked = np.take_along_axis(log_probs, chosen[:, None], axis=1)[:, 0]
        return [
            cast(_GreedyCohort, cohort).advance(chosen[span], picked[span], step)
            for cohort, span in zip(self.cohorts, spans, strict=True)
        ]

    def _beam(self, logits: np.ndarray, spans: list[slice], step: Step) -> list[_Advance]:
        """The log-softmax of all rows; every cohort's processors on its rows; the renormalisation and the top-k
        of all rows at once (a cohort keeping fewer takes the first of them: top-k is sorted, ties to the lower
        index)."""
        ops = self.graphs.ops
        scores = ops.log_softmax_inplace(logits)  # (rows, vocab), in the logits' buffer
        for cohort, span in zip(self.cohorts, spans, strict=True):
            cast(_BeamCohort, cohort).process(scores[span])
        renormalize = [c.s.renormalize for c in self.cohorts]
        if all(renormalize):
            ops.log_softmax_inplace(scores)
        else:
            for span in (span for span, r in zip(spans, renormalize, strict=True) if r):
                ops.log_softmax_inplace(scores[span])
        values, tokens = ops.topk(scores, max(c.keep for c in self.cohorts))
        vocab = scores.shape[-1]
        return [
            cast(_BeamCohort, cohort).advance(values[span, : cohort.keep], tokens[span, : cohort.keep], vocab, step)
            for cohort, span in zip(self.cohorts, spans, strict=True)
        ]
