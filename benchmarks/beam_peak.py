"""The whole-run peak RSS of bench.py's largest column (beam 4 at batch 32) for several onnxmt directories.

    python benchmarks/beam_peak.py --model nllb-200-distilled-600M DIR [DIR ...] [--ct2 DIR=int8 ...] [--out FILE.json]

Each directory runs in a fresh worker.py process with bench.py's work for that column only: the cold greedy batch
of 8, then the sentences sorted by length in batches of 32 with 4 beams and exactly 30 new tokens, on 2 threads. It
prints peak RSS after the cold batch, at the end (the column's peak), tokens/s, and whether the cold batch's tokens
equal the first directory's (as bench.py compares engines: all but the last, which only some engines force to
eos). Made to compare an export with `--cache-buffer` against the default one. `--ct2 DIR=COMPUTE_TYPE` adds a
CTranslate2 directory (bench.py's converted ones) to the same run, with bench.py's worker for it, so that the peaks
compared come from one run.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import bench
import machine
import models


def run(
    engine: bench.Engine, texts: list[str], order: list[int], family: models.Family, args: argparse.Namespace
) -> dict:
    """bench.py's worker for one engine, with that column's work only; its result."""
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
    entry = bench.run_engine(engine, config, args.timeout)
    if entry["status"] != "ok":
        raise SystemExit(f"{engine.model_dir}: {entry['error']}")
    return entry["result"]


def ct2_engine(value: str) -> bench.Engine:
    """`DIR=COMPUTE_TYPE` (float32, int8, ...): a CTranslate2 directory and the compute type to run it with."""
    path, sep, compute = value.rpartition("=")
    if not sep or not path or not compute:
        raise argparse.ArgumentTypeError(f"expected DIR=COMPUTE_TYPE (e.g. ct2-int8=int8), got {value!r}")
    options = {"compute_type": compute}
    return bench.Engine(f"ct2-{compute}", f"CTranslate2 {compute}", "ctranslate2", Path(path), options=options)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("dirs", nargs="+", type=Path, help="onnxmt model directories (the first is the reference)")
    p.add_argument(
        "--ct2",
        type=ct2_engine,
        action="append",
        default=[],
        metavar="DIR=COMPUTE_TYPE",
        help="a CTranslate2 directory to run after the onnxmt ones, with its compute type",
    )
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
    onnxmt = [bench.Engine(d.name, str(d), "onnxmt", d) for d in args.dirs]
    for engine in [*onnxmt, *args.ct2]:
        directory = engine.model_dir
        result = run(engine, texts, order, family, args)
        reference = rows[0]["result"]["cold_batch_tokens"] if rows else result["cold_batch_tokens"]
        same = bench.same_outputs(reference, result["cold_batch_tokens"], args.tokens) == len(reference)
        rows.append({"dir": str(directory), "engine": engine.kind, "result": result, "same_tokens": same})
        print(
            f"| {directory} | {result['peak_rss_mb']:.0f} MB | {result['peak_rss_end_mb']:.0f} MB "
            f"| {result['throughput'][column]['tokens_per_s']:.1f} | {'yes' if same else 'no'} |",
            flush=True,
        )
    for row in rows:  # what each process held at its end, by mapping (the weights file, the heap, arenas)
        resident = ", ".join(f"{k} {v:,.0f}" for k, v in row["result"].get("resident_end_mb", {}).items())
        print(f"{row['dir']}: resident at the end (MB): {resident}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        info = machine.describe()
        args.out.write_text(
            json.dumps(
                {
                    "machine": info,
                    "args": vars(args)
                    | {
                        "dirs": [str(d) for d in args.dirs],
                        "ct2": [f"{e.model_dir}={e.options['compute_type']}" for e in args.ct2],
                        "data": str(args.data),
                        "out": str(args.out),
                    },
                    "rows": rows,
                },
                indent=1,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
