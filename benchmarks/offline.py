"""onnxmt against transformers, Optimum and CTranslate2, each engine in a fresh process with the same work.

    python benchmarks/bench.py             # full run: opus-mt-en-zh architecture, ~30 min on 2 cores
    python benchmarks/bench.py --quick     # tiny model, 2 sentences, seconds: checks the harness still works
    python benchmarks/bench.py --model nllb-200-distilled-600M   # NLLB-200's architecture (eng_Latn -> zho_Hans)
    python benchmarks/bench.py --model nllb-200-1.3B             # NLLB-200-1.3B's (24+24 layers, 5.5 GB in fp32)
    python benchmarks/bench.py --model nllb-200-3.3B --sentences 16 --latency-sentences 6 --tokens 20 \\
        --repeats 1 --rounds 2 --batch-sizes 8   # a 3B model: int8 rows only (onnxmt and CTranslate2), ~1 h

`bench.py offline`, the harness's default command (`bench.py --model X` is `bench.py offline --model X`).
Decoder-only models (HY-MT, Qwen3, TranslateGemma) have their own: `bench.py decoder` (decoder_bench.py).

Builds (once, cached) a random model with the chosen architecture and its conversions, runs every engine
available here through benchmarks/worker.py, prints a Markdown table with ratios to onnxmt and writes
results/<mode>.json, .md and .png. See benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import floor
import machine
import models
import report
import worker

HERE = Path(__file__).resolve().parent
DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
INPUT_FILE = "flores200/devtest.eng_Latn"
TOKENIZER_CORPUS = ("tatoeba/test-v2021-08-07.eng", INPUT_FILE)
COLD_BATCH = 8
# Engines the table must have: a run without them is a broken harness, not a missing optional package.
REQUIRED = ("onnxmt-fp32", "transformers")
REQUIRED_INT8_ONLY = ("onnxmt-int8",)  # a 3B model's table (models.Family.int8_only)


@dataclass(frozen=True)
class Engine:
    name: str
    label: str
    kind: str  # worker.ENGINES key
    model_dir: Path
    python: Path = Path(sys.executable)
    options: dict[str, Any] = field(default_factory=dict)


def engines(art: models.Artifacts, quick: bool = False, int8_only: bool = False) -> list[Engine]:
    """Every engine variant this machine can run, onnxmt first (fp32, or int8 for an int8-only model: the reference
    of the ratios). --quick keeps one Optimum variant: each costs a torch + transformers import, the bulk of a quick
    run."""
    found = [Engine("onnxmt-fp32", "onnxmt fp32", "onnxmt", art.onnxmt_fp32)] if art.onnxmt_fp32 else []
    if art.onnxmt_int8:
        found.append(Engine("onnxmt-int8", "onnxmt int8", "onnxmt", art.onnxmt_int8))
    if art.onnxmt_fp32 and not int8_only:  # 3B models: PyTorch fp32 would take an hour and the memory of both
        found.append(Engine("transformers", "transformers PyTorch fp32", "transformers", art.hf))
    if art.optimum_fp32 and art.optimum_python:
        optimum = ("optimum", art.optimum_fp32, art.optimum_python)
        if not quick:
            found.append(Engine("optimum-fp32-default", "Optimum ORT fp32, default session options", *optimum))
        found.append(Engine("optimum-fp32-nospin", "Optimum ORT fp32, spinning off", *optimum, {"spinning": False}))
    for compute, path in (("float32", art.ct2_float32), ("int8", art.ct2_int8)):
        if path:
            options = {"compute_type": compute}
            found.append(Engine(f"ct2-{compute}", f"CTranslate2 {compute}", "ctranslate2", path, options=options))
    return found


def source_lengths(model_dir: Path, texts: list[str], family: models.Family) -> list[int]:
    """Source tokens of each text as onnxmt feeds them (language tokens included), without loading the graphs."""
    from onnxmt.architectures import scheme_for
    from onnxmt.runtime.modeldir import load_manifest
    from onnxmt.runtime.tokenizer import load_tokenizer

    manifest = load_manifest(model_dir, verify=False)
    tokenizer = load_tokenizer(model_dir, manifest.tokenizer.get("kind"))
    prompt = scheme_for(manifest.languages, tokenizer.token_id).prompt(family.source_lang, family.target_lang)
    return [len(tokenizer.encode(prompt.text + t, prefix=prompt.prefix, suffix=prompt.suffix)) for t in texts]


def _child_env(engine: Engine, threads: int) -> dict[str, str]:
    env = dict(os.environ)
    if engine.python != Path(sys.executable):
        # Another venv: our interpreter's settings must not leak into it.
        env = {k: v for k, v in env.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    threads_s = str(threads)
    env |= {
        "OMP_NUM_THREADS": threads_s,
        "MKL_NUM_THREADS": threads_s,
        "TOKENIZERS_PARALLELISM": "false",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_VERBOSITY": "error",
        "TRANSFORMERS_NO_ADVISORY_WARNINGS": "1",
    }
    return env


def run_engine(engine: Engine, config: dict[str, Any], timeout: float) -> dict[str, Any]:
    """worker.py for `engine` in a fresh process; the engine's entry for the result JSON."""
    entry: dict[str, Any] = {
        "name": engine.name,
        "label": engine.label,
        "model_dir": str(engine.model_dir),
        "disk_bytes": sum(
            f.stat().st_size for f in engine.model_dir.iterdir() if f.is_file() and f.name != models.KEY_FILE
        ),
        "status": "ok",
    }
    cfg = {**config, **engine.options, "engine": engine.kind, "model_dir": str(engine.model_dir)}
    env = _child_env(engine, config["threads"])
    return {**entry, **worker.launch(HERE / "worker.py", engine.python, cfg, env, timeout)}


