"""`bench.py decoder`: onnxmt beside llama.cpp, onnxruntime-genai, CTranslate2 and transformers on a random
decoder-only model with the real architecture (HY-MT1.5-1.8B, Qwen3-1.7B, TranslateGemma-4B).

    python benchmarks/bench.py decoder --model hy-mt1.5-1.8b --rounds 3 --llama-cpp LLAMA_CPP_DIR
    python benchmarks/bench.py decoder --model qwen3-1.7b --layers 4 --rounds 1   # a smoke run
    python benchmarks/bench.py decoder --model translategemma-4b --rounds 0       # build only
    python benchmarks/bench.py decoder --model qwen3-1.7b --merge R1/qwen3-1.7b.json R2/qwen3-1.7b.json --out OUT

Every row runs in a fresh process (decoder_worker.py) per round, rounds interleaved (A B C, A B C, ...); each
figure is the median of the rounds'; `--merge` pools the rounds of several such runs (one round each keeps every
measuring run short on a shared machine). The served column starts `onnxmt serve` or `llama-server --parallel 8` and
sends the same prompts from 8 concurrent clients (decoder_serve.py). The floor: the bytes a batch-1 step reads
(the weights of the row's bit width, from onnxmt's graphs: every layer and the head; the embedding is a gather of
one row) over the memory bandwidth measured in the same run (floor.py, machine.bandwidth). See benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import decoder_models as dm
import floor
import machine
import models
import worker

HERE = Path(__file__).resolve().parent
DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
INPUT_FILE = "flores200/devtest.eng_Latn"
PROMPT_LENGTHS = (100, 500)
BATCH = 8


def prompt_ids(model_dir: Path, texts: list[str], source: str, target: str) -> dict[str, Any]:
    """The prompts every engine is given: the model's chat template around FLORES text, tokenized by onnxmt, cut
    to exactly 100 and 500 tokens (the template's head and tail kept, the text's middle dropped); 8 prompts of
    100 tokens from 8 other texts for the batch column."""
    from onnxmt.runtime.decoder_only import Prompts
    from onnxmt.runtime.modeldir import load_manifest

    prompts = Prompts(model_dir, load_manifest(model_dir, verify=False))
    a, b = prompts.ids("aaaa", source, target), prompts.ids("bbbb zz", source, target)
    tail = next(k for k in range(1, len(a)) if a[-k - 1] != b[-k - 1])  # the template's ids after the text

    def cut(text: str, length: int) -> list[int]:
        ids = prompts.ids(text, source, target)
        while len(ids) < length:
            text += " " + text
            ids = prompts.ids(text, source, target)
        return ids[: length - tail] + ids[-tail:]

    joined = " ".join(texts)
    out: dict[str, Any] = {str(n): cut(joined, n) for n in PROMPT_LENGTHS}
    out["batch"] = [cut(" ".join(texts[i * 4 :]), 100) for i in range(1, BATCH + 1)]
    # The served column's requests: whole sentences, as a client sends them.
    out["served_texts"] = texts[40:56]
    out["served_ids"] = [prompts.ids(t, source, target) for t in out["served_texts"]]
    return out


def eos_ids(hf: Path) -> list[int]:
    generation = json.loads((hf / "generation_config.json").read_text(encoding="utf-8"))
    eos = generation.get("eos_token_id")
    return eos if isinstance(eos, list) else [eos]


def run_row(variant: dm.Variant, tools: dm.Tools, config: dict[str, Any], timeout: float) -> dict[str, Any]:
    path = variant.path
    files = [path] if path.is_file() else [f for f in path.rglob("*") if f.is_file() and not f.name.startswith(".")]
    entry: dict[str, Any] = {
        "name": variant.name,
        "label": variant.label,
        "bits": variant.bits,
        "path": str(path),
        "disk_bytes": sum(f.stat().st_size for f in files),
        "status": "ok",
    }
    python = dm.python_of(variant, tools)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    if variant.kind == "onnxmt":
        env["PYTHONPATH"] = str(HERE.parent / "src")
    threads = str(config["threads"])
    env |= {"OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads, "TOKENIZERS_PARALLELISM": "false"}
    env |= {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error"}
    cfg = {**config, **variant.options, "engine": variant.kind, "path": str(path)}
    return {**entry, **worker.launch(HERE / "decoder_worker.py", python, cfg, env, timeout)}


MEDIAN_KEYS = ("cold_start_s", "load_s", "peak_rss_mb", "rss_mb", "first_token_ms", "decode_ms_per_token")
MEDIAN_KEYS += ("batch8_tokens_per_s", "peak_rss_end_mb")


def merge_rounds(entries: list[dict[str, Any]]) -> dict[str, Any]:
    """One row from its rounds: every figure the median of the rounds'; the rounds' own under "rounds"."""
    failed = [e for e in entries if e["status"] != "ok"]
    if failed:
        return failed[0]
    results = [e["result"] for e in entries]
    merged = dict(results[0])
    for key in MEDIAN_KEYS:
        merged[key] = statistics.median(r[key] for r in results)
    merged["prefill_tokens_per_s"] = {
        k: statistics.median(r["prefill_tokens_per_s"][k] for r in results) for k in results[0]["prefill_tokens_per_s"]
    }
    merged["rounds"] = [{k: r[k] for k in (*MEDIAN_KEYS, "prefill_tokens_per_s")} for r in results]
    return {**entries[0], "result": merged}


def pool_rounds(entries: list[dict[str, Any]]) -> dict[str, Any]:
    """One row from the same row of several runs (`--merge`): their rounds pooled, every figure the median of all
    of them; the served column's rounds likewise."""
    failed = [e for e in entries if e["status"] != "ok"]
    if failed:
        return failed[0]
    rounds = [r for e in entries for r in e["result"]["rounds"]]
    merged = dict(entries[0]["result"])
    for key in MEDIAN_KEYS:
        merged[key] = statistics.median(r[key] for r in rounds)
    merged["prefill_tokens_per_s"] = {
        k: statistics.median(r["prefill_tokens_per_s"][k] for r in rounds) for k in rounds[0]["prefill_tokens_per_s"]
    }
    merged["rounds"] = rounds
    row = {**entries[0], "result": merged}
    served = [r for e in entries if "served" in e for r in e["served"]["rounds"]]
    if served:
        import decoder_serve

        row["served"] = decoder_serve.merge(served)
    return row


