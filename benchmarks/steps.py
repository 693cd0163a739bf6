"""Decoder step and encoder time of several model directories, interleaved in one process: what did a graph
change buy?

    python benchmarks/steps.py DIR [DIR ...] [--rows 1,8,128] [--past 15] [--steps 40]

For each number of rows, each directory's Translator encodes that many FLORES devtest sentences (one row each),
runs `--past` decoder steps to fill the self-attention cache, then times `--steps` more calls of the decoder on
that same cache, and as many calls of the encoder on those sentences, the directories taking turns call by call,
so the machine's drift hits them alike. Prints Markdown tables of the median (and minimum) milliseconds per call.
Unlike ab.py, which compares code on the same model, this compares models (say, one exported before and one after
a change to the exporter) under the same code. A buffered export's cache holds 1, then 4 + 16k positions
(`cache.next_capacity`): with --past at such a size, every timed call would grow it (15, the default, leaves spare
positions).
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable
from functools import partial
from pathlib import Path

import numpy as np

from onnxmt.runtime.cache import Cache
from onnxmt.runtime.options import RuntimeOptions
from onnxmt.runtime.translator import Translator, pad_batch
from probes import interleaved

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "flores200" / "devtest.eng_Latn"


def filled_cache(translator: Translator, ids: np.ndarray, mask: np.ndarray, past: int) -> tuple[np.ndarray, Cache]:
    """The start token for each row and the decoder cache after `past` steps."""
    graphs = translator.graphs
    cache = graphs.encode(ids, mask)
    tokens = np.full((len(ids), 1), translator.manifest.tokens["decoder_start"], dtype=np.int64)
    for _ in range(past):
        _, cache = graphs.step(tokens, cache)
    return tokens, cache


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("models", nargs="+", type=Path)
    p.add_argument("--rows", default="1,8,128", help="decoder rows (sentences) per step, comma-separated")
    p.add_argument("--past", type=int, default=15, help="cached positions when timing starts")
    p.add_argument("--steps", type=int, default=40, help="timed steps per directory and row count")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--data", type=Path, default=DATA)
    args = p.parse_args()
    rows_list = [int(r) for r in args.rows.split(",")]
    texts = [line.strip() for line in args.data.read_text(encoding="utf-8").splitlines() if line.strip()]
    translators = [Translator(d, RuntimeOptions(threads=args.threads)) for d in args.models]
    tables: dict[str, list[list[str]]] = {
        "decoder step": [[] for _ in translators],
        "encoder": [[] for _ in translators],
    }
    for rows in rows_list:
        inputs = [
            pad_batch([t.tokenizer.encode(x) for x in texts[:rows]], t.manifest.tokens["pad"]) for t in translators
        ]
        states = [filled_cache(t, ids, mask, args.past) for t, (ids, mask) in zip(translators, inputs, strict=True)]
        calls: dict[tuple[str, int], Callable[[], object]] = {}
        for i, t in enumerate(translators):
            calls["decoder step", i] = partial(t.graphs.step, *states[i])
            calls["encoder", i] = partial(t.graphs.encode, *inputs[i])
        times = interleaved(calls, args.steps)
        for (name, i), ts in times.items():
            tables[name][i].append(f"{1e3 * statistics.median(ts):.2f} ms (min {1e3 * min(ts):.2f})")
    for name, cells in tables.items():
        print(f"\n{name}, per call\n")
        print("| model | " + " | ".join(f"{r} rows" for r in rows_list) + " |")
        print("| --- |" + " --- |" * len(rows_list))
        for model, cell in zip(args.models, cells, strict=True):
            print(f"| {model} | " + " | ".join(cell) + " |")


if __name__ == "__main__":
    main()