def merge_rounds(entries: list[dict[str, Any]]) -> dict[str, Any]:
    """One engine's entry from its interleaved rounds (`--rounds`): every figure the median of the rounds' (a
    round's own figure is already a median over its repeats); the rounds' figures are kept under "rounds"."""
    failed = [e for e in entries if e["status"] != "ok"]
    if failed:
        return failed[0]
    if len(entries) == 1:
        return entries[0]
    results = [e["result"] for e in entries]
    median = statistics.median
    merged = dict(results[0])  # versions, cold-batch tokens (each round checks them against the count)
    for key in ("cold_start_s", "load_s", "first_batch_s", "peak_rss_mb", "peak_rss_end_mb"):
        merged[key] = median([r[key] for r in results])
    merged["latency"] = {
        beams: {
            "median_ms": median([r["latency"][beams]["median_ms"] for r in results]),
            "p90_ms": median([r["latency"][beams]["p90_ms"] for r in results]),
            "samples": sum(r["latency"][beams]["samples"] for r in results),
        }
        | ({"step_ms": median([r["latency"][beams]["step_ms"] for r in results])} if "step_ms" in first else {})
        for beams, first in results[0]["latency"].items()
    }
    merged["throughput"] = {
        key: {
            "tokens_per_s": median([r["throughput"][key]["tokens_per_s"] for r in results]),
            "runs": [run for r in results for run in r["throughput"][key]["runs"]],
            "texts": value["texts"],
        }
        for key, value in results[0]["throughput"].items()
    }
    merged["rounds"] = [report.flatten(e) for e in entries]
    return {**entries[0], "result": merged}


def floors(selected: list[Engine], bandwidth: float) -> dict[str, Any]:
    """The floor of a greedy batch-1 decoder step (floor.py) of each onnxmt row's own graph, by row name."""
    return {e.name: floor.floor(e.name, e.model_dir, bandwidth) for e in selected if e.kind == "onnxmt"}


