"""Operations over the vocabulary (log-softmax in place, top-k) as small ONNX graphs on ONNX Runtime's threads."""

from __future__ import annotations

import functools
import math
from pathlib import Path

import numpy as np

from .options import RuntimeOptions
from .sessions import load_session

OPS_DIR = Path(__file__).resolve().parent / "ops"


class VocabOps:
    """log-softmax and per-row top-k over (rows, vocab) matrices on ONNX Runtime's threads (`runtime/ops/`).

    TopK follows the ONNX rule for ties (lower index first), the order the numpy fallbacks in search.py keep.
    Large matrices go through chunk maxima (`topk_chunked.onnx`, the same answer on NaN-free rows, one vectorised
    pass; see export/ops.py) when the vocabulary size has a suitable divisor.
    """

    def __init__(self, options: RuntimeOptions) -> None:
        self._log_softmax = load_session(OPS_DIR / "log_softmax.onnx", options)
        self._topk = load_session(OPS_DIR / "topk.onnx", options)
        self._topk_chunked = load_session(OPS_DIR / "topk_chunked.onnx", options)

    def log_softmax(self, logits: np.ndarray) -> np.ndarray:
        return self._log_softmax.run(None, {"logits": logits})[0]

    def log_softmax_inplace(self, logits: np.ndarray) -> np.ndarray:
        """`logits` overwritten by their log-softmax, and returned: the same kernel as `log_softmax`, bound to read
        and write one buffer. ORT's LogSoftmax reads a row (its maximum, then its sum of exponentials) before it
        writes it, element by element, so the result is the same bits (tested); what it saves is a second
        (rows, vocab) matrix, 131 MB at NLLB's 256k vocabulary and 128 rows, and a third of the time."""
        flags = logits.flags
        if not (logits.dtype == np.float32 and logits.ndim == 2 and flags.c_contiguous and flags.writeable):
            logits[...] = self.log_softmax(logits)
            return logits
        binding = self._log_softmax.io_binding()
        shape = list(logits.shape)
        binding.bind_input("logits", "cpu", 0, np.float32, shape, logits.ctypes.data)
        binding.bind_output("log_probs", "cpu", 0, np.float32, shape, logits.ctypes.data)
        self._log_softmax.run_with_iobinding(binding)
        return logits

    def topk(self, scores: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """The k largest entries of each row and their indices, largest first: ((rows, k), (rows, k))."""
        rows, vocab = scores.shape
        chunk = chunk_length(vocab, k) if rows * vocab >= CHUNKED_TOPK_MIN else None
        feed = {"scores": scores, "k": np.array([k], dtype=np.int64)}
        if chunk is None:
            values, indices = self._topk.run(None, feed)
        else:
            values, indices = self._topk_chunked.run(None, {**feed, "chunk": np.array([chunk], dtype=np.int64)})
        return values, indices


# From one row of a 65k vocabulary up the chunked graph is faster (0.040 vs 0.055 ms; at 128 rows 2.0 vs 4.2 ms);
# tiny vocabularies (tests' models) keep the plain TopK.
CHUNKED_TOPK_MIN = 1 << 15
# Chunk length aimed for (a divisor of the vocabulary near it): 141 was fastest for opus-mt at 1 to 128 rows.
TARGET_CHUNK = 141


@functools.lru_cache(maxsize=64)
def chunk_length(vocab: int, k: int) -> int | None:
    """The chunk length for `topk_chunked.onnx`: the divisor of `vocab` nearest to TARGET_CHUNK that leaves at least
    4k chunks and is at least 16 long, or None (the plain TopK) if there is none."""
    divisors = [d for d in range(16, vocab // (4 * k) + 1) if vocab % d == 0]
    return min(divisors, key=lambda d: abs(math.log(d / TARGET_CHUNK)), default=None)
