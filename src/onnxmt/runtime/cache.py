"""The decoder's state between steps (`Cache`) and how its self-attention buffers grow: whole blocks of key
positions, a chunk of positions at a time."""

from __future__ import annotations

import importlib
from dataclasses import dataclass, replace

import numpy as np

# numpy's switch for advising the kernel to back large arrays with transparent huge pages (on by default).
_set_madvise_hugepage = getattr(importlib.import_module("numpy._core.multiarray"), "_set_madvise_hugepage", None)


@dataclass(frozen=True)
class Cache:
    """Decoder state. Row r of the self-attention cache belongs to one hypothesis: sentence r // beams.

    With `per_sentence` (onnxmt's graphs), the mask and cross-attention K/V hold one row per sentence, which the
    decoder graph broadcasts over that sentence's beams; otherwise (Optimum's graphs) one row per hypothesis.
    """

    mask: np.ndarray  # (sentences or rows, src_len) encoder attention mask
    self_kv: tuple[np.ndarray, ...]  # per layer key, value: (rows, heads, past_len, head_dim)
    cross_kv: tuple[np.ndarray, ...] | None  # per layer key, value: (sentences or rows, heads, src_len, head_dim)
    encoder_states: np.ndarray | None = None  # (rows, src_len, d_model); only Optimum's first step needs it
    per_sentence: bool = False
    # Buffers: each row's positions of self_kv that hold its cache (the rest is spare capacity), (rows,); None: all.
    self_len: np.ndarray | None = None
    # Buffers: the most positions the decoding loop will write (its max_length - 1); None: not known.
    max_positions: int | None = None

    @property
    def sentences(self) -> int:
        """Before `expand_beams`: the number of sentences (one row each)."""
        return int(self.mask.shape[0])

    def select(self, sentences: np.ndarray, beams: int = 1) -> Cache:
        """The cache of the given sentences, each with its `beams` rows, in that order (drops finished ones)."""
        rows = (sentences[:, None] * beams + np.arange(beams)).reshape(-1)
        shared = sentences if self.per_sentence else rows

        def take(arrays: tuple[np.ndarray, ...] | None, index: np.ndarray) -> tuple[np.ndarray, ...] | None:
            return None if arrays is None else tuple(a[index] for a in arrays)

        return Cache(
            mask=self.mask[shared],
            self_kv=take(self.self_kv, rows) or (),
            cross_kv=take(self.cross_kv, shared),
            encoder_states=None if self.encoder_states is None else self.encoder_states[rows],
            per_sentence=self.per_sentence,
            self_len=None if self.self_len is None else self.self_len[rows],
            max_positions=self.max_positions,
        )

    def take(self, rows: np.ndarray, sentences: np.ndarray) -> Cache:
        """The cache of `rows` (decoder rows, in their new order) whose sentences are `sentences` (in order): a
        batch's rows after a step, its beams reordered and finished rows gone. When no sentence leaves, only the
        rows that change are copied, in place (`reorder_beams`)."""
        if len(rows) == self.self_kv[0].shape[0] and np.array_equal(sentences, np.arange(len(sentences))):
            return self.reorder_beams(rows)
        shared = sentences if self.per_sentence else rows
        return replace(
            self,
            mask=self.mask[shared],
            self_kv=tuple(a[rows] for a in self.self_kv),
            cross_kv=None if self.cross_kv is None else tuple(a[shared] for a in self.cross_kv),
            encoder_states=None if self.encoder_states is None else self.encoder_states[rows],
            self_len=None if self.self_len is None else self.self_len[rows],
        )

    def expand_beams(self, beams: int) -> Cache:
        """Each sentence's row repeated `beams` times (beam search's start); shared arrays stay as they are."""
        rows = np.repeat(np.arange(self.sentences), beams)
        if not self.per_sentence:
            return self.select(rows)
        lengths = None if self.self_len is None else self.self_len[rows]
        return replace(self, self_kv=tuple(a[rows] for a in self.self_kv), self_len=lengths)

    def reorder_beams(self, rows: np.ndarray) -> Cache:
        """Reorder the self-attention cache among the beams of each sentence: row i takes row `rows[i]`.

        The beams of one sentence share its mask and cross-attention K/V, so only the self-attention cache moves;
        copying the cross-attention K/V every step would cost as much as the step's own cache. Only the rows that
        change are copied, in place (most beams extend themselves: about a quarter of the rows move per step on
        the benchmark's model): this cache must not be used afterwards, only the one returned.
        """
        moved = np.flatnonzero(rows != np.arange(len(rows)))
        if len(moved) == 0:
            return self
        sources = rows[moved]
        filled = self.self_kv[0].shape[2] if self.self_len is None else int(self.self_len.max(initial=0))
        kv = []
        for a in self.self_kv:
            if a.flags.writeable and a.flags.c_contiguous:
                a[moved, :, :filled] = a[sources, :, :filled]  # the right side is gathered first: cycles are safe
            else:
                a = a[rows]
            kv.append(a)
        lengths = None if self.self_len is None else self.self_len[rows]
        return replace(self, self_kv=tuple(kv), self_len=lengths)


