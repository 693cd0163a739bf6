"""Does a sentence's translation depend on what it is batched with? Batch 1 against sorted and random batches.

    python benchmarks/bench.py int8-batch            # opus-mt-en-zh architecture (random weights), ~15 min on 2 cores
    python benchmarks/bench.py int8-batch --quick    # tiny model, a few sentences: checks the script still works

Dynamic int8 (`DynamicQuantizeLinear`, `DynamicQuantizeMatMul`, `MatMulIntegerToFloat`) quantizes each activation
tensor with one scale and zero point computed over the whole tensor: every row of the batch, padding included. A
sentence's activations are then rounded on a grid its batch-mates chose, and its output can change with them.

Every model directory translates the same sentences (FLORES devtest and Tatoeba, English to `>>cmn_Hans<<`) with
decoding forced to exactly `--tokens` new tokens (`min_new_tokens = max_new_tokens`: a random model's EOS comes at
random, a fixed length makes every output as long and every comparison cover the same steps), greedy and beam 4:

- alone: each sentence in its own call (batch 1), the reference;
- sorted bsN: all sentences in one `Translator.translate(texts, batch_size=N)` call, which sorts them by length
  and cuts batches of N (what a library user gets);
- random bsN: the sentences shuffled (fixed seed) into groups of N, each group one `translate` call (what the
  service's micro-batcher does with N concurrent one-text requests: it passes their texts to one call);
- same-length bs8: only sentences that share their token count with others, in batches of equal length (no
  padding), to see whether avoiding padding is enough.

Reported per condition: the sentences whose tokens differ from alone; the first step where they differ; for greedy,
the logit margin at that step in the batch-1 logits (the batch-1 token's logit minus the batched token's,
teacher-forced on the shared prefix) against the median top-1/top-2 margin of all batch-1 steps; and for every
model the first decoder step's logits of each sentence alone and in its sorted batch (bit-identical rows, max
difference), which is where padding and batch-mates enter. Writes results/<--name>/int8_batch.{md,json}.

The models: onnxmt fp32 (`onnxmt export`, the control), onnxmt int8 (`onnxmt quantize`), onnxmt int8 with per-row
activation scales (`onnxmt quantize --per-row-scales`), Optimum fp32 (`optimum-cli export onnx`'s three files) and
Optimum int8 (those files through Optimum's `ORTQuantizer` with `AutoQuantizationConfig.avx512_vnni(is_static=False,
per_channel=False)`, the dynamic config its documentation uses), each run by onnxmt's Translator.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

import machine
import models
from onnxmt.runtime.options import RuntimeOptions
from onnxmt.runtime.translator import Translator, pad_batch

HERE = Path(__file__).resolve().parent
DATA = HERE.parents[1] / "shared" / "data"
SOURCES = ("flores200/devtest.eng_Latn", "tatoeba/test-v2021-08-07.eng")
TOKENIZER_CORPUS = ("tatoeba/test-v2021-08-07.eng", "flores200/devtest.eng_Latn")  # as bench.py trains it
SEED = 0

OPTIMUM_QUANTIZE = r"""
import shutil, sys
from pathlib import Path
from optimum.onnxruntime import ORTQuantizer
from optimum.onnxruntime.configuration import AutoQuantizationConfig

source, out = Path(sys.argv[1]), Path(sys.argv[2])
config = AutoQuantizationConfig.avx512_vnni(is_static=False, per_channel=False)
for name in ("encoder_model.onnx", "decoder_model.onnx", "decoder_with_past_model.onnx"):
    ORTQuantizer.from_pretrained(source, file_name=name).quantize(config, out, file_suffix="")
for path in source.iterdir():
    if path.suffix != ".onnx" and not path.name.startswith(".") and not (out / path.name).exists():
        shutil.copy2(path, out / path.name)
