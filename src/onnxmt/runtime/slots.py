"""A running batch's decoder cache, in buffers with room to spare: rows join and leave without copying the others.

A running batch changes at every step: a cohort joins (its rows appended), a text finishes (its rows removed),
beams are reordered. Concatenating and gathering whole caches for that copies every running row's K/V, self- and
cross-attention, once per join and once per departure: on opus-mt's shape under 13 requests (50 rows of beam 4)
that took a sixth of each step. Here the buffers have spare rows, sentences, source positions and decoder
positions; the decoder reads views of their first rows (a view of a buffer's leading rows is contiguous, so ONNX
Runtime reads it in place). A joining cohort is written into the spare rows; leaving rows are closed up in place,
moving only the rows whose index changes. Buffers are reallocated when a capacity runs out (by half again, or a
position chunk) or when at most a quarter of it is used (rows and sentences: for a while, see SHRINK_AFTER).

Spare places hold stale or zero values that no row reads: the decoder masks every source position past a
sentence's width and every decoder position at or past a row's length.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from .cache import KEY_BLOCK, SELF_KV_CHUNK, Cache, aligned, buffer_zeros, next_capacity

# Source positions the cross-attention buffers grow by at least (`_wider`).
WIDTH_STEP = 4 * KEY_BLOCK
# Steps in a row the buffers' rows or sentences stay at most a quarter used before they are reallocated smaller
# (`_shrink`). Under a closed loop of clients, texts that started together finish together and the next ones join a
# few steps later, once their requests are sent and encoded: shrinking at once made those joins reallocate and copy
# the buffers back up, in fresh memory, at every such turn. Spare rows cost memory only (the decoder reads the live
# rows' views).
SHRINK_AFTER = 64


@dataclass
class CacheSlots:
    """Buffers: `kv` per layer key, value (row capacity, heads, positions, head_dim); `cross` per layer
    (sentence capacity, heads, width, head_dim); `mask` (sentence capacity, width); per row its cache length and
    the most positions it will be stepped (`limits`). The first `rows` rows and `sentences` sentences are live,
    each sentence's rows together (`beams` of them, the decoder broadcasts its cross-attention K/V over them)."""

    kv: list[np.ndarray]
    cross: list[np.ndarray]
    mask: np.ndarray
    lengths: np.ndarray
    limits: np.ndarray
    rows: int = 0
    sentences: int = 0
    # Memory of buffers a reallocation let go, reused by the next one (`_buffer`): a buffer in fresh memory costs a
    # page fault per 4 KB page on its first write, which on this project's 2-core VM made a batch that grew back to
    # 46 rows after shrinking take 72-156 ms for it (46 sentences' cross-attention K/V, 68 MB); memory already
    # written is copied into at memory speed. Let go with the buffers (`RunningBatch.release`).
    spare: list[np.ndarray] = field(default_factory=list)
    low_steps: int = 0  # steps in a row with the rows or sentences at most a quarter used (`_shrink`)

    @classmethod
    def like(cls, self_kv: Sequence[np.ndarray], text: Cache) -> CacheSlots:
        """Empty buffers shaped like `self_kv` (per layer key, value: (any rows, heads, positions, head_dim)) and
        like `text`'s source (an encoded text, as `add` takes it)."""
        assert text.cross_kv is not None
        kv = [np.zeros((0, *a.shape[1:]), a.dtype) for a in self_kv]
        cross = [np.zeros((0, *a.shape[1:]), a.dtype) for a in text.cross_kv]
        mask = np.zeros((0, text.mask.shape[1]), text.mask.dtype)
        return cls(kv, cross, mask, np.zeros(0, np.int64), np.zeros(0, np.int64))

    @property
    def capacity(self) -> tuple[int, int, int, int]:
        """(rows, sentences, source width, decoder positions) the buffers hold."""
        return len(self.lengths), len(self.mask), self.mask.shape[1], self.kv[0].shape[2]

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in (*self.kv, *self.cross, self.mask))

    def add(self, texts: Sequence[Cache], beams: int = 1, max_positions: int | None = None) -> None:
        """Append encoded texts (`running.encode_texts`: one row each, cut to its own width), each a sentence with
        `beams` decoder rows that have decoded nothing yet (or hold a decoder-only prompt: the text's `self_len`
        positions of its `self_kv`) and will step at most `max_positions` positions more. Each
        text's source is written straight into the buffers; what lies past its width, and in its rows' positions,
        is masked (stale values are never read)."""
        rows, sentences = len(texts) * beams, len(texts)
        # A decoder-only text comes with its prompt in its own cache (`self_len` positions), copied to its rows.
        held = np.array([0 if t.self_len is None else int(t.self_len[0]) for t in texts], dtype=np.int64)
        cap_rows, cap_sentences, cap_width, cap_positions = self.capacity
        self._reshape(
            rows=_more(cap_rows, self.rows + rows),
            sentences=_more(cap_sentences, self.sentences + sentences),
            width=_wider(cap_width, max(aligned(text.mask.shape[1]) for text in texts)),
            positions=max(cap_positions, 1, aligned(int(held.max()))),
        )
        for j, (s, text) in enumerate(enumerate(texts, start=self.sentences)):
            assert text.cross_kv is not None
            width = text.mask.shape[1]
            for buffer, part in zip(self.cross, text.cross_kv, strict=True):
                buffer[s, :, :width] = part[0]
            self.mask[s, :width] = text.mask[0]
            self.mask[s, width:] = 0
            if held[j]:
                first = self.rows + j * beams
                for buffer, part in zip(self.kv, text.self_kv, strict=True):
                    buffer[first : first + beams, :, : held[j]] = part[0, :, : held[j]]
        r = slice(self.rows, self.rows + rows)
        self.lengths[r] = np.repeat(held, beams)
        top = np.iinfo(np.int64).max
        self.limits[r] = top if max_positions is None else np.repeat(held, beams) + max_positions
        self.rows += rows
        self.sentences += sentences

    def view(self) -> Cache:
        """The live rows as a decoder cache, with room for one more position in every row (the buffers grow to
        `next_capacity` when the longest row fills them): `Graphs.step` writes the new K/V into these buffers."""
        live = self.lengths[: self.rows]
        filled = int(live.max(initial=0))
        limit = int(self.limits[: self.rows].max(initial=1))
        if filled >= self.capacity[3]:
            self._reshape(positions=next_capacity(filled, limit))
        return Cache(
            mask=self.mask[: self.sentences],
            self_kv=tuple(a[: self.rows] for a in self.kv),
            cross_kv=tuple(a[: self.sentences] for a in self.cross),
            per_sentence=True,
            self_len=live.copy(),
            max_positions=limit,
        )

    def stepped(self, cache: Cache) -> None:
        """Take the lengths of the cache a step returned (its K/V were written into these buffers)."""
        assert cache.self_len is not None
        self.lengths[: self.rows] = cache.self_len

    def keep(self, rows: np.ndarray, sentences: np.ndarray, shared: np.ndarray | None = None) -> None:
        """Close up after a step: row i takes row `rows[i]` (beams reordered, rows gone), sentence j takes sentence
        `sentences[j]`. Only rows whose index changes move, and of each only the positions it holds past
        `shared[i]`: the positions its place holds already (beams of one sentence share their prefix), if given."""
        self._reshape(rows=_more(self.capacity[0], len(rows)))
        moved = np.flatnonzero(rows != np.arange(len(rows)))
        if len(moved):
            sources = rows[moved]
            starts = np.zeros(len(moved), np.int64) if shared is None else shared[moved]
            ends = self.lengths[sources]
            self.lengths[moved] = ends
            self.limits[moved] = self.limits[sources]
            copied = starts < ends
            _move(self.kv, moved[copied], sources[copied], starts[copied], ends[copied])
        moved = np.flatnonzero(sentences != np.arange(len(sentences)))
        if len(moved):
            sources = sentences[moved]
            for a in self.cross:
                a[moved] = a[sources]
            self.mask[moved] = self.mask[sources]
        self.rows, self.sentences = len(rows), len(sentences)
        if self.rows:  # an empty batch keeps its buffers for the texts that join next (`RunningBatch.release`)
            self._shrink()

    def _shrink(self) -> None:
        """Buffers at most a quarter used (rows, sentences: for SHRINK_AFTER steps in a row) or half (source width,
        positions: the decoder reads those whole, at once) are reallocated: at twice the rows used, the width used, a
        chunk past the longest row; so that a batch that was once large does not keep its memory nor read spare
        positions."""
        used = self.mask[: self.sentences].any(axis=0)
        width = int(np.flatnonzero(used)[-1]) + 1 if used.any() else 1
        filled = int(self.lengths[: self.rows].max(initial=0))
        wanted = (2 * self.rows, 2 * self.sentences, aligned(width), aligned(filled + SELF_KV_CHUNK))
        small = [2 * want <= cap and cap > 16 for want, cap in zip(wanted, self.capacity, strict=True)]
        self.low_steps = self.low_steps + 1 if small[0] or small[1] else 0
        if self.low_steps < SHRINK_AFTER:
            small[0] = small[1] = False
        else:  # low for SHRINK_AFTER steps (so small[0] or small[1]): shrinking now, counted again from 0
            self.low_steps = 0
        new = [want if s else cap for want, s, cap in zip(wanted, small, self.capacity, strict=True)]
        if tuple(new) != self.capacity:
            rows, sentences, width, positions = new
            self._reshape(rows, sentences, width, positions, shrink=True)

    def _reshape(
        self,
        rows: int | None = None,
        sentences: int | None = None,
        width: int | None = None,
        positions: int | None = None,
        shrink: bool = False,
    ) -> None:
        """Reallocate to these capacities (None: as now), keeping the live rows' contents; capacities only grow
        unless `shrink`. Only the buffers a changed capacity shapes are reallocated: a wider source copies the
        cross-attention K/V, not the self-attention cache (the largest), and more rows or positions the reverse."""
        now = self.capacity
        new = [now[i] if v is None else v for i, v in enumerate((rows, sentences, width, positions))]
        if not shrink:
            new = [max(a, b) for a, b in zip(new, now, strict=True)]
        cap_rows, cap_sentences, cap_width, cap_positions = new
        released: list[np.ndarray] = []
        if (cap_rows, cap_positions) != (now[0], now[3]):
            released += self.kv
            self.kv = self._copied(self.kv, cap_rows, cap_positions, self.rows, min(cap_positions, now[3]))
        if cap_rows != now[0]:
            self.lengths = _resized(self.lengths, cap_rows, self.rows)
            self.limits = _resized(self.limits, cap_rows, self.rows)
        if (cap_sentences, cap_width) != (now[1], now[2]):
            keep_width = min(cap_width, now[2])
            released += self.cross
            self.cross = self._copied(self.cross, cap_sentences, cap_width, self.sentences, keep_width)
            mask = np.zeros((cap_sentences, cap_width), self.mask.dtype)
            mask[: self.sentences, :keep_width] = self.mask[: self.sentences, :keep_width]
            self.mask = mask
        self._release(released)

    def _copied(self, arrays: list[np.ndarray], rows: int, places: int, live: int, keep: int) -> list[np.ndarray]:
        """Each of `arrays` (rows, heads, places, head_dim) in a buffer of `rows` rows and `places` places, holding
        its first `live` rows and first `keep` places; the rest holds zeros or stale values (never read)."""
        index = (slice(0, live), slice(None), slice(0, keep))
        copies = []
        for a in arrays:
            out = self._buffer((rows, a.shape[1], places, a.shape[3]), a.dtype)
            out[index] = a[index]
            copies.append(out)
        return copies

    def _buffer(self, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        """A buffer of `shape`: in the smallest spare memory that holds it, if that is at most twice its size
        (its contents stale), else zeroed in fresh memory."""
        size = int(np.prod(shape)) * dtype.itemsize
        fitting = [i for i, b in enumerate(self.spare) if size <= b.nbytes <= 2 * size]
        if not fitting or size == 0:
            return buffer_zeros(shape, dtype)
        memory = self.spare.pop(min(fitting, key=lambda i: self.spare[i].nbytes))
        return memory[:size].view(dtype).reshape(shape)

    def _release(self, buffers: list[np.ndarray]) -> None:
        """Buffers let go, kept as spare memory: the newest first, at most as many bytes as the buffers in use."""
        memory = [_memory(b) for b in buffers if b.size]
        budget = sum(a.nbytes for a in (*self.kv, *self.cross))
        kept: list[np.ndarray] = []
        for m in memory + self.spare:
            if m.nbytes <= budget and not any(m is k for k in kept):
                kept.append(m)
                budget -= m.nbytes
        self.spare = kept


def _move(
    buffers: list[np.ndarray], rows: np.ndarray, sources: np.ndarray, starts: np.ndarray, ends: np.ndarray
) -> None:
    """Row `rows[i]` of each buffer takes positions `starts[i]:ends[i]` of row `sources[i]`, each copied once, as
    slices (a gather would copy every row twice, through a temporary, and up to the longest row's length): the
    sources that are overwritten themselves are read first."""
    overwritten = np.isin(sources, rows)
    moves = list(
        zip(rows.tolist(), sources.tolist(), starts.tolist(), ends.tolist(), overwritten.tolist(), strict=True)
    )
    saved = [(row, start, end, [a[source, :, start:end].copy() for a in buffers])
             for row, source, start, end, first in moves if first]  # fmt: skip
    for row, source, start, end, first in moves:
        if not first:
            for a in buffers:
                a[row, :, start:end] = a[source, :, start:end]
    for row, start, end, parts in saved:
        for a, part in zip(buffers, parts, strict=True):
            a[row, :, start:end] = part


def _wider(capacity: int, needed: int) -> int:
    """A source width of at least `needed` (a multiple of cache.KEY_BLOCK): when it must grow, by WIDTH_STEP positions
    at least, so that texts a little longer each, joining one after another, do not reallocate the cross-attention
    K/V each time (the decoder reads the spare positions, masked: a few cost a step little)."""
    return capacity if needed <= capacity else max(needed, aligned(capacity + WIDTH_STEP))


def _more(capacity: int, needed: int) -> int:
    """A capacity of at least `needed`: half as much again as now when it must grow, so that appending rows one
    cohort at a time copies each row a bounded number of times."""
    return capacity if needed <= capacity else max(needed, capacity + capacity // 2, 8)


def _memory(buffer: np.ndarray) -> np.ndarray:
    """The whole memory `buffer` lies in, as flat bytes (a buffer may be a view into spare memory)."""
    while isinstance(buffer.base, np.ndarray):
        buffer = buffer.base
    return buffer.reshape(-1).view(np.uint8)


def _resized(a: np.ndarray, size: int, live: int) -> np.ndarray:
    out = np.zeros(size, a.dtype)
    out[:live] = a[:live]
    return out