# Positions a self-attention cache buffer grows by. Attention reads the whole buffer (the spare positions masked), so
# a larger step wastes reads and a smaller one copies the cache more often: on opus-mt's shape over 30 steps, 16 was
# as fast as the Concat of the other form at 1 to 128 rows, 8 was 5-14% slower (docs/performance.md).
SELF_KV_CHUNK = 16

# A buffer's capacity is a multiple of KEY_BLOCK (or 1, before the first step, when no position is read), and so is
# every source width the decoder reads. The attention products of a decoder step with one query row (every row's
# self-attention; a greedy row's cross-attention) run in MLAS's kernel for one row, which sums 4 key positions at a
# time and the last (length mod 4) one or two at a time, in another order of additions: a position's score would
# depend on the capacity or width of the batch its row is in. With whole blocks it does not, so a row's logits are
# the same alone and in any running batch (tests/export/test_exporter.py).
KEY_BLOCK = 4


def aligned(positions: int) -> int:
    """`positions` rounded up to a multiple of KEY_BLOCK."""
    return -(-positions // KEY_BLOCK) * KEY_BLOCK


def whole_blocks(a: np.ndarray) -> np.ndarray:
    """A (rows, width) batch of source ids or masks padded with zeros (masked positions) to a multiple of KEY_BLOCK."""
    width = aligned(a.shape[1])
    return a if width == a.shape[1] else np.pad(a, ((0, 0), (0, width - a.shape[1])))


def next_capacity(filled: int, limit: int | None) -> int:
    """The positions a full buffer of `filled` positions grows to: SELF_KV_CHUNK more, but not much past `limit`
    (the most positions the decoding loop will step), and straight to it when less than a chunk would be left after
    this growth; rounded up to a multiple of KEY_BLOCK. Growing copies the cache and holds both copies meanwhile,
    the largest transient of the cache (NLLB-600M, beam 4 at batch 32: 17 positions copied were 204 MB in
    fp32), so the last, small growth is saved."""
    capacity = filled + SELF_KV_CHUNK
    if limit is not None and limit - capacity < SELF_KV_CHUNK:
        capacity = limit
    return aligned(max(capacity, filled + 1))


def buffer_zeros(shape: tuple[int, ...], dtype: np.dtype | type) -> np.ndarray:
    """`np.zeros(shape, dtype)` in ordinary 4 KB pages. numpy advises the kernel to back arrays of 4 MB and more with
    transparent huge pages; where the kernel then compacts memory on the page fault to find one (THP `defrag`
    `madvise`, the default of many distributions, on a machine whose memory is fragmented by its page cache), the
    first write to a fresh cache buffer is slow: on this project's 2-core VM a 16 MB buffer took 30 ms to fill
    instead of 6, and a beam-4 step of 128 rows that grew its buffers 410 ms instead of 40. A growing cache is
    written once and read sequentially: small pages cost it nothing."""
    if _set_madvise_hugepage is None or np.prod(shape) * np.dtype(dtype).itemsize < 4 << 20:
        return np.zeros(shape, dtype)
    previous = _set_madvise_hugepage(False)
    try:
        return np.zeros(shape, dtype)
    finally:
        _set_madvise_hugepage(previous)


def grown(buffer: np.ndarray, filled: int, capacity: int) -> np.ndarray:
    """A copy of `buffer` (rows, heads, positions, head_dim) with `capacity` positions, its first `filled` kept."""
    out = buffer_zeros((*buffer.shape[:2], capacity, *buffer.shape[3:]), buffer.dtype)
    out[:, :, :filled] = buffer[:, :, :filled]
    return out