def merge_results(results: list[dict[str, Any]]) -> dict[str, Any]:
    """One result from runs of the same model (each a `--rounds N` run of its own, e.g. one round each, so that no
    single measuring run holds the machine long): rows pooled by name in the first run's order, bandwidth samples
    and load averages pooled, floors recomputed at the pooled bandwidth, agreement recomputed. A row with fewer
    rounds than the others says so in its label."""
    first = results[0]
    by_name: dict[str, list[dict[str, Any]]] = {}
    for result in results:
        for entry in result["engines"]:
            by_name.setdefault(entry["name"], []).append(entry)
    rows = [pool_rounds(entries) for entries in by_name.values()]
    most = max(len(r["result"]["rounds"]) for r in rows if r.get("result"))
    for row in rows:
        n = len(row["result"]["rounds"]) if row.get("result") else most
        if n < most:
            row["label"] += f" ({n} of {most} rounds)"
    agreement(rows, "transformers" if "transformers" in by_name else "onnxmt-fp32")
    samples = [s for r in results for s in r["bandwidth"]["samples"]]
    bw = statistics.median(samples)
    floors = {k: f for r in reversed(results) for k, f in r["floors"].items()}
    machine_info = {
        **first["machine"],
        "load_average_during": [la for r in results for la in r["machine"]["load_average_during"]],
        "load_average_end": results[-1]["machine"]["load_average_end"],
    }
    return {
        **first,
        "settings": {**first["settings"], "rounds": most, "merged_runs": len(results)},
        "machine": machine_info,
        "bandwidth": {"bytes_per_s": bw, "samples": samples},
        "floors": {k: {**f, "floor_ms": f["read_per_step"] / bw * 1000} for k, f in floors.items()},
        "builds": {k: v for r in results for k, v in r["builds"].items()},
        "engines": rows,
        "skipped": {k: v for r in results for k, v in r["skipped"].items() if k not in by_name},
    }


