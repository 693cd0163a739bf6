"""The search rules, written once: greedy and beam search over rows that each carry their own length, limit and
settings, and the logits processors, in transformers' order.

The semantics are transformers' `generate()` (v4.57 to v5.x), so that token ids can be compared exactly: greedy
search is `_sample` without sampling; beam search is the vectorised `_beam_search` (top 2*beams continuations,
finished hypotheses kept per sentence, the same early-stopping heuristic). Scores stay float32 as there.

Two drivers step these rules (runtime/running.py): a running batch whose rows join and leave at every step (in
flight), and a static padded batch (graphs that take one cache length for all rows). Neither holds a rule of its
own: a driver runs the decoder for the rows' `inputs()`, hands the logits to `search_step`, and moves its cache
as the returned `Advance`s say. Nothing here calls a model or assumes an encoder: a row's history
starts with whatever the prompt put in it.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol, cast

import numpy as np

from ..manifest import Manifest
from .options import DecodeOptions

NEG_INF = np.float32(-np.inf)
# transformers marks impossible beams with -1e9, not -inf; the same constant keeps ties identical.
BEAM_FLOOR = np.float32(-1.0e9)
# transformers' length where the model's configs name none: GenerationConfig's max_length 20, which generate()
# counts after the decoder start ("by default let's always generate 20 new tokens"). MADLAD-400 and mT5 ship no
# length; the service gives them a longer one (ServeOptions.fallback_max_new_tokens).
DEFAULT_MAX_NEW_TOKENS = 20

# Polled once per step: (texts,) bool, True for the texts whose request is gone (timed out, client disconnected).
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


def names_no_length(manifest: Manifest) -> bool:
    """Whether the model's generation defaults name no length (neither max_length nor max_new_tokens), so that
    DEFAULT_MAX_NEW_TOKENS applies unless the caller sets one."""
    gen = manifest.generation
    return gen.get("max_length") is None and gen.get("max_new_tokens") is None


def resolve_settings(manifest: Manifest, options: DecodeOptions) -> Settings:
    """Options first, then the model's generation defaults, then transformers' defaults."""
    gen, tokens = manifest.generation, manifest.tokens

    def pick(option: Any, key: str, default: Any) -> Any:
        if option is not None:
            return option
        return gen[key] if gen.get(key) is not None else default

    beams = int(pick(options.beams, "num_beams", 1))
    if beams < 1:
        raise ValueError(f"beams must be at least 1, got {beams}")
    if options.num_return_sequences > beams:
        raise ValueError(f"num_return_sequences ({options.num_return_sequences}) cannot exceed beams ({beams})")
    max_positions = int(manifest.model["max_positions"])
    max_new = options.max_new_tokens
    if max_new is not None:
        if max_new < 1:
            raise ValueError(f"max_new_tokens must be at least 1, got {max_new}")
        max_length = max_new + 1
    elif options.max_length is not None or gen.get("max_length") is not None:
        max_length = int(pick(options.max_length, "max_length", None))
    elif not names_no_length(manifest):
        max_length = int(gen["max_new_tokens"]) + 1
    else:
        max_length = min(DEFAULT_MAX_NEW_TOKENS + 1, max_positions)
    if max_length > max_positions + 1:
        # transformers caps at the model's positions and warns; a too-long request is not an error.
        warnings.warn(
            f"max_new_tokens {max_length - 1} is more than this model can generate: capped at {max_positions}",
            stacklevel=2,
        )
        max_length = max_positions + 1
    min_new = pick(options.min_new_tokens, "min_new_tokens", None)
    min_length = int(min_new) + 1 if min_new is not None else int(pick(options.min_length, "min_length", 0))
    eos_ids = tuple(int(t) for t in tokens.get("eos_ids", [tokens["eos"]]))
    return Settings(
        num_beams=beams,
        max_length=max_length,
        min_length=min_length,
        length_penalty=float(pick(options.length_penalty, "length_penalty", 1.0)),
        early_stopping=pick(options.early_stopping, "early_stopping", False),
        num_return_sequences=options.num_return_sequences,
        decoder_start=int(tokens["decoder_start"]),
        eos_ids=eos_ids,
        pad=int(tokens["pad"]) if tokens.get("pad") is not None else eos_ids[0],
        bad_words=tuple(tuple(w) for w in gen.get("bad_words_ids") or ()),
        suppress=tuple(gen.get("suppress_tokens") or ()),
        begin_suppress=tuple(gen.get("begin_suppress_tokens") or ()),
        forced_eos=gen.get("forced_eos_token_id"),
        no_repeat_ngram_size=int(pick(options.no_repeat_ngram_size, "no_repeat_ngram_size", 0)),
        repetition_penalty=float(pick(options.repetition_penalty, "repetition_penalty", 1.0)),
        forced_bos=gen.get("forced_bos_token_id"),
        renormalize=bool(pick(options.renormalize_logits, "renormalize_logits", False)),
    )


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
    languages). Every row of the first step is live, so per-row ids line up with its rows: one per sentence in
    greedy search, each sentence's beams in beam search."""

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

    log_softmax_inplace: Callable[[np.ndarray], np.ndarray]

    def __call__(self, sequences: np.ndarray, scores: np.ndarray) -> None:
        self.log_softmax_inplace(scores)


