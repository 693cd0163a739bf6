"""The running batch's cache buffers (runtime/slots.py): after any sequence of joins, reorders and departures, the
live rows hold what concatenating and gathering the caches would hold, wherever the decoder reads them."""

from __future__ import annotations

import importlib

import numpy as np
import pytest

from onnxmt.runtime import slots as slots_module
from onnxmt.runtime.cache import Cache, buffer_zeros
from onnxmt.runtime.slots import SHRINK_AFTER, CacheSlots

HEADS, DIM, LAYERS = 2, 3, 2


def _texts(rng: np.random.Generator, sentences: int) -> list[Cache]:
    """Encoded texts as the running batch adds them (`encode_texts`): one row each, cut to its own width."""
    texts = []
    for width in rng.integers(1, 40, size=sentences).tolist():
        cross = tuple(rng.standard_normal((1, HEADS, width, DIM)).astype(np.float32) for _ in range(2 * LAYERS))
        texts.append(Cache(mask=np.ones((1, width), np.int64), self_kv=(), cross_kv=cross, per_sentence=True))
    return texts


def _step(slots: CacheSlots, rng: np.random.Generator, rows: list[list]) -> None:
    """A decoder step as `Graphs.step` takes it: every live row's new K/V written at its length into the view's
    buffers, the lengths one more; `rows` (per row: length, then per layer K/V so far) follows."""
    view = slots.view()
    assert view.self_len is not None
    for r, length in enumerate(view.self_len.tolist()):
        for layer, buffer in enumerate(view.self_kv):
            new = rng.standard_normal((HEADS, DIM)).astype(np.float32)
            buffer[r, :, length] = new
            rows[r][1 + layer] = np.concatenate([rows[r][1 + layer], new[:, None]], axis=1)
        rows[r][0] = length + 1
    slots.stepped(Cache(view.mask, view.self_kv, view.cross_kv, per_sentence=True, self_len=view.self_len + 1))


def _same_live(slots: CacheSlots, rows: list[list], sentences: list[tuple]) -> None:
    view = slots.view()
    assert view.self_len is not None and view.cross_kv is not None
    assert len(view.self_len) == len(rows) and view.sentences == len(sentences)
    for r, (length, *kv) in enumerate(rows):
        assert view.self_len[r] == length
        for buffer, expected in zip(view.self_kv, kv, strict=True):
            np.testing.assert_array_equal(buffer[r, :, :length], expected)
    for s, (mask, *cross) in enumerate(sentences):
        width = len(mask)
        np.testing.assert_array_equal(view.mask[s, :width], mask)
        assert not view.mask[s, width:].any()  # the decoder reads nothing past a sentence's width
        for buffer, expected in zip(view.cross_kv, cross, strict=True):
            np.testing.assert_array_equal(buffer[s, :, :width], expected)
    for a in (*view.self_kv, *view.cross_kv, view.mask):
        assert a.flags.c_contiguous  # ONNX Runtime reads the views in place