def agreement(rows: list[dict[str, Any]], reference: str) -> None:
    """Each row's greedy tokens against the reference row's (fp32): how many of the 9 outputs (the 100-token
    prompt's and the batch's 8) are equal, and the mean length of their common prefix."""
    ref = next((r for r in rows if r["name"] == reference and r.get("result")), None)
    if ref is None:
        return
    expected = [ref["result"]["tokens"]["100"], *ref["result"]["tokens"]["batch"]]
    for row in rows:
        if not row.get("result"):
            continue
        got = [row["result"]["tokens"]["100"], *row["result"]["tokens"]["batch"]]
        pairs = list(zip(expected, got, strict=True))
        prefixes = [next((i for i, (a, b) in enumerate(zip(x, y, strict=True)) if a != b), len(x)) for x, y in pairs]
        row["agreement"] = {
            "reference": reference,
            "same": sum(x == y for x, y in pairs),
            "outputs": len(expected),
            "mean_common_prefix": statistics.mean(prefixes),
        }


def floors(variants: list[dm.Variant], bandwidth: float) -> dict[str, Any]:
    """ms/token at batch 1 per bit width: onnxmt's graph of that width's step bytes / bandwidth (bytes/s)."""
    out: dict[str, Any] = {}
    for v in variants:
        if v.kind != "onnxmt":
            continue
        key = str(v.bits)
        if key in out and v.bits == 4 and "b32" not in v.name:
            continue  # int4: the block-32 graph's bytes, as the other engines' int4 (ortgenai block 32, Q4_0)
        out[key] = floor.floor(v.name, v.path, bandwidth)
    return out


def build_records(variants: list[dm.Variant]) -> dict[str, Any]:
    records = {}
    for v in variants:
        for directory in (v.path, v.path.parent / "onnxmt-fp32"):
            f = directory / dm.BUILD_FILE
            if v.kind == "onnxmt" and f.is_file():
                records[directory.name] = json.loads(f.read_text(encoding="utf-8"))
    return records


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="bench.py decoder", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--model", choices=sorted(dm.DECODER_MODELS), required=True, help="whose architecture")
    p.add_argument("--quick", action="store_true", help="the family's tiny test model, 4 tokens, 1 repeat")
    p.add_argument("--layers", type=int, help="the architecture with fewer layers: a smoke run of the harness")
    p.add_argument("--tokens", type=int, help="new tokens forced per prompt (default 32; quick 4)")
    p.add_argument("--threads", type=int, default=2, help="threads for every engine (default 2)")
    p.add_argument("--repeats", type=int, help="runs per figure (default 3; quick 1)")
    p.add_argument("--rounds", type=int, default=1, help="every row this many times, interleaved; 0: build only")
    p.add_argument("--engines", help="comma-separated row names to run (default: all available)")
    p.add_argument("--int4", default="32:4,32:0", help="onnxmt int4 rows, BLOCK:ACCURACY_LEVEL pairs")
    p.add_argument(
        "--bench-python",
        type=Path,
        default=Path("/work/bench-venv/bin/python"),
        help="the other engines' venv's interpreter (llama-cpp-python, onnxruntime-genai, CTranslate2, torch)",
    )
    p.add_argument(
        "--llama-cpp", type=Path, help="llama.cpp source tree, its build/bin holding llama-quantize, -server"
    )
    p.add_argument("--decoder-cache", type=Path, default=Path("/work/bench-models"), help="where the models go")
    p.add_argument("--served", action=argparse.BooleanOptionalAction, default=True, help="the served column")
    p.add_argument("--clients", type=int, default=8, help="concurrent clients of the served column")
    p.add_argument("--serve-requests", type=int, default=2, help="requests each client sends")
    p.add_argument("--out", type=Path, default=HERE / "results", help="where <model>.json/.md go")
    p.add_argument("--data", type=Path, default=DATA, help="the shared data folder (flores200/)")
    p.add_argument("--timeout", type=float, default=3600, help="seconds per row's process")
    p.add_argument(
        "--merge",
        type=Path,
        nargs="+",
        metavar="JSON",
        help="measure nothing: pool these runs' results (<model>.json of runs of this command) into one under --out",
    )
    args = p.parse_args(argv)
    args.tokens = args.tokens or (4 if args.quick else 32)
    args.repeats = args.repeats or (1 if args.quick else 3)
    return args