def build_processors(
    s: Settings,
    log_softmax_inplace: Callable[[np.ndarray], np.ndarray] | None = None,
    forced_bos: np.ndarray | None = None,
    offset: int = 0,
) -> list[LogitsProcessor]:
    """The processors `s` asks for, in the order transformers' `_get_logits_processor` applies them. Renormalising
    needs `log_softmax_inplace` (it overwrites its argument); greedy search leaves it out (it cannot change an
    argmax, and greedy scores are already log-probabilities of the processed logits). `forced_bos`: the first step's
    rows' first tokens (`ForcedBos`), in place of `s.forced_bos` (the language scheme's forced target language).
    `offset`: prompt tokens the histories hold before the start token (a decoder-only prompt, `Rows.prompts`):
    the lengths the processors compare with (min and max length, the first free position) move by as much, as
    transformers counts a decoder-only prompt in its lengths."""
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
        processors.append(MinLength(s.min_length + offset, s.eos_ids))
    if forced is not None:
        if offset:
            raise ValueError("a decoder-only prompt forces no first token")
        processors.append(ForcedBos(forced))
    if s.forced_eos is not None:
        processors.append(ForcedEos(s.max_length + offset, s.forced_eos))
    if s.suppress:
        processors.append(SuppressTokens(s.suppress))
    if s.begin_suppress:
        # The first free position: after the decoder start token, and after the forced token when there is one.
        processors.append(SuppressTokens(s.begin_suppress, at_length=offset + (1 if forced is None else 2)))
    if s.renormalize and log_softmax_inplace is not None:
        processors.append(Renormalize(log_softmax_inplace))
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


def forced_bos_rows(forced: Sequence[int | None], settings: Settings) -> np.ndarray | None:
    """The rows' forced first tokens (`ForcedBos`), or None when no prompt forces one (the model's own
    forced_bos_token_id, if any, then applies to all rows)."""
    if all(f is None for f in forced):
        return None
    fallback = settings.forced_bos
    if any(f is None for f in forced) and fallback is None:
        raise ValueError("a batch cannot mix texts with and without a forced first token")
    return np.array([fallback if f is None else f for f in forced], dtype=np.int64)


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


def initial_beams(sentences: int, s: Settings) -> _Beams:
    """Every sentence's beams before the first step: the decoder start token, and only beam 0 real."""
    k = s.num_beams
    running = np.full((sentences, k, s.max_length), s.pad, dtype=np.int64)
    running[:, :, 0] = s.decoder_start
    running_scores = np.zeros((sentences, k), dtype=np.float32)
    running_scores[:, 1:] = BEAM_FLOOR  # only beam 0 is real at the start, so the k beams do not duplicate it
    return _Beams(
        running=running,
        running_scores=running_scores,
        finished=running.copy(),
        finished_scores=np.full((sentences, k), BEAM_FLOOR, dtype=np.float32),
        is_finished=np.zeros((sentences, k), dtype=bool),
        improvable=np.ones(sentences, dtype=bool),
        ids=np.arange(sentences),
    )


