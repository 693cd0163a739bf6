"""The decoding loop: one `decode` driver, two search strategies, a list of logits processors.

The semantics are transformers' `generate()` (v4.57 to v5.x), so that token ids can be compared exactly:
greedy search is `_sample` without sampling; beam search is the vectorised `_beam_search` (top 2*beams
continuations, finished hypotheses kept per sentence, the same early-stopping heuristic). Scores stay float32 as
there. The model's work is behind `Graphs` (graphs.py): `encode` once per batch, then `step` per new token.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from .graphs import Cache, Graphs

NEG_INF = np.float32(-np.inf)
# transformers marks impossible beams with -1e9, not -inf; the same constant keeps ties identical.
BEAM_FLOOR = np.float32(-1.0e9)
DEFAULT_MAX_NEW_TOKENS = 20  # transformers' GenerationConfig default max_length, counted after the start token

# Polled once per step: (batch,) bool, True for the rows whose request is gone (timed out, client disconnected).
Cancelled = Callable[[], np.ndarray]


@dataclass(frozen=True)
class Settings:
    """Decoding settings with every default resolved (see `resolve_settings`)."""

    num_beams: int
    max_length: int  # counts the decoder start token, as in transformers
    min_length: int
    length_penalty: float
    early_stopping: bool | str
    num_return_sequences: int
    decoder_start: int
    eos_ids: tuple[int, ...]
    pad: int
    bad_words: tuple[tuple[int, ...], ...] = ()
    suppress: tuple[int, ...] = ()
    begin_suppress: tuple[int, ...] = ()
    forced_eos: int | None = None
    no_repeat_ngram_size: int = 0
    repetition_penalty: float = 1.0
    forced_bos: int | None = None  # forced first generated token (NLLB, M2M100, mBART-50: the target language)
    renormalize: bool = False  # log-softmax again after the processors (generation_config.renormalize_logits)


@dataclass(frozen=True)
class Hypothesis:
    tokens: list[int]  # generated ids after the decoder start token, eos included when one was generated
    score: float  # beam: length-normalised log-probability (transformers' sequences_scores); greedy: sum of log-probs
    cancelled: bool = False  # the row left the batch because its request was cancelled: `tokens` is unfinished


class LogitsProcessor(Protocol):
    def __call__(self, sequences: np.ndarray, scores: np.ndarray) -> None:
        """Edit `scores` (rows, vocab) in place; `sequences` (rows, cur_len) holds the tokens so far."""


# ---------------------------------------------------------------------------------------------------------------
# Logits processors, in transformers' order.


@dataclass(frozen=True)
class RepetitionPenalty:
    penalty: float

    def __call__(self, sequences: np.ndarray, scores: np.ndarray) -> None:
        picked = np.take_along_axis(scores, sequences, axis=1)
        picked = np.where(picked < 0, picked * self.penalty, picked / self.penalty).astype(scores.dtype)
        np.put_along_axis(scores, sequences, picked, axis=1)


@dataclass(frozen=True)
class NoRepeatNGram:
    size: int

    def __call__(self, sequences: np.ndarray, scores: np.ndarray) -> None:
        cur_len = sequences.shape[1]
        if cur_len + 1 < self.size:
            return
        for row, tokens in enumerate(sequences.tolist()):
            prefix = tuple(tokens[cur_len + 1 - self.size :])
            for start in range(cur_len + 1 - self.size):
                if tuple(tokens[start : start + self.size - 1]) == prefix:
                    scores[row, tokens[start + self.size - 1]] = NEG_INF


@dataclass(frozen=True)
class BadWords:
    """Single-token bad words are a static mask; longer ones ban their last token after their prefix."""

    single: tuple[int, ...]
    multi: tuple[tuple[int, ...], ...]

    def __call__(self, sequences: np.ndarray, scores: np.ndarray) -> None:
        if self.single:
            scores[:, list(self.single)] = NEG_INF
        for word in self.multi:
            prefix = np.array(word[:-1])
            if sequences.shape[1] >= len(prefix):
                hit = np.all(sequences[:, sequences.shape[1] - len(prefix) :] == prefix, axis=1)
                scores[hit, word[-1]] = NEG_INF


@dataclass(frozen=True)
class MinLength:
    min_length: int
    eos_ids: tuple[int, ...]

    def __call__(self, sequences: np.ndarray, scores: np.ndarray) -> None:
        if sequences.shape[1] < self.min_length:
            scores[:, list(self.eos_ids)] = NEG_INF


@dataclass(frozen=True)
class ForcedBos:
    """The first generated token, forced: one for all rows, or one per row (`rows` ids: a batch that mixes target
    languages). Every row of the first step is live, one per sentence (beam search computes the first step once
    per sentence), so per-row ids line up with the sentences."""

    bos: int | np.ndarray

    def __call__(self, sequences: np.ndarray, scores: np.ndarray) -> None:
        if sequences.shape[1] == 1:
            scores[:] = NEG_INF
            scores[np.arange(len(scores)), self.bos] = 0.0


@dataclass(frozen=True)
class ForcedEos:
    max_length: int
    eos: int

    def __call__(self, sequences: np.ndarray, scores: np.ndarray) -> None:
        if sequences.shape[1] == self.max_length - 1:
            scores[:] = NEG_INF
            scores[:, self.eos] = 0.0


@dataclass(frozen=True)
class SuppressTokens:
    tokens: tuple[int, ...]
    at_length: int | None = None  # None: always; else only at this sequence length (begin_suppress_tokens)

    def __call__(self, sequences: np.ndarray, scores: np.ndarray) -> None:
        if self.at_length is None or sequences.shape[1] == self.at_length:
            scores[:, list(self.tokens)] = NEG_INF


@dataclass(frozen=True)
class Renormalize:
    """transformers' LogitNormalization, always last: the processors above remove probability mass (a banned pad
    token, a too-early eos), and beam scores are then summed from log-probabilities that sum to 1 again."""

    log_softmax: Callable[[np.ndarray], np.ndarray]

    def __call__(self, sequences: np.ndarray, scores: np.ndarray) -> None:
        scores[:] = self.log_softmax(scores)


def build_processors(
    s: Settings,
    log_softmax: Callable[[np.ndarray], np.ndarray] | None = None,
    forced_bos: np.ndarray | None = None,
) -> list[LogitsProcessor]:
    """The processors `s` asks for, in the order transformers' `_get_logits_processor` applies them. Renormalising
    needs `log_softmax`; greedy search leaves it out (it cannot change an argmax, and greedy scores are already
    log-probabilities of the processed logits). `forced_bos`: (sentences,) first tokens, in place of
    `s.forced_bos` (the language scheme's forced target language)."""
    forced: int | np.ndarray | None = s.forced_bos if forced_bos is None else forced_bos
    processors: list[LogitsProcessor] = []
    if s.repetition_penalty != 1.0:
        processors.append(RepetitionPenalty(s.repetition_penalty))
    if s.no_repeat_ngram_size > 0:
        processors.append(NoRepeatNGram(s.no_repeat_ngram_size))
    # transformers drops eos from the bad words: banning it would make every sentence run to the length limit.
    words = [w for w in s.bad_words if not (len(w) == 1 and w[0] in s.eos_ids)]
    if words:
        processors.append(BadWords(tuple(w[0] for w in words if len(w) == 1), tuple(w for w in words if len(w) > 1)))
    if s.min_length > 0:
        processors.append(MinLength(s.min_length, s.eos_ids))
    if forced is not None:
        processors.append(ForcedBos(forced))
    if s.forced_eos is not None:
        processors.append(ForcedEos(s.max_length, s.forced_eos))
    if s.suppress:
        processors.append(SuppressTokens(s.suppress))
    if s.begin_suppress:
        # The first free position: after the decoder start token, and after the forced token when there is one.
        processors.append(SuppressTokens(s.begin_suppress, at_length=1 if forced is None else 2))
    if s.renormalize and log_softmax is not None:
        processors.append(Renormalize(log_softmax))
    return processors


def _apply(processors: Sequence[LogitsProcessor], sequences: np.ndarray, scores: np.ndarray) -> None:
    for processor in processors:
        processor(sequences, scores)


def topk(x: np.ndarray, k: int, tiebreak: np.ndarray | None = None) -> np.ndarray:
    """Indices of the k largest entries of each row, largest first; ties go to the lower index, or to the lower
    `tiebreak` value when given (same shape as x)."""
    keys = np.broadcast_to(np.arange(x.shape[-1]), x.shape) if tiebreak is None else tiebreak
    order = np.lexsort((keys, -x), axis=-1)
    return order[:, :k]


# ---------------------------------------------------------------------------------------------------------------
# Driver and strategies.


def decode(
    graphs: Graphs,
    input_ids: np.ndarray,
    attention_mask: np.ndarray,
    s: Settings,
    cancelled: Cancelled | None = None,
    forced_bos: np.ndarray | None = None,
) -> list[list[Hypothesis]]:
    """Translate one padded batch: (batch, src_len) ids and mask in, `num_return_sequences` hypotheses per row.
    Rows that `cancelled` marks leave the batch at the next step. `forced_bos`: (batch,) first output token of
    each row (its target language), overriding the model's forced_bos_token_id."""
    cache = graphs.encode(input_ids, attention_mask)
    if s.num_beams == 1:
        return [[h] for h in greedy_search(graphs, cache, s, build_processors(s, None, forced_bos), cancelled)]
    return beam_search(graphs, cache, s, build_processors(s, graphs.ops.log_softmax, forced_bos), cancelled)


def _none_cancelled(batch: int) -> Cancelled:
    return lambda: np.zeros(batch, dtype=bool)


def greedy_search(
    graphs: Graphs, cache: Cache, s: Settings, processors: list[LogitsProcessor], cancelled: Cancelled | None = None
) -> list[Hypothesis]:
    batch = cache.sentences
    sequences = np.full((batch, s.max_length), s.pad, dtype=np.int64)  # (batch, max_length)
    sequences[:, 0] = s.decoder_start
    totals = np.zeros(batch, dtype=np.float32)
    lengths = np.full(batch, s.max_length, dtype=np.int64)
    active = np.arange(batch)  # rows still generating; finished rows leave the decoder batch
    eos = np.array(s.eos_ids)
    gone = np.zeros(batch, dtype=bool)  # rows that left because their request was cancelled
    cancelled = cancelled or _none_cancelled(batch)
    for cur_len in range(1, s.max_length):
        # One decoder step for the active rows, on their last token.
        logits, cache = graphs.step(sequences[active, cur_len - 1 : cur_len], cache)  # (active, vocab)
        _apply(processors, sequences[active, :cur_len], logits)
        # Greedy choice, and its log-probability for the score.
        chosen = logits.argmax(axis=-1)
        totals[active] += np.take_along_axis(graphs.ops.log_softmax(logits), chosen[:, None], axis=1)[:, 0]
        sequences[active, cur_len] = chosen
        # Rows that produced eos, or reached the length limit, are done; so are rows nobody waits for any more.
        done = np.isin(chosen, eos) | (cur_len + 1 >= s.max_length)
        dropped = cancelled()[active] & ~done
        gone[active[dropped]] = True
        done |= dropped
        if done.any():
            lengths[active[done]] = cur_len + 1
            active = active[~done]
            if len(active) == 0:
                break
            cache = cache.select(np.flatnonzero(~done))
    return [Hypothesis(sequences[r, 1 : lengths[r]].tolist(), float(totals[r]), bool(gone[r])) for r in range(batch)]


@dataclass
class _Beams:
    """Beam-search state for the sentences still searching, laid out (sentences, beams, ...)."""

    running: np.ndarray  # (n, beams, max_length) token ids of the live hypotheses
    running_scores: np.ndarray  # (n, beams) summed log-probs
    finished: np.ndarray  # (n, beams, max_length) best finished hypotheses so far
    finished_scores: np.ndarray  # (n, beams) length-normalised scores, BEAM_FLOOR where empty
    is_finished: np.ndarray  # (n, beams) bool
    improvable: np.ndarray  # (n,) bool: can a live beam still beat the worst finished one?
    ids: np.ndarray  # (n,) index of each sentence in the batch

    def take(self, keep: np.ndarray) -> _Beams:
        return _Beams(*(a[keep] for a in self.__dict__.values()))


def beam_search(
    graphs: Graphs, cache: Cache, s: Settings, processors: list[LogitsProcessor], cancelled: Cancelled | None = None
) -> list[list[Hypothesis]]:
    batch, k = cache.sentences, s.num_beams
    cancelled = cancelled or _none_cancelled(batch)
    gone: dict[int, int] = {}  # sentence -> its length when its request was cancelled
    keep = max(2, 1 + len(s.eos_ids)) * k  # continuations kept per step: enough to have k live ones after eos
    running = np.full((batch, k, s.max_length), s.pad, dtype=np.int64)
    running[:, :, 0] = s.decoder_start
    running_scores = np.zeros((batch, k), dtype=np.float32)
    running_scores[:, 1:] = BEAM_FLOOR  # only beam 0 is real at the start, so the k beams do not duplicate it
    state = _Beams(
        running=running,
        running_scores=running_scores,
        finished=running.copy(),
        finished_scores=np.full((batch, k), BEAM_FLOOR, dtype=np.float32),
        is_finished=np.zeros((batch, k), dtype=bool),
        improvable=np.ones(batch, dtype=bool),
        ids=np.arange(batch),
    )
    results: dict[int, _Beams] = {}
    for cur_len in range(1, s.max_length):
        n = len(state.ids)
        flat = state.running.reshape(n * k, -1)[:, :cur_len]  # (n*beams, cur_len)
        if cur_len == 1:
            # Every beam of a sentence holds only the decoder start token, so every beam's row of this step would
            # be the same row: computed once per sentence, then repeated, and the cache expanded to beams after.
            values, tokens, vocab, cache = _candidates(graphs, flat[::k], cache, processors, keep)
            values, tokens = np.repeat(values, k, axis=0), np.repeat(tokens, k, axis=0)
            cache = cache.expand_beams(k)  # (batch * beams) rows from here on
        else:
            values, tokens, vocab, cache = _candidates(graphs, flat, cache, processors, keep)  # (n*beams, keep)
        totals = (values.reshape(n, k, keep) + state.running_scores[:, :, None]).reshape(n, k * keep)
        flat_ids = (np.arange(k)[None, :, None] * vocab + tokens.reshape(n, k, keep)).reshape(n, k * keep)
        cache_rows = _advance(state, totals, flat_ids, vocab, keep, cur_len, s)
        if cur_len > 1:  # (at the first step every beam's cache row is the same one: nothing to move)
            cache = cache.reorder_beams(cache_rows)
        # Sentences whose finished beams can no longer change leave the batch, with all their beams; so do the
        # sentences nobody waits for any more.
        frozen = ~state.improvable
        if s.early_stopping is True:
            frozen |= state.is_finished.all(axis=1)
        if cur_len + 1 >= s.max_length:
            frozen[:] = True
        dropped = cancelled()[state.ids] & ~frozen
        gone.update((int(i), cur_len + 1) for i in state.ids[dropped])
        frozen |= dropped
        if frozen.any():
            for i in np.flatnonzero(frozen):
                results[int(state.ids[i])] = state.take(np.array([i]))
            live = np.flatnonzero(~frozen)
            if len(live) == 0:
                break
            state = state.take(live)
            cache = cache.select(live, k)
    return [
        _cancelled_hypotheses(results[b], gone[b], s) if b in gone else _hypotheses(results[b], s) for b in range(batch)
    ]


def _candidates(
    graphs: Graphs, sequences: np.ndarray, cache: Cache, processors: list[LogitsProcessor], keep: int
) -> tuple[np.ndarray, np.ndarray, int, Cache]:
    """One decoder step for `sequences` (rows, cur_len): each row's best `keep` log-probabilities after the
    processors and their tokens ((rows, keep) each), the vocabulary size, and the grown cache."""
    logits, cache = graphs.step(sequences[:, -1:], cache)
    scores = graphs.ops.log_softmax(logits)  # (rows, vocab)
    _apply(processors, sequences, scores)
    # The best `keep` continuations of a sentence are among the best `keep` of each of its beams (a beam's score
    # shifts its whole row), so only (n, beams*keep) candidates are compared across beams.
    values, tokens = graphs.ops.topk(scores, keep)
    return values, tokens, scores.shape[-1], cache


def _advance(
    state: _Beams, totals: np.ndarray, flat_ids: np.ndarray, vocab: int, keep: int, cur_len: int, s: Settings
) -> np.ndarray:
    """One beam-search step on the candidates' `totals` (n, c) at `flat_ids` (beam * vocab + token, (n, c));
    updates `state`, returns the cache rows to keep."""
    n, k = state.running_scores.shape
    # Top continuations over all beams of a sentence; ties go to the lower beam*vocab+token, as over the full row.
    order = topk(totals, keep, tiebreak=flat_ids)  # (n, keep)
    top = np.take_along_axis(flat_ids, order, axis=1)
    top_scores = np.take_along_axis(totals, order, axis=1)
    source, token = top // vocab, top % vocab  # beam each continuation extends, and its new token
    candidates = np.take_along_axis(state.running, source[:, :, None], axis=1)  # (n, keep, max_length)
    candidates[:, :, cur_len] = token
    hits = np.isin(token, s.eos_ids) | (cur_len + 1 >= s.max_length)  # (n, keep)

    # Live beams for the next step: the best k continuations that did not just finish.
    live_scores = top_scores + hits.astype(np.float32) * BEAM_FLOOR
    best = topk(live_scores, k)  # (n, k)
    state.running = np.take_along_axis(candidates, best[:, :, None], axis=1)
    state.running_scores = np.take_along_axis(live_scores, best, axis=1)
    cache_rows = (np.arange(n)[:, None] * k + np.take_along_axis(source, best, axis=1)).reshape(-1)

    _update_finished(state, candidates, top_scores, hits, cur_len, s)
    _update_improvable(state, cur_len + 1, s)
    return cache_rows


def _update_finished(
    state: _Beams, candidates: np.ndarray, top_scores: np.ndarray, hits: np.ndarray, cur_len: int, s: Settings
) -> None:
    k = state.finished_scores.shape[1]
    # Only the top k of the kept continuations may become finished hypotheses.
    just_finished = hits & (np.arange(hits.shape[1]) < k)[None, :]
    normalised = top_scores / np.float32(cur_len**s.length_penalty)
    full = state.is_finished.all(axis=1, keepdims=True) & (s.early_stopping is True)
    normalised = normalised + full * BEAM_FLOOR + (~state.improvable[:, None]) * BEAM_FLOOR
    normalised = normalised + (~just_finished) * BEAM_FLOOR
    merged_scores = np.concatenate([state.finished_scores, normalised.astype(np.float32)], axis=1)
    best = topk(merged_scores, k)
    state.finished = np.take_along_axis(np.concatenate([state.finished, candidates], axis=1), best[:, :, None], axis=1)
    state.finished_scores = np.take_along_axis(merged_scores, best, axis=1)
    state.is_finished = np.take_along_axis(np.concatenate([state.is_finished, just_finished], axis=1), best, axis=1)


def _update_improvable(state: _Beams, cur_len: int, s: Settings) -> None:
    # transformers' heuristic: with early_stopping=False the best live beam is judged at its current length.
    never = s.early_stopping == "never" and s.length_penalty > 0.0
    best_length = s.max_length - 1 if never else cur_len - 1
    best_live = state.running_scores[:, :1] / np.float32(best_length**s.length_penalty)
    worst_finished = np.where(state.is_finished, state.finished_scores.min(axis=1, keepdims=True), BEAM_FLOOR)
    state.improvable &= np.any(best_live > worst_finished, axis=1)


def _hypotheses(state: _Beams, s: Settings) -> list[Hypothesis]:
    out = []
    for j in range(s.num_return_sequences):
        tokens = state.finished[0, j, 1:].tolist()
        end = next((i + 1 for i, t in enumerate(tokens) if t in s.eos_ids), len(tokens))
        out.append(Hypothesis(tokens[:end], float(state.finished_scores[0, j])))
    return out


def _cancelled_hypotheses(state: _Beams, length: int, s: Settings) -> list[Hypothesis]:
    """What a cancelled sentence had: its best live beams so far, unfinished."""
    return [
        Hypothesis(state.running[0, j, 1:length].tolist(), float(state.running_scores[0, j]), cancelled=True)
        for j in range(s.num_return_sequences)
    ]
