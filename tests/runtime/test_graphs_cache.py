"""The decoder cache's row operations: what beam search relies on between steps."""

from __future__ import annotations

import numpy as np
import pytest

from onnxmt.runtime.cache import Cache


def _cache(rows: int, past: int = 3) -> Cache:
    rng = np.random.default_rng(rows)
    kv = tuple(rng.normal(size=(rows, 2, past, 4)).astype(np.float32) for _ in range(4))
    return Cache(mask=np.ones((rows // 2, 5), np.int64), self_kv=kv, cross_kv=None, per_sentence=True)


@pytest.mark.parametrize(
    "rows",
    [
        [0, 1, 2, 3],  # nothing moves
        [1, 0, 3, 2],  # swaps: a cycle in place
        [0, 0, 2, 2],  # a beam duplicated over another
        [3, 3, 0, 1],  # chains across the copy
    ],
)
def test_reorder_beams_gives_row_i_the_old_row_rows_i(rows: list[int]) -> None:
    cache = _cache(4)
    expected = [a[rows].copy() for a in cache.self_kv]
    reordered = cache.reorder_beams(np.array(rows))
    for got, want in zip(reordered.self_kv, expected, strict=True):
        np.testing.assert_array_equal(got, want)
    assert reordered.mask is cache.mask  # shared per sentence: never copied


def test_reorder_beams_copies_read_only_arrays() -> None:
    cache = _cache(4)
    for a in cache.self_kv:
        a.flags.writeable = False
    before = [a.copy() for a in cache.self_kv]
    reordered = cache.reorder_beams(np.array([1, 1, 2, 3]))
    for original, kept, got in zip(cache.self_kv, before, reordered.self_kv, strict=True):
        np.testing.assert_array_equal(original, kept)
        np.testing.assert_array_equal(got, kept[[1, 1, 2, 3]])