def _advance(
    state: _Beams,
    totals: np.ndarray,
    flat_ids: np.ndarray,
    vocab: int,
    keep: int,
    cur_len: np.ndarray,
    s: Settings,
    max_length: np.ndarray,
) -> np.ndarray:
    """One beam-search step on the candidates' `totals` (n, c) at `flat_ids` (beam * vocab + token, (n, c));
    updates `state`, returns the cache rows to keep. `cur_len` and `max_length`: (n,) each sentence's tokens so far
    and limit (sentences join a running batch at different steps with different limits); `state.running` is as
    wide as the longest limit."""
    n, k = state.running_scores.shape
    rows = np.arange(n)[:, None]  # plain fancy indexing: take_along_axis's own overhead is most of its cost here
    # Top continuations over all beams of a sentence; ties go to the lower beam*vocab+token, as over the full row.
    order = topk(totals, keep, tiebreak=flat_ids)  # (n, keep)
    top = flat_ids[rows, order]
    top_scores = totals[rows, order]
    source, token = top // vocab, top % vocab  # beam each continuation extends, and its new token
    candidates = state.running[rows, source]  # (n, keep, max_length)
    candidates[rows, np.arange(keep)[None, :], cur_len[:, None]] = token
    hits = is_eos(token, s.eos_ids) | (cur_len + 1 >= max_length)[:, None]  # (n, keep)

    # Live beams for the next step: the best k continuations that did not just finish.
    live_scores = top_scores + hits.astype(np.float32) * BEAM_FLOOR
    best = topk(live_scores, k)  # (n, k)
    state.running = candidates[rows, best]
    state.running_scores = live_scores[rows, best]
    cache_rows = (rows * k + source[rows, best]).reshape(-1)

    _update_finished(state, candidates, top_scores, hits, cur_len, s)
    _update_improvable(state, cur_len + 1, s, max_length)
    return cache_rows


def _penalised(lengths: np.ndarray, penalty: float) -> np.ndarray:
    """What scores at these lengths are divided by: `length ** penalty` in float32, as transformers computes it
    (a Python power, then float32); (n, 1) for (n,) lengths."""
    powers = {length: np.float32(length**penalty) for length in set(lengths.tolist())}
    return np.array([powers[length] for length in lengths.tolist()], dtype=np.float32)[:, None]


def is_eos(tokens: np.ndarray, eos_ids: Sequence[int]) -> np.ndarray:
    """Which `tokens` end a text: one comparison for one end token (np.isin sorts, for every call)."""
    return tokens == eos_ids[0] if len(eos_ids) == 1 else np.isin(tokens, eos_ids)


def _update_finished(
    state: _Beams, candidates: np.ndarray, top_scores: np.ndarray, hits: np.ndarray, cur_len: np.ndarray, s: Settings
) -> None:
    k = state.finished_scores.shape[1]
    rows = np.arange(len(hits))[:, None]
    # Only the top k of the kept continuations may become finished hypotheses.
    just_finished = hits & (np.arange(hits.shape[1]) < k)[None, :]
    normalised = top_scores / _penalised(cur_len, s.length_penalty)
    full = state.is_finished.all(axis=1, keepdims=True) & (s.early_stopping is True)
    normalised = normalised + full * BEAM_FLOOR + (~state.improvable[:, None]) * BEAM_FLOOR
    normalised = normalised + (~just_finished) * BEAM_FLOOR
    merged_scores = np.concatenate([state.finished_scores, normalised.astype(np.float32)], axis=1)
    best = topk(merged_scores, k)
    state.finished = np.concatenate([state.finished, candidates], axis=1)[rows, best]
    state.finished_scores = merged_scores[rows, best]
    state.is_finished = np.concatenate([state.is_finished, just_finished], axis=1)[rows, best]


