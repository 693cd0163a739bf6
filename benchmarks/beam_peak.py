"""The whole-run peak RSS of bench.py's largest column (beam 4 at batch 32) for several onnxmt directories.

    python benchmarks/beam_peak.py --model nllb-200-distilled-600M DIR [DIR ...] [--out FILE.json]

Each directory runs in a fresh worker.py process with bench.py's work for that column only: the cold greedy batch
of 8, then the sentences sorted by length in batches of 32 with 4 beams and exactly 30 new tokens, on 2 threads. It
prints peak RSS after the cold batch, at the end (the column's peak), tokens/s, and whether the cold batch's tokens
equal the first directory's. Made to compare an export with `--cache-buffer` against the default one.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import bench
import machine
import models


def run(directory: Path, texts: list[str], order: list[int], family: models.Family, args: argparse.Namespace) -> dict:
    """bench.py's worker for one directory, with that column's work only; its result."""
    config = {
        "texts": texts,
        "order": order,
        "source_lang": family.source_lang,
        "target_lang": family.target_lang,
        "max_new_tokens": args.tokens,
        "threads": args.threads,
        "repeats": 1,
        "beams": [args.beams],
        "batch_sizes": [args.batch_size],
        "latency_texts": 1,
        "cold_batch": bench.COLD_BATCH,
    }
    entry = bench.run_engine(bench.Engine(directory.name, str(directory), "onnxmt", directory), config, args.timeout)
    if entry["status"] != "ok":
        raise SystemExit(f"{directory}: {entry['error']}")
    return entry["result"]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("dirs", nargs="+", type=Path, help="onnxmt model directories (the first is the reference)")
    p.add_argument("--model", choices=sorted(models.MODELS), default="opus-mt-en-zh", help="whose languages to use")
    p.add_argument("--sentences", type=int, default=32, help="FLORES lines (default 32)")
    p.add_argument("--beams", type=int, default=4)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--tokens", type=int, default=30)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--data", type=Path, default=bench.DATA)
    p.add_argument("--timeout", type=float, default=3600, help="seconds per directory")
    p.add_argument("--out", type=Path, help="write the results here as JSON")
    args = p.parse_args(argv)
    family = models.MODELS[args.model][0]
    texts = models.read_lines(args.data / bench.INPUT_FILE, args.sentences)
    lengths = bench.source_lengths(args.dirs[0], texts, family)
    order = sorted(range(len(texts)), key=lambda i: lengths[i])
    column = f"{args.beams}x{args.batch_size}"
    print(
        f"| directory | peak RSS, cold batch | peak RSS, end | beam {args.beams} bs{args.batch_size} tokens/s "
        "| same tokens |"
    )
    print("| --- | --- | --- | --- | --- |")
    rows = []
    for directory in args.dirs:
        result = run(directory, texts, order, family, args)
        same = result["cold_batch_tokens"] == rows[0]["result"]["cold_batch_tokens"] if rows else True
        rows.append({"dir": str(directory), "result": result, "same_tokens": same})
        print(
            f"| {directory} | {result['peak_rss_mb']:.0f} MB | {result['peak_rss_end_mb']:.0f} MB "
            f"| {result['throughput'][column]['tokens_per_s']:.1f} | {'yes' if same else 'no'} |",
            flush=True,
        )
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        info = machine.describe()
        args.out.write_text(
            json.dumps(
                {
                    "machine": info,
                    "args": vars(args)
                    | {"dirs": [str(d) for d in args.dirs], "data": str(args.data), "out": str(args.out)},
                    "rows": rows,
                },
                indent=1,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