def mark_floor_ratios(results: list[dict[str, Any]], floors: dict[str, Any]) -> None:
    """Each row's greedy step over a floor: an onnxmt row's own graph's; another engine's, onnxmt's graph of its
    precision (int8 rows onnxmt int8's, the others onnxmt fp32's)."""
    for entry in results:
        step = entry.get("result", {}).get("latency", {}).get("1", {}).get("step_ms")
        graph = (
            entry["name"] if entry["name"] in floors else "onnxmt-int8" if "int8" in entry["name"] else "onnxmt-fp32"
        )
        if step and graph in floors:
            entry["floor"] = graph
            entry["floor_ratio"] = step / floors[graph]["floor_ms"]


def mark_agreement(results: list[dict[str, Any]], n: int) -> None:
    """How many greedy outputs of the cold batch equal onnxmt fp32's, on the first n - 1 tokens (the n-th is the
    forced eos in transformers-style engines; CTranslate2 has no forced eos). fp32 engines running the same model
    should agree everywhere; int8 ones may not."""
    ref = results[0].get("result", {}).get("cold_batch_tokens")
    for entry in results:
        out = entry.get("result", {}).get("cold_batch_tokens")
        if ref and out:
            entry["agreement"] = [same_outputs(ref, out, n), len(ref)]


def same_outputs(ref: list[list[int]], out: list[list[int]], n: int) -> int:
    """How many of two engines' n-token greedy outputs are equal on their first n - 1 tokens (mark_agreement)."""
    return sum(a[: n - 1] == b[: n - 1] for a, b in zip(ref, out, strict=True))