def _update_improvable(state: _Beams, cur_len: np.ndarray, s: Settings, max_length: np.ndarray) -> None:
    # transformers' heuristic: with early_stopping=False the best live beam is judged at its current length.
    never = s.early_stopping == "never" and s.length_penalty > 0.0
    best_length = max_length - 1 if never else cur_len - 1
    best_live = state.running_scores[:, :1] / _penalised(best_length, s.length_penalty)
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


# ---------------------------------------------------------------------------------------------------------------
# Rows: texts of one setting in a batch, each at its own length.


@dataclass
class Step:
    """What one step of a running batch did: the tokens greedy rows took, (key, token) in row order, and the texts
    it finished, (key, hypotheses)."""

    tokens: list[tuple[object, int]] = field(default_factory=list)
    finished: list[tuple[object, list[Hypothesis]]] = field(default_factory=list)


@dataclass
class Advance:
    """A cohort's part of a step: its rows to keep, as indices into its rows before the step (beams reordered),
    and its sentences to keep, as indices into its sentences before the step; `shared`: per row kept, how many of
    its cache positions the row at its place already holds, if the cohort's rows stay where they are (beams of one
    sentence with a common prefix: see `_shared`)."""

    rows: np.ndarray
    sentences: np.ndarray
    shared: np.ndarray | None = None


class Rows:
    """Texts of one setting in the running batch (greedy: one setting; beam search: one but the length limits),
    each at its own length. `keys` name them to the caller; `cancelled` polls which of the texts admitted are no
    longer wanted ((n,) bool); `forced`: each text's forced first token, where texts have their own. Their logits
    processors are the settings' but the renormalisation, which the batch does once for all its rows.

    `prompts`: a decoder-only model's texts, each its whole prompt. A text's last prompt token is its start token
    (the encoder-decoders' decoder start: the first step feeds it, its cache holding the rest of the prompt), so
    lengths, limits, length penalties and hypotheses count as for an encoder-decoder, from the start token, as
    transformers counts from its `decoder_prompt_len`; the processors see the prompt before it in their histories
    (the repetition penalty applies over the prompt, as transformers applies it)."""

    polls: list[tuple[Callable[[], np.ndarray], int]]  # each text's request poll, and its place in it

    def __init__(
        self,
        keys: Sequence[object],
        settings: Settings,
        cancelled: Callable[[], np.ndarray],
        forced: np.ndarray | None = None,
        prompts: Sequence[Sequence[int]] | None = None,
    ) -> None:
        self.keys = list(keys)
        self.s = settings
        self.forced = forced
        self.keep = max(2, 1 + len(settings.eos_ids)) * settings.num_beams  # beam search: continuations per row
        self.polls = [(cancelled, i) for i in range(len(self.keys))]
        # Each text's prompt before its start token; its start token.
        self.prefixes: list[np.ndarray] | None = None
        self.starts: np.ndarray | None = None
        if prompts is not None:
            if len(prompts) != len(self.keys) or any(len(p) == 0 for p in prompts):
                raise ValueError("one prompt of at least one token per text")
            self.prefixes = [np.asarray(p[:-1], dtype=np.int64) for p in prompts]
            self.starts = np.array([p[-1] for p in prompts], dtype=np.int64)
        self._start()

    @property
    def offsets(self) -> np.ndarray:
        """(texts,) prompt tokens before each text's start token (0 without prompts)."""
        if self.prefixes is None:
            return np.zeros(len(self.keys), dtype=np.int64)
        return np.array([len(p) for p in self.prefixes], dtype=np.int64)

    def histories(self, history: np.ndarray, start: int, stop: int) -> np.ndarray:
        """`history` (rows, length) of the texts `start:stop` (all with one prompt length, `beams` rows each) with
        their prompts before it, as the processors see them."""
        if self.prefixes is None:
            return history
        beams = len(history) // (stop - start)
        prefix = np.repeat(np.stack(self.prefixes[start:stop]), beams, axis=0)
        return np.concatenate([prefix, history], axis=1)

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

    def leave(self, gone: np.ndarray) -> Advance:
        """The texts `gone` ((texts,) bool) leave between steps (preempted); what the others keep."""
        raise NotImplementedError

    def merges(self, other: Rows) -> bool:
        """Whether `other` (just admitted) can be merged into this cohort."""
        raise NotImplementedError

    def merge(self, other: Rows) -> None:
        """`other`'s texts (just admitted) after this cohort's."""
        raise NotImplementedError

    def _appended(self, other: Rows) -> None:
        """`other`'s texts' keys, polls, forced tokens and prompts after this cohort's (each cohort merges its own
        arrays)."""
        self.keys += other.keys
        self.polls += other.polls
        if self.forced is not None and other.forced is not None:
            self.forced = np.concatenate([self.forced, other.forced])
        if self.prefixes is not None and other.prefixes is not None:
            self.prefixes += other.prefixes

    def _kept(self, texts: np.ndarray) -> None:
        """Only the texts `texts` (indices) keep their keys, polls, forced tokens and prompts, in that order."""
        self.keys = [self.keys[i] for i in texts.tolist()]
        self.polls = [self.polls[i] for i in texts.tolist()]
        self.forced = None if self.forced is None else self.forced[texts]
        self.prefixes = None if self.prefixes is None else [self.prefixes[i] for i in texts.tolist()]

    def _mergeable(self, other: Rows) -> bool:
        """What every kind of cohort needs to merge `other`: forced tokens and prompts in both or neither."""
        return (other.forced is None) == (self.forced is None) and (other.prefixes is None) == (self.prefixes is None)

    def _cancelled(self) -> np.ndarray:
        """(texts,) bool: each request's poll called once, each text's flag taken from its request's answer."""
        polled: dict[int, np.ndarray] = {}
        for poll, _ in self.polls:
            if id(poll) not in polled:
                polled[id(poll)] = poll()
        return np.array([polled[id(poll)][i] for poll, i in self.polls], dtype=bool)


