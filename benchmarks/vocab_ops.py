"""The vocabulary ops beam search runs at every step, timed side by side: log-softmax, the plain TopK and the
chunked TopK (`runtime/ops/topk_chunked.onnx`) at several chunk lengths.

    python benchmarks/vocab_ops.py [--vocab 65001] [--out results/vocab_ops.md]

Rows of log-probabilities over opus-mt's 65001 entries, k = 8 (beam search keeps 2 x 4 candidates per row), 2
threads, spinning off. Prints the median milliseconds per call and checks that every variant returns the plain
TopK's indices.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

import numpy as np

from onnxmt.runtime.options import RuntimeOptions
from onnxmt.runtime.sessions import load_session
from onnxmt.runtime.vocab import OPS_DIR
from probes import emit, interleaved

CHUNKS = (47, 141, 461, 1383)  # divisors of 65001


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--vocab", type=int, default=65001)
    p.add_argument("--out", type=Path, help="also write the table here")
    args = p.parse_args()
    options = RuntimeOptions(threads=2)
    log_softmax, plain, chunked = (
        load_session(OPS_DIR / name, options) for name in ("log_softmax.onnx", "topk.onnx", "topk_chunked.onnx")
    )
    chunks = [c for c in CHUNKS if args.vocab % c == 0]
    k = np.array([8], dtype=np.int64)
    lines = [
        f"Milliseconds per call (median), rows of {args.vocab} log-probabilities, k = 8, 2 threads.",
        "",
        "| rows | log-softmax | TopK | " + " | ".join(f"chunked, {c}" for c in chunks) + " |",
        "| --- | --- | --- |" + " --- |" * len(chunks),
    ]
    rng = np.random.default_rng(0)
    for rows in (1, 4, 8, 32, 128):
        logits = (3 * rng.standard_normal((rows, args.vocab))).astype(np.float32)
        scores = log_softmax.run(None, {"logits": logits})[0]
        calls = {
            "log-softmax": lambda logits=logits: log_softmax.run(None, {"logits": logits}),
            "TopK": lambda scores=scores: plain.run(None, {"scores": scores, "k": k}),
        }
        for c in chunks:
            feed = {"scores": scores, "k": k, "chunk": np.array([c], dtype=np.int64)}
            calls[f"chunked {c}"] = lambda feed=feed: chunked.run(None, feed)
        expected = calls["TopK"]()[1]
        for name, call in calls.items():
            if name.startswith("chunked"):
                assert np.array_equal(call()[1], expected), name
        times = interleaved(calls, 40 if rows == 128 else 200)
        lines.append(f"| {rows} | " + " | ".join(f"{1e3 * statistics.median(t):.3f}" for t in times.values()) + " |")
    emit(lines, args.out)


if __name__ == "__main__":
    main()