def test_joins_steps_reorders_and_departures_keep_every_live_row(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(slots_module, "SHRINK_AFTER", 3)  # shrinks within this test's steps
    rng = np.random.default_rng(0)
    beams = 2
    empty = tuple(np.zeros((0, HEADS, 1, DIM), np.float32) for _ in range(2 * LAYERS))
    slots: CacheSlots | None = None
    rows: list[list] = []  # the reference: per live row [length, *per-layer K/V so far]
    sentences: list[tuple] = []  # per live sentence (mask, *per-layer cross K/V)
    seen = set()
    shared_positions = 0  # positions of moved rows that their places held already, not copied
    for step in range(60):
        if step < 30 or step % 7 == 0:  # grow, then mostly leave
            texts = _texts(rng, int(rng.integers(1, 4)))
            slots = slots or CacheSlots.like(empty, texts[0])
            slots.add(texts, beams, max_positions=200)
            for text in texts:
                assert text.cross_kv is not None
                rows += [[0, *(np.zeros((HEADS, 0, DIM), np.float32) for _ in empty)] for _ in range(beams)]
                sentences.append((text.mask[0], *(a[0] for a in text.cross_kv)))
        assert slots is not None
        _step(slots, rng, rows)
        _same_live(slots, rows, sentences)
        seen.add(slots.capacity)
        # After the step: some sentences leave, the others' beams reorder among themselves.
        n = len(sentences)
        live = np.flatnonzero(rng.random(n) > (0.1 if step < 30 else 0.3))
        picks = rng.integers(0, beams, size=(len(live), beams))
        kept_rows = (live[:, None] * beams + picks).reshape(-1)
        shared = _held(rows, kept_rows)
        slots.keep(kept_rows, live, shared)
        shared_positions += int(shared[kept_rows != np.arange(len(kept_rows))].sum())
        rows = [list(rows[r]) for r in kept_rows]
        sentences = [sentences[s] for s in live]
        _same_live(slots, rows, sentences)
        if not rows:
            break
    capacities = np.array(sorted(seen))
    assert capacities[:, 0].max() > 3 * capacities[:, 0].min()  # the buffers grew ...
    assert capacities[:, 3].max() > 16  # ... in positions too ...
    assert slots is not None and slots.capacity[0] < capacities[:, 0].max()  # ... and shrank as rows left
    assert shared_positions > 50  # reordered beams had common prefixes (copies of one row, stepped since)


def _held(rows: list[list], sources: np.ndarray) -> np.ndarray:
    """Per row kept, how many leading positions of the row at its place equal its source's (what `keep` need not
    copy), from the reference."""
    held = np.zeros(len(sources), np.int64)
    for place, source in enumerate(sources.tolist()):
        if place >= len(rows):
            continue
        (mine, *kv), (theirs, *source_kv) = rows[place], rows[source]
        while held[place] < min(mine, theirs) and all(
            np.array_equal(a[:, held[place]], b[:, held[place]]) for a, b in zip(kv, source_kv, strict=True)
        ):
            held[place] += 1
    return held


def test_the_longest_row_grows_the_positions_by_a_chunk_up_to_its_limit() -> None:
    rng = np.random.default_rng(1)
    empty = tuple(np.zeros((0, HEADS, 1, DIM), np.float32) for _ in range(2 * LAYERS))
    texts = _texts(rng, 1)
    slots = CacheSlots.like(empty, texts[0])
    slots.add(texts, max_positions=60)
    grown = []
    for length in (1, 20, 36):
        slots.lengths[0] = length  # the buffer full
        grown.append(slots.view().self_kv[0].shape[2])
    # A chunk (16) more each time, to a whole block of key positions, and straight to the limit when less than a
    # chunk would be left after.
    assert grown == [20, 36, 60]


def test_a_wider_source_reallocates_the_cross_attention_buffers_only() -> None:
    """A joining text wider than the buffers' source copies the cross-attention K/V and the mask, not the
    self-attention cache (the largest buffers: rows x positions); a row that fills its positions copies the
    self-attention cache, not the cross-attention K/V. The live rows stay what they were either way."""
    rng = np.random.default_rng(2)
    empty = tuple(np.zeros((0, HEADS, 1, DIM), np.float32) for _ in range(2 * LAYERS))
    narrow, wide = sorted(_texts(rng, 2), key=lambda t: t.mask.shape[1])
    assert narrow.mask.shape[1] < wide.mask.shape[1]
    slots = CacheSlots.like(empty, narrow)
    slots.add([narrow, narrow], max_positions=100)  # room for 8 rows and sentences
    rows: list[list] = [[0, *(np.zeros((HEADS, 0, DIM), np.float32) for _ in empty)] for _ in range(2)]
    _step(slots, rng, rows)
    kv, cross = slots.kv, slots.cross
    slots.add([wide], max_positions=100)
    assert slots.kv is kv and slots.cross is not cross  # wider: the cross-attention buffers only
    rows.append([0, *(np.zeros((HEADS, 0, DIM), np.float32) for _ in empty)])
    kv, cross = slots.kv, slots.cross
    for _ in range(20):  # past the first chunk of positions (16)
        _step(slots, rng, rows)
    assert slots.kv is not kv and slots.cross is cross  # longer: the self-attention cache only
    sentences = [(t.mask[0], *(a[0] for a in t.cross_kv or ())) for t in (narrow, narrow, wide)]
    _same_live(slots, rows, sentences)


def test_cache_buffers_are_allocated_in_small_pages_and_numpys_setting_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    """A large cache buffer is allocated with numpy's transparent-huge-page advice off (slow first writes where the
    kernel compacts memory to find huge pages), a small one as numpy allocates; numpy's setting is restored, on or
    off, and the buffer is zeros."""
    multiarray = importlib.import_module("numpy._core.multiarray")
    seen: list[bool] = []
    real = np.zeros

    def zeros(*args: object, **kwargs: object) -> np.ndarray:
        seen.append(bool(multiarray._get_madvise_hugepage()))
        return real(*args, **kwargs)  # type: ignore[call-overload]

    monkeypatch.setattr(np, "zeros", zeros)
    for setting in (True, False):
        previous = multiarray._set_madvise_hugepage(setting)
        try:
            big = buffer_zeros((64, 8, 64, 64), np.float32)  # 8 MB
            small = buffer_zeros((2, 8, 64, 64), np.float32)
            assert multiarray._get_madvise_hugepage() is setting
        finally:
            multiarray._set_madvise_hugepage(previous)
        assert big.shape == (64, 8, 64, 64) and big.dtype == np.float32 and not big.any()
        assert not small.any()
    assert seen == [False, True, False, False]


def test_rows_and_sentences_shrink_only_after_a_while_at_a_quarter_and_an_empty_batch_keeps_its_buffers() -> None:
    """Texts that started together finish together and the next ones join a few steps later: the buffers keep
    their rows and sentences for SHRINK_AFTER steps at a quarter used (no reallocation and copy back up as the
    next ones join), then shrink; a batch whose rows all left keeps its buffers for the next texts."""
    rng = np.random.default_rng(3)
    empty = tuple(np.zeros((0, HEADS, 1, DIM), np.float32) for _ in range(2 * LAYERS))
    texts = _texts(rng, 40)
    slots = CacheSlots.like(empty, texts[0])
    slots.add(texts, max_positions=200)
    full = slots.capacity[:2]
    rows: list[list] = [[0, *(np.zeros((HEADS, 0, DIM), np.float32) for _ in empty)] for _ in range(40)]
    sentences = [(t.mask[0], *(a[0] for a in t.cross_kv or ())) for t in texts]
    slots.keep(np.arange(4), np.arange(4))  # 36 of 40 finish
    rows, sentences = rows[:4], sentences[:4]
    for _ in range(SHRINK_AFTER - 1):
        assert slots.capacity[:2] == full
        _step(slots, rng, rows)
        slots.keep(np.arange(4), np.arange(4))
        _same_live(slots, rows, sentences)
    assert slots.capacity[:2] == (8, 8)  # twice the rows used
    _same_live(slots, rows, sentences)
    grown = CacheSlots.like(empty, texts[0])
    grown.add(texts, max_positions=200)
    before = grown.capacity
    grown.keep(np.zeros(0, np.int64), np.zeros(0, np.int64))
    assert grown.capacity == before and grown.rows == 0
    grown.add(texts[:3], max_positions=200)  # into the buffers kept
    assert grown.capacity == before
    _same_live(
        grown,
        [[0, *(np.zeros((HEADS, 0, DIM), np.float32) for _ in empty)] for _ in range(3)],
        [(t.mask[0], *(a[0] for a in t.cross_kv or ())) for t in texts[:3]],
    )