class GreedyRows(Rows):
    """Greedy texts of one setting, each at its own length: texts that join later with the same setting are merged
    into the running cohort (`merge`), so that a step's bookkeeping is one set of array operations for all of them,
    not one per request. The processors run on each run of rows of one length, with that run's history, as they
    would alone. Arrays hold the texts still running only; a text that leaves gives its row to the last one
    (`_filled`)."""

    def _start(self) -> None:
        n, s = len(self.keys), self.s
        self.sequences = np.full((n, s.max_length), s.pad, dtype=np.int64)  # (n, max_length)
        self.sequences[:, 0] = s.decoder_start if self.starts is None else self.starts
        self.lengths = np.ones(n, dtype=np.int64)  # tokens so far, the decoder start counted
        self.totals = np.zeros(n, dtype=np.float32)
        self.processors = build_processors(s, None, self.forced)
        self._built: dict[int, list[LogitsProcessor]] = {0: self.processors}  # per prompt offset

    @property
    def rows(self) -> int:
        return len(self.keys)

    def inputs(self) -> np.ndarray:
        return self.sequences[np.arange(len(self.keys)), self.lengths - 1][:, None]

    def merges(self, other: Rows) -> bool:
        return isinstance(other, GreedyRows) and other.s == self.s and self._mergeable(other)

    def merge(self, other: Rows) -> None:
        assert isinstance(other, GreedyRows)
        self._appended(other)
        self.sequences = np.concatenate([self.sequences, other.sequences])
        self.lengths = np.concatenate([self.lengths, other.lengths])
        self.totals = np.concatenate([self.totals, other.totals])

    def process(self, logits: np.ndarray) -> None:
        """The processors on each run of texts of one length (and prompt length), with that run's history (and its
        forced tokens)."""
        if not self.processors:
            return
        offsets = self.offsets
        for start, stop in _runs(self.lengths, offsets):
            length, offset = int(self.lengths[start]), int(offsets[start])
            if length == 1 and self.forced is not None:
                processors = build_processors(self.s, None, self.forced[start:stop])
            else:
                if offset not in self._built:
                    self._built[offset] = build_processors(self.s, None, self.forced, offset)
                processors = self._built[offset]
            history = self.histories(self.sequences[start:stop, :length], start, stop)
            _apply(processors, history, logits[start:stop])

    def advance(self, chosen: np.ndarray, log_probs: np.ndarray, step: Step) -> Advance:
        """A greedy step for this cohort's rows: the tokens they chose from their processed logits and
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
        return self.leave(done | dropped)

    def leave(self, gone: np.ndarray) -> Advance:
        """The texts `gone` ((texts,) bool) leave; the others keep their state."""
        keep = _filled(gone)
        if len(keep) < len(gone):
            self._kept(keep)
            self.sequences, self.lengths, self.totals = self.sequences[keep], self.lengths[keep], self.totals[keep]
        return Advance(keep, keep)


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


class BeamRows(Rows):
    """Beam-search texts of one setting but their length limits (`max_new_tokens`), each sentence at its own length
    and limit: texts that join later are merged into the running cohort (`merge`), so that a step's search is one
    set of array operations for all of them (`_advance` with per-sentence lengths), not one per request, as for
    greedy texts. The processors run on each run of sentences of one length and limit, with that run's history.
    A sentence's beams are its rows, together; a sentence that leaves gives its place to the last one (`_filled`).
    `forced`: each sentence's forced first token, where texts have their own."""

    def _start(self) -> None:
        n = len(self.keys)
        self.state = initial_beams(n, self.s)  # as wide as the longest limit
        if self.starts is not None:
            self.state.running[:, :, 0] = self.starts[:, None]
            self.state.finished[:, :, 0] = self.starts[:, None]
        self.lengths = np.ones(n, dtype=np.int64)  # tokens so far, the decoder start counted
        self.limits = np.full(n, self.s.max_length, dtype=np.int64)  # each sentence's max_length
        self._built: dict[tuple[int, int], list[LogitsProcessor]] = {}  # per limit and prompt offset, past step 1

    @property
    def rows(self) -> int:
        return self.sentences * self.s.num_beams

    def inputs(self) -> np.ndarray:
        last = self.state.running[np.arange(self.sentences), :, self.lengths - 1]  # (n, beams)
        return last.reshape(-1, 1)

    def merges(self, other: Rows) -> bool:
        return (
            isinstance(other, BeamRows)
            and replace(other.s, max_length=0) == replace(self.s, max_length=0)
            and self._mergeable(other)
        )

    def merge(self, other: Rows) -> None:
        assert isinstance(other, BeamRows)
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
        offsets = self.offsets
        for start, stop in _runs(self.lengths, self.limits, offsets):
            length, limit, offset = int(self.lengths[start]), int(self.limits[start]), int(offsets[start])
            processors = self._processors(length, limit, offset, start, stop, beams)
            if not processors:
                continue
            history = self.state.running[start:stop, :beams, :length].reshape((stop - start) * beams, length)
            _apply(processors, self.histories(history, start, stop), scores[start * beams : stop * beams])

    def _processors(
        self, length: int, limit: int, offset: int, start: int, stop: int, beams: int
    ) -> list[LogitsProcessor]:
        """The processors of the sentences `start:stop` (renormalisation left to the batch): their own forced
        first tokens at their first step; past it, those of their limit and prompt length (a forced token is only
        ever applied at the first step, but whether one is forced decides which step `begin_suppress_tokens`
        applies to)."""
        if length == 1 and self.forced is not None:
            own = np.repeat(self.forced[start:stop], beams)
            return build_processors(replace(self.s, max_length=limit), None, own)
        if (limit, offset) not in self._built:
            some = None if self.forced is None else self.forced[start : start + 1]
            self._built[limit, offset] = build_processors(replace(self.s, max_length=limit), None, some, offset)
        return self._built[limit, offset]

    def advance(self, values: np.ndarray, tokens: np.ndarray, vocab: int, step: Step) -> Advance:
        """A beam-search step for this cohort's sentences, each at its own length and limit: each row's best
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
        self.lengths = lengths + 1
        live, kept = self._left(frozen | dropped, rows)
        return Advance(kept, live, _shared(history, kept, live, lengths))

    def leave(self, gone: np.ndarray) -> Advance:
        """The texts `gone` ((texts,) bool) leave with their beams; the others keep their state."""
        live, kept = self._left(gone, np.arange(self.rows))
        return Advance(kept, live)

    def _left(self, gone: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The sentences left when `gone` leave (indices), and their rows (`rows`: each row's source before)."""
        k, n = self.s.num_beams, len(gone)
        live = _filled(gone)
        kept = rows.reshape(n, k)[live].reshape(-1)
        self.state = self.state.take(live)
        self.lengths, self.limits = self.lengths[live], self.limits[live]
        if len(live) < n:
            self._kept(live)
            if len(live) and int(self.limits.max()) < self.state.running.shape[2]:
                self.state = _cut(self.state, int(self.limits.max()))  # no wider than the longest limit left
        return live, kept


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