def main(argv: list[str] | None = None) -> int:
    import decoder_serve
    import report

    args = parse_args(argv)
    log = lambda message: print(message, file=sys.stderr, flush=True)  # noqa: E731
    if args.merge:
        merged = merge_results([json.loads(f.read_text(encoding="utf-8")) for f in args.merge])
        report.write_decoder(merged, args.out / merged["mode"])
        return 0

    info = machine.describe()
    if info["load_average"][0] > 2.5:
        log(f"warning: load average {info['load_average'][0]:.2f} before the run; figures will be noisy")
    model = dm.DECODER_MODELS[args.model]
    if args.quick:
        model = dm.quick(model)
    elif args.layers:
        model = dm.smaller(model, args.layers)
    tools = dm.Tools(args.bench_python if args.bench_python.is_file() else None, args.llama_cpp)
    int4 = [tuple(int(x) for x in pair.split(":")) for pair in args.int4.split(",")]
    wanted = set(args.engines.split(",")) if args.engines else None
    variants, skipped = dm.prepare(args.decoder_cache, model, tools, int4, wanted, log)  # type: ignore[arg-type]
    os.sync()
    if args.rounds == 0:  # --rounds 0: build the models only
        log(f"built: {', '.join(v.name for v in variants)}; skipped: {skipped}")
        return 0
    hf = args.decoder_cache / model.name / "hf"
    texts = models.read_lines(args.data / INPUT_FILE, 200)
    reference_dir = next((v.path for v in variants if v.kind == "onnxmt"), None)
    if reference_dir is None:
        log("error: no onnxmt row to take the prompts from")
        return 2
    prompts = prompt_ids(reference_dir, texts, model.source_lang, model.target_lang)
    config = {
        "prompts": prompts,
        "max_new_tokens": args.tokens,
        "threads": args.threads,
        "repeats": args.repeats,
        "eos_ids": eos_ids(hf),
        "source_lang": model.source_lang,
        "target_lang": model.target_lang,
    }
    log(f"measuring memory bandwidth ({args.threads} threads)")
    bandwidth = [machine.bandwidth(args.threads)]
    rounds: dict[str, list[dict[str, Any]]] = {v.name: [] for v in variants}
    served: dict[str, list[dict[str, Any]]] = {}
    loads = [os.getloadavg()]
    for r in range(args.rounds):
        for v in variants:
            if rounds[v.name] and rounds[v.name][-1]["status"] != "ok":
                continue
            log(f"running {v.label} (round {r + 1} of {args.rounds})")
            started = time.monotonic()
            entry = run_row(v, tools, config, args.timeout)
            loads.append(os.getloadavg())
            log(f"  {entry['status']} in {time.monotonic() - started:.0f} s" + (
                f": {entry.get('error', '')[-800:]}" if entry["status"] != "ok" else ""))  # fmt: skip
            rounds[v.name].append(entry)
        if args.served:
            for v in variants:
                if decoder_serve.serves(v):
                    log(f"serving {v.label} to {args.clients} clients (round {r + 1})")
                    figure = decoder_serve.measure(v, tools, prompts, model, args, log)
                    served.setdefault(v.name, []).append(figure)
                    loads.append(os.getloadavg())
        bandwidth.append(machine.bandwidth(args.threads))
    rows = [merge_rounds(rounds[v.name]) for v in variants]
    for row in rows:
        if row["name"] in served:
            row["served"] = decoder_serve.merge(served[row["name"]])
    agreement(rows, "transformers" if any(v.name == "transformers" for v in variants) else "onnxmt-fp32")
    bw = statistics.median(bandwidth)
    result = {
        "mode": "quick" if args.quick else model.name,
        "kind": "decoder-only",
        "settings": {
            "model_name": model.name,
            "model": {k: v for k, v in model.spec.__dict__.items()},
            "prompt_lengths": list(PROMPT_LENGTHS),
            "batch": BATCH,
            "max_new_tokens": args.tokens,
            "threads": args.threads,
            "repeats": args.repeats,
            "rounds": args.rounds,
            "clients": args.clients if args.served else None,
            "serve_requests": args.serve_requests if args.served else None,
            "source_lang": model.source_lang,
            "target_lang": model.target_lang,
            "eos_ids": config["eos_ids"],
        },
        "machine": {**info, "load_average_during": loads, "load_average_end": os.getloadavg()},
        "bandwidth": {"bytes_per_s": bw, "samples": bandwidth},
        "floors": floors(variants, bw),
        "builds": build_records(variants),
        "engines": rows,
        "skipped": skipped,
        "bench_versions": {p: dm.bench_version(tools, p) for p in ("llama_cpp_python", "onnxruntime-genai",
                                                                   "ctranslate2", "torch", "transformers")},
    }  # fmt: skip
    report.write_decoder(result, args.out / result["mode"])
    failed = [r["name"] for r in rows if r["status"] != "ok"]
    if failed:
        log(f"failed: {', '.join(failed)}")
        return 1
    return 0