def _seq2seq_model(name: str) -> str:
    """--model's value: an encoder-decoder architecture; a decoder-only one is `bench.py decoder`'s."""
    if name in models.MODELS:
        return name
    import decoder_models

    if name in decoder_models.DECODER_MODELS:
        raise argparse.ArgumentTypeError(f"{name} is decoder-only: python benchmarks/bench.py decoder --model {name}")
    raise argparse.ArgumentTypeError(f"{name!r}: choose from {', '.join(sorted(models.MODELS))}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="bench.py offline", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--model",
        type=_seq2seq_model,
        metavar="{" + ",".join(sorted(models.MODELS)) + "}",
        default="opus-mt-en-zh",
        help="whose architecture the random model has (default opus-mt-en-zh)",
    )
    p.add_argument("--quick", action="store_true", help="tiny model, 2 sentences, 5 tokens: seconds")
    p.add_argument("--sentences", type=int, help="input lines for throughput (default 64; quick 2)")
    p.add_argument("--latency-sentences", type=int, help="first lines timed one by one (default 20; quick 2)")
    p.add_argument("--tokens", type=int, help="new tokens forced per sentence (default 30; quick 5)")
    p.add_argument("--threads", type=int, default=2, help="intra-op threads for every engine (default 2)")
    p.add_argument("--repeats", type=int, help="passes over the inputs per figure (default 3; quick 1)")
    p.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="run every engine this many times, interleaved (A B C, A B C, ...), each in a fresh process, and report "
        "the median of the rounds: ratios that a machine's changing load skews less (e.g. --rounds 3 --repeats 1)",
    )
    p.add_argument("--beams", default="1,4", help="beam sizes (default 1,4)")
    p.add_argument("--batch-sizes", help="throughput batch sizes (default 8,32; quick 2)")
    p.add_argument("--engines", help="comma-separated engine names to run (default: all available)")
    p.add_argument(
        "--onnxmt",
        action="append",
        default=[],
        metavar="LABEL=DIR",
        help="one more onnxmt engine on another directory of the same model (e.g. exported with other options, "
        "onnxmt-cache-buffer=/path); repeatable, run after the built ones and always selected",
    )
    p.add_argument("--no-optimum", action="store_true", help="skip Optimum (its venv takes minutes to create)")
    p.add_argument(
        "--with-fp32",
        action="store_true",
        help="a 3B model's fp32 rows too (onnxmt and CTranslate2 float32; ~2x its weights more on disk)",
    )
    p.add_argument("--envsize", action=argparse.BooleanOptionalAction, help="measure venv sizes (default: not quick)")
    p.add_argument("--out", type=Path, default=HERE / "results", help="where <mode>.json/.md/.png go")
    p.add_argument("--cache", type=Path, default=Path(os.environ.get("ONNXMT_BENCH_CACHE") or HERE / ".cache"))
    p.add_argument("--data", type=Path, default=DATA, help="the shared data folder (flores200/, tatoeba/)")
    p.add_argument("--timeout", type=float, default=3600, help="seconds per engine process")
    args = p.parse_args(argv)
    extras = []
    for extra in args.onnxmt:
        name, sep, directory = extra.partition("=")
        if not sep or not name or not Path(directory, "onnxmt.json").is_file():
            p.error(f"--onnxmt takes LABEL=DIR, DIR an onnxmt model directory; got {extra!r}")
        extras.append((name, Path(directory)))
    args.onnxmt = extras
    quick = args.quick
    args.sentences = args.sentences or (2 if quick else 64)
    args.latency_sentences = min(args.latency_sentences or (2 if quick else 20), args.sentences)
    args.tokens = args.tokens or (5 if quick else 30)
    args.repeats = args.repeats or (1 if quick else 3)
    if args.rounds < 1 or args.repeats < 1:
        p.error("--rounds and --repeats must be at least 1")
    args.beams = [int(b) for b in args.beams.split(",")]
    args.batch_sizes = [int(b) for b in (args.batch_sizes or ("2" if quick else "8,32")).split(",")]
    args.envsize = not quick if args.envsize is None else args.envsize
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    mode = "quick" if args.quick else "full"
    log = lambda message: print(message, file=sys.stderr, flush=True)  # noqa: E731
    info = machine.describe()
    if info["load_average"][0] > 0.5:
        log(f"warning: load average {info['load_average'][0]:.2f} before the run; figures will be noisy")
    if not (args.data / INPUT_FILE).is_file():
        log(f"error: {args.data / INPUT_FILE} not found; pass --data with the shared data folder")
        return 2
    texts = models.read_lines(args.data / INPUT_FILE, args.sentences)
    corpus = [line for name in TOKENIZER_CORPUS for line in models.read_lines(args.data / name)]
    family, full, quick = models.MODELS[args.model]
    spec = quick if args.quick else full
    art = models.prepare(
        args.cache,
        family,
        spec,
        corpus,
        skip_optimum="--no-optimum" if args.no_optimum else None,
        create_optimum_venv=not args.quick,  # creating it takes minutes; --quick uses it only if it exists
        with_fp32=args.with_fp32,
        log=log,
    )
    # Models just built are still being written back to disk; no engine's cold start should pay for that.
    os.sync()
    reference_dir = art.onnxmt_fp32 or art.onnxmt_int8
    assert reference_dir is not None
    lengths = source_lengths(reference_dir, texts, family)
    settings = {
        "sentences": len(texts),
        "latency_sentences": args.latency_sentences,
        "data_file": INPUT_FILE,
        "source_tokens": {"min": min(lengths), "median": statistics.median(lengths), "max": max(lengths)},
        "max_new_tokens": args.tokens,
        "threads": args.threads,
        "repeats": args.repeats,
        "rounds": args.rounds,
        "beams": args.beams,
        "batch_sizes": args.batch_sizes,
        "cold_batch": min(COLD_BATCH, len(texts)),
        "model": asdict(spec),
        "model_name": args.model,
        "source_lang": family.source_lang,
        "target_lang": family.target_lang,
    }
    config = {
        "texts": texts,
        "order": sorted(range(len(texts)), key=lambda i: lengths[i]),
        "source_lang": family.source_lang,
        "target_lang": family.target_lang,
        "max_new_tokens": args.tokens,
        "threads": args.threads,
        "repeats": args.repeats,
        "beams": args.beams,
        "batch_sizes": args.batch_sizes,
        "latency_texts": args.latency_sentences,
        "cold_batch": COLD_BATCH,
    }
    selected = engines(art, args.quick, family.int8_only)
    if args.engines:
        wanted = set(args.engines.split(","))
        selected = [e for e in selected if e.name in wanted or e is selected[0]]  # the reference always runs
    for name, directory in args.onnxmt:
        selected.append(Engine(name, f"onnxmt {name.removeprefix('onnxmt-')}", "onnxmt", directory))
    settings["reference"] = selected[0].label  # the ratios' denominator
    settings["floor"] = 1 in args.beams and args.tokens > 1
    log(f"measuring memory bandwidth ({args.threads} threads)")
    bandwidth = [machine.bandwidth(args.threads)]
    rounds: dict[str, list[dict[str, Any]]] = {engine.name: [] for engine in selected}
    for r in range(args.rounds):
        for engine in selected:
            if rounds[engine.name] and rounds[engine.name][-1]["status"] != "ok":
                continue  # failed once: not again
            log(f"running {engine.label}" + (f" (round {r + 1} of {args.rounds})" if args.rounds > 1 else ""))
            start = time.monotonic()
            entry = run_engine(engine, config, args.timeout)
            log(
                f"  {entry['status']} in {time.monotonic() - start:.0f} s"
                + (f": {entry.get('error', '')[-500:]}" if entry["status"] != "ok" else "")
            )
            rounds[engine.name].append(entry)
        bandwidth.append(machine.bandwidth(args.threads))
    results = [merge_rounds(rounds[engine.name]) for engine in selected]
    mark_agreement(results, args.tokens)
    bw = statistics.median(bandwidth)
    step_floors = floors(selected, bw)
    mark_floor_ratios(results, step_floors)
    info["load_average_end"] = os.getloadavg()
    result = {"mode": mode, "settings": settings, "machine": info, "engines": results, "skipped": art.skipped}
    result |= {"bandwidth": {"bytes_per_s": bw, "samples": bandwidth}, "floors": step_floors}
    if args.envsize:
        import envsize

        result["env_sizes"] = envsize.measure(args.cache, log)
    write(result, args.out / mode)
    failed = [e["name"] for e in results if e["status"] != "ok"]
    required = REQUIRED_INT8_ONLY if family.int8_only else REQUIRED  # with --with-fp32 too: onnxmt-int8 is there
    missing = [name for name in required if name not in {e["name"] for e in results}]
    if failed or (missing and not args.engines):
        log(f"failed: {', '.join(failed + missing)}")
        return 1
    return 0


def write(result: dict[str, Any], stem: Path) -> None:
    """Print the table; write <stem>.json, .md and .png."""
    stem.parent.mkdir(parents=True, exist_ok=True)
    text = report.table(result) + "\n\n" + report.legend(result) + "\n"
    for name, reason in result["skipped"].items():
        text += f"\nNot measured: {name} ({reason})."
    if result.get("env_sizes"):
        text += "\n" + report.env_table(result["env_sizes"]) + "\n"
    m = result["machine"]
    simd = " ".join(m["simd"])
    text += (
        f"\nMachine: {m['cpu']}, {m['cores']} cores, SIMD {simd}; load average {m['load_average'][0]:.2f} at start.\n"
    )
    print(text)
    stem.with_suffix(".md").write_text(text, encoding="utf-8")
    stem.with_suffix(".json").write_text(json.dumps(result, indent=1), encoding="utf-8")
    try:
        report.chart(result, stem.with_suffix(".png"))
    except ImportError:
        print("no chart: pip install matplotlib (or onnxmt[bench])", file=sys.stderr)