class ScoreOps(Protocol):
    """The vocabulary-wide operations a step needs (vocab.VocabOps): in place, on the logits' buffer."""

    def log_softmax_inplace(self, logits: np.ndarray) -> np.ndarray: ...

    def topk(self, scores: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]: ...


def spans_of(groups: Sequence[Rows]) -> list[slice]:
    """Each group's rows in a decoder call that holds the groups' rows one after the other."""
    spans, row0 = [], 0
    for group in groups:
        spans.append(slice(row0, row0 + group.rows))
        row0 += group.rows
    return spans


def search_step(groups: Sequence[Rows], logits: np.ndarray, ops: ScoreOps, step: Step) -> list[Advance]:
    """One step of the search for `groups` (all greedy, or all of one beam width), whose rows are the rows of
    `logits` (rows, vocab) in order: the tokens taken and texts finished go to `step`; per group, what its rows
    keep (`Advance`). `logits` is overwritten."""
    spans = spans_of(groups)
    if all(isinstance(g, GreedyRows) for g in groups):
        return _greedy_step(cast("list[GreedyRows]", list(groups)), spans, logits, ops, step)
    return _beam_step(cast("list[BeamRows]", list(groups)), spans, logits, ops, step)


def _greedy_step(
    groups: list[GreedyRows], spans: list[slice], logits: np.ndarray, ops: ScoreOps, step: Step
) -> list[Advance]:
    """Every group's processors on its rows' logits; then the argmax and the log-softmax of all rows at once."""
    for group, span in zip(groups, spans, strict=True):
        group.process(logits[span])
    chosen = logits.argmax(axis=-1)
    log_probs = ops.log_softmax_inplace(logits)  # the logits are not needed any more
    picked = np.take_along_axis(log_probs, chosen[:, None], axis=1)[:, 0]
    return [group.advance(chosen[span], picked[span], step) for group, span in zip(groups, spans, strict=True)]


