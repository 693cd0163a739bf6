"""The running batch's cache buffers (runtime/slots.py): after any sequence of joins, reorders and departures, the
live rows hold what concatenating and gathering the caches would hold, wherever the decoder reads them."""

from __future__ import annotations

import numpy as np

from onnxmt.runtime.graphs import Cache
from onnxmt.runtime.slots import CacheSlots

HEADS, DIM, LAYERS = 2, 3, 2


def _cohort(rng: np.random.Generator, sentences: int, beams: int, positions: int) -> Cache:
    """An encoded cohort as the running batch adds it: random K/V, right-padded source widths, lengths."""
    widths = rng.integers(1, 40, size=sentences)
    width = int(widths.max())
    mask = (np.arange(width)[None, :] < widths[:, None]).astype(np.int64)
    cross = tuple(rng.standard_normal((sentences, HEADS, width, DIM)).astype(np.float32) * mask[:, None, :, None]
                  for _ in range(2 * LAYERS))  # fmt: skip
    rows = sentences * beams
    lengths = rng.integers(0, positions + 1, size=rows)
    kv = tuple(rng.standard_normal((rows, HEADS, positions, DIM)).astype(np.float32) for _ in range(2 * LAYERS))
    return Cache(mask=mask, self_kv=kv, cross_kv=cross, per_sentence=True, self_len=lengths, max_positions=200)


def _same_live(slots: CacheSlots, rows: list[tuple[np.ndarray, ...]], sentences: list[tuple]) -> None:
    view = slots.view()
    assert view.self_len is not None and view.cross_kv is not None
    assert len(view.self_len) == len(rows) and view.sentences == len(sentences)
    for r, (length, *kv) in enumerate(rows):
        assert view.self_len[r] == length
        for buffer, expected in zip(view.self_kv, kv, strict=True):
            np.testing.assert_array_equal(buffer[r, :, :length], expected[:, :length])
    for s, (mask, *cross) in enumerate(sentences):
        width = len(mask)
        np.testing.assert_array_equal(view.mask[s, :width], mask)
        assert not view.mask[s, width:].any()  # the decoder reads nothing past a sentence's width
        for buffer, expected in zip(view.cross_kv, cross, strict=True):
            np.testing.assert_array_equal(buffer[s, :, :width], expected)
    for a in (*view.self_kv, *view.cross_kv, view.mask):
        assert a.flags.c_contiguous  # ONNX Runtime reads the views in place


def test_joins_reorders_and_departures_keep_every_live_row() -> None:
    rng = np.random.default_rng(0)
    beams = 2
    slots: CacheSlots | None = None
    rows: list[tuple[np.ndarray, ...]] = []  # the reference: per live row (length, *per-layer K/V)
    sentences: list[tuple] = []  # per live sentence (mask, *per-layer cross K/V)
    seen = set()
    for step in range(60):
        if step < 30 or step % 7 == 0:  # grow, then mostly leave
            cache = _cohort(rng, int(rng.integers(1, 4)), beams, positions=int(rng.integers(1, 50)))
            slots = slots or CacheSlots.like(cache)
            slots.add(cache)
            for r in range(len(cache.self_len)):
                rows.append((cache.self_len[r], *(a[r] for a in cache.self_kv)))
            for s in range(cache.sentences):
                width = int(cache.mask[s].sum())
                sentences.append((cache.mask[s, :width], *(a[s, :, :width] for a in cache.cross_kv)))
        assert slots is not None
        _same_live(slots, rows, sentences)
        seen.add(slots.capacity)
        # A step: some sentences leave, the others' beams reorder among themselves.
        n = len(sentences)
        live = np.flatnonzero(rng.random(n) > (0.1 if step < 30 else 0.3))
        picks = rng.integers(0, beams, size=(len(live), beams))
        kept_rows = (live[:, None] * beams + picks).reshape(-1)
        slots.keep(kept_rows, live)
        rows = [rows[r] for r in kept_rows]
        sentences = [sentences[s] for s in live]
        if not rows:
            break
    capacities = np.array(sorted(seen))
    assert capacities[:, 0].max() > 3 * capacities[:, 0].min()  # the buffers grew ...
    assert slots is not None and slots.capacity[0] < capacities[:, 0].max()  # ... and shrank as rows left


def test_the_longest_row_grows_the_positions_by_a_chunk_up_to_its_limit() -> None:
    rng = np.random.default_rng(1)
    cache = _cohort(rng, 1, 1, positions=1)
    cache = Cache(**{**cache.__dict__, "self_len": np.array([1]), "max_positions": 60})
    slots = CacheSlots.like(cache)
    slots.add(cache)
    grown = []
    for length in (1, 17, 33):
        slots.lengths[0] = length  # the buffer full
        grown.append(slots.view().self_kv[0].shape[2])
    # A chunk (16) more each time, and straight to the limit when less than a chunk would be left after.
    assert grown == [17, 33, 60]
