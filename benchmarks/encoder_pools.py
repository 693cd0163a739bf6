"""The encoder's cost for texts as the service meets them (arrival order, a pool of waiting requests at a time)
against the offline call's sorted batches, by encoder threads and by what one more call is counted as in padded
tokens when rows are grouped by length (`encoder_groups`).

    python benchmarks/bench.py encoder-pools MODEL_DIR                              # 1 and 2 threads, 16 and 128 tokens
    python benchmarks/bench.py encoder-pools MODEL_DIR --threads 1 --call-tokens 0 8 16 32 64 128 256

In one process, no HTTP: 192 FLORES devtest sentences (generated ones without ../shared/data) encoded through
`encode_texts`, the service's path, in pools of `--pool` texts in FLORES order, and sorted by length in batches of
`--pool`. Rounds interleave every setting; medians are reported. Writes benchmarks/results/encoder-pools-NAME.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import machine
from load import sentences

HERE = Path(__file__).resolve().parent


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(
        prog="bench.py encoder-pools", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("model_dir", type=Path)
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2], help="encoder threads")
    p.add_argument("--call-tokens", type=int, nargs="+", default=[16, 128])
    p.add_argument("--texts", type=int, default=192)
    p.add_argument("--pool", type=int, default=16)
    p.add_argument("--target", default=None)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--name", default=None)
    p.add_argument("--out", type=Path, default=HERE / "results")
    args = p.parse_args(argv)
    from onnxmt import RuntimeOptions, Translator
    from onnxmt.runtime import graphs
    from onnxmt.runtime.running import encode_texts

    texts = sentences(args.texts, "en")
    translators = {t: Translator(args.model_dir, RuntimeOptions(threads=2, encoder_threads=t)) for t in args.threads}
    first = next(iter(translators.values()))
    pad = first.manifest.tokens["pad"]
    target = first.target_token(args.target) and args.target
    arrival = [p.ids for p in first.prepare(texts, target_lang=target)]
    orders = {"arrival": arrival, "sorted": sorted(arrival, key=len)}
    grouping = graphs.encoder_groups

    def seconds(translator: Translator, ids: list[list[int]], call_tokens: int) -> float:
        graphs.encoder_groups = lambda mask, _=0: grouping(mask, call_tokens)  # type: ignore[assignment]
        try:
            started = time.perf_counter()
            for i in range(0, len(ids), args.pool):
                encode_texts(translator.graphs, pad, ids[i : i + args.pool])
            return time.perf_counter() - started
        finally:
            graphs.encoder_groups = grouping

    keys = [(t, c, o) for t in args.threads for c in args.call_tokens for o in orders]
    for t, c, o in keys:  # warm-up
        seconds(translators[t], orders[o], c)
    times: dict[str, list[float]] = {f"{t} thread(s), {c} tokens a call, {o}": [] for t, c, o in keys}
    for _ in range(args.rounds):
        for t, c, o in keys:
            times[f"{t} thread(s), {c} tokens a call, {o}"].append(seconds(translators[t], orders[o], c))
    medians = {k: round(1000 * statistics.median(v), 1) for k, v in times.items()}
    result = {
        "settings": {**vars(args), "model_dir": str(args.model_dir), "out": str(args.out)},
        "ms": {k: [round(1000 * x, 1) for x in v] for k, v in times.items()},
        "medians_ms": medians,
        "load_average_end": os.getloadavg(),
        "machine": machine.describe(),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"encoder-pools-{args.name or args.model_dir.name}.json"
    path.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(f"| encoder threads | tokens a call | {args.texts} texts in arrival-order pools of {args.pool} | sorted |")
    print("| --- | --- | --- | --- |")
    for t in args.threads:
        for c in args.call_tokens:
            row = [medians[f"{t} thread(s), {c} tokens a call, {o}"] for o in orders]
            print(f"| {t} | {c} | {row[0]} ms | {row[1]} ms |")
    print(f"\nwrote {path}")