def _beam_step(
    groups: list[BeamRows], spans: list[slice], logits: np.ndarray, ops: ScoreOps, step: Step
) -> list[Advance]:
    """The log-softmax of all rows; every group's processors on its rows; the renormalisation and the top-k of all
    rows at once (a group keeping fewer takes the first of them: top-k is sorted, ties to the lower index)."""
    scores = ops.log_softmax_inplace(logits)  # (rows, vocab), in the logits' buffer
    for group, span in zip(groups, spans, strict=True):
        group.process(scores[span])
    renormalize = [g.s.renormalize for g in groups]
    if all(renormalize):
        ops.log_softmax_inplace(scores)
    else:
        for span in (span for span, r in zip(spans, renormalize, strict=True) if r):
            ops.log_softmax_inplace(scores[span])
    values, tokens = ops.topk(scores, max(g.keep for g in groups))
    vocab = scores.shape[-1]
    return [
        group.advance(values[span, : group.keep], tokens[span, : group.keep], vocab, step)
        for group, span in zip(groups, spans, strict=True)
    ]


def new_rows(
    keys: Sequence[object],
    settings: Settings,
    cancelled: Cancelled,
    forced: np.ndarray | None,
    prompts: Sequence[Sequence[int]] | None = None,
) -> Rows:
    """The search state of texts starting together: greedy or beam rows, as `settings` says; `prompts`: a
    decoder-only model's (`Rows`)."""
    if settings.num_beams > 1:
        return BeamRows(keys, settings, cancelled, forced, prompts)
    return GreedyRows(keys, settings, cancelled, forced, prompts)