"""


@dataclass
class Comparison:
    """One condition against batch 1, for one model and search."""

    model: str
    search: str
    condition: str
    sentences: int
    differing: int
    first_steps: list[int] = field(default_factory=list)  # first differing step of each differing sentence
    margins: list[float] = field(default_factory=list)  # greedy: batch-1 logit margin at that step
    seconds: float = 0.0


def read_sentences(data: Path, per_source: int) -> list[str]:
    """`per_source` lines from each source, evenly spaced through the file (Tatoeba's file is sorted)."""
    texts = []
    for name in SOURCES:
        lines = models.read_lines(data / name)
        stride = max(1, len(lines) // per_source)
        texts += lines[::stride][:per_source]
    return texts


def artifacts(args: argparse.Namespace, log: Callable[[str], None]) -> dict[str, Path]:
    """Model directories by label, built or taken from the benchmark cache (not looked at when --models names
    only --extra directories)."""
    extras = {label: Path(path) for label, _, path in (e.partition("=") for e in args.extra)}
    if args.models and all(m.strip() in extras for m in args.models.split(",")):
        return {m.strip(): extras[m.strip()] for m in args.models.split(",")}
    corpus = [line for name in TOKENIZER_CORPUS for line in models.read_lines(args.data / name)]
    spec = models.QUICK if args.quick else models.FULL
    optimum = not args.models or "Optimum" in args.models
    art = models.prepare(
        args.cache,
        models.MARIAN,
        spec,
        corpus,
        skip_ct2="not used here",
        skip_optimum=None if optimum else "not requested",
        create_optimum_venv=not args.quick,  # creating it takes minutes; --quick uses it only if it exists
        log=log,
    )
    found = {"onnxmt fp32": art.onnxmt_fp32}
    if art.onnxmt_int8:
        found["onnxmt int8"] = art.onnxmt_int8
    root = art.onnxmt_fp32.parent
    key = json.loads((art.onnxmt_fp32 / models.KEY_FILE).read_text())
    rows = _optional(
        lambda: models.cached(
            root / "onnxmt-int8-rows",
            {**key, "options": "--per-row-scales"},
            lambda out: models.quantize_onnxmt(art.onnxmt_fp32, out, "--per-row-scales"),
            log,
        ),
        "onnxmt int8 per-row",
        log,
    )
    if rows:
        found["onnxmt int8 per-row"] = rows
    if art.optimum_fp32 and art.optimum_python:
        found["Optimum fp32"] = art.optimum_fp32
        fp32_key = json.loads((art.optimum_fp32 / models.KEY_FILE).read_text())
        python = art.optimum_python
        int8 = _optional(
            lambda: models.cached(
                root / "optimum-int8",
                {**fp32_key, "quantize": OPTIMUM_QUANTIZE},
                lambda out: _run([str(python), "-c", OPTIMUM_QUANTIZE, str(art.optimum_fp32), str(out)]),
                log,
            ),
            "Optimum int8",
            log,
        )
        if int8:
            found["Optimum int8"] = int8
    found.update(extras)
    wanted = [m.strip() for m in args.models.split(",")] if args.models else list(found)
    missing = [m for m in wanted if m not in found]
    if missing:
        raise SystemExit(f"not available: {', '.join(missing)}; available: {', '.join(found)}")
    return {m: found[m] for m in wanted}


def _optional(build: Callable[[], Path], name: str, log: Callable[[str], None]) -> Path | None:
    try:
        return build()
    except Exception as e:  # a converter that fails drops its row and says why; it does not stop the run
        log(f"{name}: not built: {str(e)[-1500:]}")
        return None


def _run(command: list[str]) -> None:
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(result.stdout[-1000:] + result.stderr[-2000:])


def first_difference(a: Sequence[int], b: Sequence[int]) -> int | None:
    for step in range(max(len(a), len(b))):
        if step >= len(a) or step >= len(b) or a[step] != b[step]:
            return step
    return None


def step_logits(translator: Translator, ids: list[int], prefix: Sequence[int]) -> np.ndarray:
    """(len(prefix) + 1, vocab) batch-1 logits after the decoder start token and each token of `prefix`."""
    source = np.array([ids], dtype=np.int64)
    cache = translator.graphs.encode(source, np.ones_like(source))
    rows = []
    for token in [int(translator.manifest.tokens["decoder_start"]), *prefix]:
        logits, cache = translator.graphs.step(np.array([[token]], dtype=np.int64), cache)
        rows.append(logits[0])
    return np.stack(rows)


def top_margins(logits: np.ndarray) -> list[float]:
    """Per row, the top-1 logit minus the top-2 one: how far each greedy step was from a tie."""
    top = np.sort(logits, axis=1)[:, -2:]
    return (top[:, 1] - top[:, 0]).tolist()


def groups(order: list[int], size: int) -> list[list[int]]:
    return [order[i : i + size] for i in range(0, len(order), size)]


def equal_length_groups(lengths: list[int], size: int) -> list[list[int]]:
    """Batches of sentences of the same token count (only counts shared by two sentences or more)."""
    by_length: dict[int, list[int]] = {}
    for i, n in enumerate(lengths):
        by_length.setdefault(n, []).append(i)
    return [g for members in by_length.values() if len(members) > 1 for g in groups(members, size) if len(g) > 1]


def translate_groups(translator: Translator, texts: list[str], batches: list[list[int]], options: dict) -> dict:
    out: dict[int, list[int]] = {}
    for batch in batches:
        results = translator.translate([texts[i] for i in batch], batch_size=len(batch), **options)
        out.update({i: r.token_ids for i, r in zip(batch, results, strict=True)})
    return out


def conditions(args: argparse.Namespace, n: int, lengths: list[int]) -> dict[str, list[list[int]] | int]:
    """Condition name -> batches of sentence indices, or a batch size for one sorted `translate` call."""
    rng = random.Random(SEED)
    found: dict[str, list[list[int]] | int] = {f"sorted bs{b}": b for b in args.batch_sizes}
    for size in args.mix_sizes:
        order = list(range(n))
        rng.shuffle(order)
        found[f"random bs{size}"] = groups(order, size)
    found["same-length bs8"] = equal_length_groups(lengths, 8)
    return found


def compare_model(
    label: str, directory: Path, texts: list[str], args: argparse.Namespace, log: Callable[[str], None]
) -> tuple[list[Comparison], dict[str, Any]]:
    translator = Translator(directory, RuntimeOptions(threads=args.threads))
    token = translator.target_token("cmn_Hans")
    encoded = [translator.tokenizer.encode(t, target_token=token) for t in texts]
    lengths = [len(ids) for ids in encoded]
    forced = {"min_new_tokens": args.tokens, "max_new_tokens": args.tokens, "target_lang": "cmn_Hans"}
    translator.translate(texts[:2], beams=1, **forced)  # warm-up
    comparisons = []
    context: dict[str, Any] = {"source lengths": lengths}
    for beams in args.beams:
        search = "greedy" if beams == 1 else f"beam {beams}"
        options = {**forced, "beams": beams}
        started = time.perf_counter()
        alone = [translator.translate([t], batch_size=1, **options)[0].token_ids for t in texts]
        context[f"{search} alone seconds"] = time.perf_counter() - started
        context[f"{search} alone tokens"] = alone
        if beams == 1:
            sample = range(min(len(texts), args.margin_sentences))
            margins = [m for i in sample for m in top_margins(step_logits(translator, encoded[i], alone[i][:-1]))]
            context["greedy top-1/top-2 margin median"] = statistics.median(margins)
        for name, plan in conditions(args, len(texts), lengths).items():
            started = time.perf_counter()
            if isinstance(plan, int):
                results = translator.translate(texts, batch_size=plan, **options)
                batched = {i: r.token_ids for i, r in enumerate(results)}
            else:
                batched = translate_groups(translator, texts, plan, options)
            c = Comparison(label, search, name, len(batched), 0, seconds=time.perf_counter() - started)
            for i, tokens in batched.items():
                step = first_difference(alone[i], tokens)
                if step is None:
                    continue
                c.differing += 1
                c.first_steps.append(step)
                if beams == 1 and step < len(tokens) and step < len(alone[i]):
                    row = step_logits(translator, encoded[i], alone[i][:step])[-1]
                    c.margins.append(float(row[alone[i][step]] - row[tokens[step]]))
            log(f"{label}, {search}, {name}: {c.differing}/{c.sentences} differ")
            comparisons.append(c)
    context["first step logits"] = first_step_logits(translator, encoded, args.batch_sizes)
    return comparisons, context


def first_step_logits(translator: Translator, encoded: list[list[int]], sizes: list[int]) -> dict[str, Any]:
    """The first decoder step's logits of every sentence alone and in its sorted batch: bit-identical rows and the
    largest difference."""
    start = int(translator.manifest.tokens["decoder_start"])
    pad = int(translator.manifest.tokens["pad"])

    def logits(batch: list[list[int]]) -> np.ndarray:
        ids, mask = pad_batch(batch, pad)
        cache = translator.graphs.encode(ids, mask)
        out, _ = translator.graphs.step(np.full((len(batch), 1), start, dtype=np.int64), cache)
        return np.asarray(out)

    alone = [logits([ids])[0] for ids in encoded]
    order = sorted(range(len(encoded)), key=lambda i: len(encoded[i]))
    found = {}
    for size in sizes:
        identical, largest = 0, 0.0
        for batch in groups(order, size):
            rows = logits([encoded[i] for i in batch])
            for i, row in zip(batch, rows, strict=True):
                identical += bool(np.array_equal(row, alone[i]))
                largest = max(largest, float(np.abs(row - alone[i]).max()))
        found[f"sorted bs{size}"] = {"identical_rows": identical, "rows": len(encoded), "max_abs_diff": largest}
    return found


def describe_steps(steps: list[int]) -> str:
    if not steps:
        return ""
    return f"{statistics.median(steps):g} ({min(steps)}–{max(steps)})"


def describe_margins(margins: list[float]) -> str:
    if not margins:
        return ""
    return f"{statistics.median(margins):.3g} (max {max(margins):.3g})"


def markdown(comparisons: list[Comparison], contexts: dict[str, dict[str, Any]], settings: dict, info: dict) -> str:
    lines = [
        "| model | search | condition | sentences differing from batch 1 | first differing step, median (range) "
        "| greedy: batch-1 logit margin there, median (max) |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for c in comparisons:
        share = f"{c.differing}/{c.sentences} ({c.differing / c.sentences:.1%})" if c.sentences else "none"
        lines.append(
            f"| {c.model} | {c.search} | {c.condition} | {share} | {describe_steps(c.first_steps)} "
            f"| {describe_margins(c.margins)} |"
        )
    lines += [
        "",
        "| model | first-step logits, sorted batch vs alone | median top-1/top-2 margin of batch-1 greedy steps |",
        "| --- | --- | --- |",
    ]
    for model, context in contexts.items():
        cells = [
            f"{k}: {v['identical_rows']}/{v['rows']} rows bit-identical, max diff {v['max_abs_diff']:.3g}"
            for k, v in context["first step logits"].items()
        ]
        lines.append(f"| {model} | {'; '.join(cells)} | {context['greedy top-1/top-2 margin median']:.3g} |")
    reference = contexts.get("onnxmt fp32")
    if reference:
        lines += [
            "",
            "| model | search | batch-1 outputs equal to onnxmt fp32's batch-1 outputs |",
            "| --- | --- | --- |",
        ]
        for model, context in contexts.items():
            for key, outputs in context.items():
                if key.endswith(" alone tokens") and model != "onnxmt fp32":
                    same = sum(a == b for a, b in zip(outputs, reference[key], strict=True))
                    lines.append(f"| {model} | {key.removesuffix(' alone tokens')} | {same}/{len(outputs)} |")
    lengths = settings["source_tokens"]
    lines += [
        "",
        f"{settings['sentences']} sentences ({', '.join(settings['sources'])}; {lengths['min']}–{lengths['max']} "
        f"source tokens, median {lengths['median']:g}), random weights with {settings['architecture']}'s "
        f"architecture, exactly {settings['tokens']} new tokens per sentence (min_new_tokens = max_new_tokens), "
        f"{settings['threads']} threads. Steps count from 0. Margins are logits of the batch-1 run, teacher-forced "
        f"on the prefix both outputs share. Machine: {info['cpu']}, {info['cores']} cores, SIMD "
        f"{' '.join(info['simd'])}; load average {info['load_average'][0]:.2f} at start; onnxruntime "
        f"{info['versions'].get('onnxruntime')}; commit {info['git_commit']}{' (dirty)' if info['git_dirty'] else ''}.",
    ]
    return "\n".join(lines) + "\n"


def measure_speed(
    dirs: dict[str, Path], texts: list[str], args: argparse.Namespace, log: Callable[[str], None]
) -> dict:
    """Generated tokens/s of each model under three batching regimes, models taking turns regime by regime for
    --rounds rounds (the best round kept: background load only slows a run down)."""
    translators = {label: Translator(path, RuntimeOptions(threads=args.threads)) for label, path in dirs.items()}
    first = next(iter(translators.values()))
    token = first.target_token("cmn_Hans")
    lengths = [len(first.tokenizer.encode(t, target_token=token)) for t in texts]
    order = list(range(len(texts)))
    random.Random(SEED).shuffle(order)
    regimes = {
        "each request alone (bs1)": [[i] for i in range(len(texts))],
        f"random groups of {args.service_batch} (service micro-batches)": groups(order, args.service_batch),
        f"sorted bs{args.batch_sizes[-1]} (Translator)": groups(
            sorted(order, key=lengths.__getitem__), args.batch_sizes[-1]
        ),
    }
    forced = {"min_new_tokens": args.tokens, "max_new_tokens": args.tokens, "target_lang": "cmn_Hans"}
    for translator in translators.values():
        translator.translate(texts[:2], beams=1, **forced)  # warm-up
    best: dict[tuple[str, str, str], tuple[float, float]] = {}
    for round_ in range(args.rounds):
        for beams in args.beams:
            search = "greedy" if beams == 1 else f"beam {beams}"
            for regime, batches in regimes.items():
                for label, translator in translators.items():
                    started, cpu = time.perf_counter(), time.process_time()
                    translate_groups(translator, texts, batches, {**forced, "beams": beams})
                    tokens = len(texts) * args.tokens
                    rate = tokens / (time.perf_counter() - started)
                    cpu_ms = 1000 * (time.process_time() - cpu) / tokens
                    key = (label, search, regime)
                    old = best.get(key, (0.0, float("inf")))
                    best[key] = (max(old[0], rate), min(old[1], cpu_ms))
                    log(f"round {round_ + 1}, {label}, {search}, {regime}: {rate:.0f} tokens/s, {cpu_ms:.2f} CPU ms")
    rows = [
        {"model": k[0], "search": k[1], "regime": k[2], "tokens_per_s": v[0], "cpu_ms_per_token": v[1]}
        for k, v in best.items()
    ]
    return {"regimes": list(regimes), "rows": rows}


def speed_markdown(result: dict, settings: dict, info: dict) -> str:
    rows = result["rows"]
    models = list(dict.fromkeys(r["model"] for r in rows))
    searches = list(dict.fromkeys(r["search"] for r in rows))
    rate = {(r["model"], r["search"], r["regime"]): r["tokens_per_s"] for r in rows}
    cpu = {(r["model"], r["search"], r["regime"]): r["cpu_ms_per_token"] for r in rows}
    lines = [
        "| model | search | " + " | ".join(result["regimes"]) + " |",
        "| --- | --- |" + " --- |" * len(result["regimes"]),
    ]
    base = models[0]
    for search in searches:
        for model in models:
            cells = []
            for regime in result["regimes"]:
                value, ms = rate[model, search, regime], cpu[model, search, regime]
                ratio = "" if model == base else f" ({value / rate[base, search, regime]:.2f}×)"
                cpu_ratio = "" if model == base else f" ({ms / cpu[base, search, regime]:.2f}×)"
                cells.append(f"{value:.0f}{ratio}; {ms:.2f} ms{cpu_ratio}")
            lines.append(f"| {model} | {search} | " + " | ".join(cells) + " |")
    lines += [
        "",
        f"Generated tokens/s (exactly {settings['tokens']} per sentence; beam search counts the returned tokens); "
        "CPU ms per generated token (the process's CPU time, all threads: less sensitive to other load than the "
        f"wall clock); each the best of {settings['rounds']} interleaved rounds over {settings['sentences']} "
        "sentences; (×): against "
        f"{base} in the same regime. {settings['threads']} threads. Machine: {info['cpu']}, {info['cores']} cores, "
        f"SIMD {' '.join(info['simd'])}; load average {info['load_average'][0]:.2f} at start; onnxruntime "
        f"{info['versions'].get('onnxruntime')}.",
    ]
    return "\n".join(lines) + "\n"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="bench.py int8-batch", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--quick", action="store_true", help="tiny model, 4 sentences per source, 5 tokens")
    p.add_argument("--sentences", type=int, help="sentences from each source (default 48; quick 4)")
    p.add_argument("--tokens", type=int, help="forced new tokens (default 30; quick 5)")
    p.add_argument("--beams", default="1,4")
    p.add_argument("--batch-sizes", default="8,32", help="sorted batches (default 8,32)")
    p.add_argument("--mix-sizes", default="8,16", help="random groups (default 8,16; the service batches 16)")
    p.add_argument("--margin-sentences", type=int, default=16, help="batch-1 outputs the median margin reads")
    p.add_argument("--models", help="comma-separated labels (default: all available)")
    p.add_argument("--extra", action="append", default=[], help="LABEL=DIR: one more model directory")
    p.add_argument("--speed", action="store_true", help="measure throughput per batching regime instead")
    p.add_argument("--rounds", type=int, default=2, help="--speed: interleaved rounds (best kept)")
    p.add_argument("--service-batch", type=int, default=16, help="--speed: random group size (the service's)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--name", help="results/<name>/ (default int8-batch; quick: int8-batch-quick)")
    p.add_argument("--cache", type=Path, default=HERE / ".cache")
    p.add_argument("--data", type=Path, default=DATA)
    p.add_argument("--out", type=Path, default=HERE / "results", help="results go to OUT/<name>/")
    args = p.parse_args(argv)
    args.sentences = args.sentences or (4 if args.quick else 48)
    args.tokens = args.tokens or (5 if args.quick else 30)
    args.beams = [int(b) for b in args.beams.split(",")]
    args.batch_sizes = [int(b) for b in args.batch_sizes.split(",")]
    args.mix_sizes = [int(b) for b in args.mix_sizes.split(",")]
    args.name = args.name or ("int8-batch-quick" if args.quick else "int8-batch")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    log = lambda message: print(message, file=sys.stderr, flush=True)  # noqa: E731
    info = machine.describe()
    texts = read_sentences(args.data, args.sentences)
    dirs = artifacts(args, log)
    if args.speed:
        return speed(dirs, texts, args, info, log)
    comparisons: list[Comparison] = []
    contexts: dict[str, dict[str, Any]] = {}
    for label, directory in dirs.items():
        found, contexts[label] = compare_model(label, directory, texts, args, log)
        comparisons += found
    lengths = contexts[next(iter(contexts))].pop("source lengths")
    for context in contexts.values():
        context.pop("source lengths", None)
    settings = {
        "sentences": len(texts),
        "sources": [f"{args.sentences} of {name}" for name in SOURCES],
        "source_tokens": {"min": min(lengths), "median": statistics.median(lengths), "max": max(lengths)},
        "architecture": "a tiny test model" if args.quick else "opus-mt-en-zh",
        "tokens": args.tokens,
        "threads": args.threads,
        "beams": args.beams,
        "batch_sizes": args.batch_sizes,
        "mix_sizes": args.mix_sizes,
        "seed": SEED,
        "models": {label: str(path) for label, path in dirs.items()},
    }
    text = markdown(comparisons, contexts, settings, info)
    print(text)
    out = args.out / args.name
    out.mkdir(parents=True, exist_ok=True)
    (out / "int8_batch.md").write_text(text, encoding="utf-8")
    data = {
        "settings": settings,
        "machine": info,
        "comparisons": [asdict(c) for c in comparisons],
        "models": contexts,
    }
    (out / "int8_batch.json").write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    log(f"wrote {out}/int8_batch.md and .json")
    return 0


def speed(dirs: dict[str, Path], texts: list[str], args: argparse.Namespace, info: dict, log: Callable) -> int:
    result = measure_speed(dirs, texts, args, log)
    settings = {
        "sentences": len(texts),
        "tokens": args.tokens,
        "threads": args.threads,
        "rounds": args.rounds,
        "models": {label: str(path) for label, path in dirs.items()},
    }
    text = speed_markdown(result, settings, info)
    print(text)
    out = args.out / args.name
    out.mkdir(parents=True, exist_ok=True)
    (out / "int8_speed.md").write_text(text, encoding="utf-8")
    data = {"settings": settings, "machine": info, **result}
    (out / "int8_speed.json").write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    log(f"wrote {out}/int8_speed.md and .json")
    return 0
