"""Long inputs offline: sorted fixed batches against one running batch refilled as texts finish.

    python benchmarks/bench.py refill MODEL_DIR --target zh                 # greedy and beam 4, 3 interleaved rounds

`Translator.generate` (and so `translate`, `translate_iter`) decodes in fixed batches of `--batch-size` texts
sorted by source length: a batch runs until its longest text is done, its finished rows dropped, so it shrinks as
it goes. With `refill=True` it runs one batch (runtime/running.py) that admits the next texts, shortest first, as
others finish, so it stays full. Which is faster depends on how much output lengths vary within a batch, so two
workloads are timed:

- **uniform**: every text forced to `--tokens` new tokens (`min_new_tokens` = `max_new_tokens`): nothing to
  refill, what the running batch's bookkeeping costs;
- **varied**: the model's end token made likely enough (a bias added to its logit in a copy of the decoder graph,
  calibrated so that greedy search ends half the texts within `--mean-tokens` tokens) that texts end at varied
  lengths, as a trained model's do, under `max_new_tokens` = 3 x `--mean-tokens` (and `min_new_tokens` 4).

Tokens/s count generated tokens; rounds interleave the two ways; medians. Also reports whether both ways gave the
same tokens (they do wherever a text's translation does not depend on its batch: fp32, per-row int8).
Writes benchmarks/results/refill-NAME.json.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

import machine
from load import sentences
from onnxmt import DecodeOptions, RuntimeOptions, Translator

HERE = Path(__file__).resolve().parent
# The varied workload's shortest output: the random model's first step is much like every text's, so a bias that
# ends some texts there ends most of them there (a trained model's outputs are rarely that short).
SHORTEST = 4


def end_gaps(translator: Translator, texts: list[str], target: str | None, steps: int) -> np.ndarray:
    """For each row and step of a greedy decoding: how far the end token's logit is below the best other one."""
    gaps: list[np.ndarray] = []
    eos = translator.manifest.tokens["eos"]
    graphs = translator.graphs
    step = graphs.step

    def recording(tokens: np.ndarray, cache: Any) -> Any:
        logits, new = step(tokens, cache)
        others = logits.copy()
        others[:, eos] = -np.inf
        gaps.append(others.max(axis=1) - logits[:, eos])
        return logits, new

    graphs.step = recording  # type: ignore[method-assign]
    try:
        translator.translate(
            texts, target_lang=target, beams=1, max_new_tokens=steps, min_new_tokens=steps, batch_size=len(texts)
        )
    finally:
        graphs.step = step  # type: ignore[method-assign]
    return np.stack(gaps)  # (steps, rows): every row runs all steps (min_new_tokens)


def end_bias(gaps: np.ndarray, median: int, shortest: int) -> float:
    """The bias that ends half the texts within `median` tokens under greedy search, none before `shortest`
    (min_new_tokens): the bias only moves the end token's logit, so a text decodes as without it until the first
    step whose gap is below the bias (exact for greedy; beam search ends its texts at other, similar lengths)."""

    def lengths(bias: float) -> np.ndarray:
        hit = gaps < bias
        hit[: shortest - 1] = False
        return np.where(hit.any(axis=0), hit.argmax(axis=0) + 1, len(gaps))

    low, high = float(gaps.min()), float(gaps.max()) + 1
    for _ in range(60):
        middle = (low + high) / 2
        low, high = (middle, high) if np.median(lengths(middle)) > median else (low, middle)
    return high


def with_end_bias(model_dir: Path, out: Path, bias: float) -> Path:
    """A copy of `model_dir` whose decoder adds `bias` to the end token's logit (other files hard-linked: a model
    directory refuses symlinks that leave it)."""
    manifest = json.loads((model_dir / "onnxmt.json").read_text())
    decoder_spec = manifest["graphs"]["decoder"]
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    for item in model_dir.iterdir():
        if item.name not in (decoder_spec["file"], "onnxmt.json"):
            try:
                os.link(item, out / item.name)
            except OSError:
                shutil.copy2(item, out / item.name)
    graph_model = onnx.load(model_dir / decoder_spec["file"], load_external_data=False)
    logits = next(o for o in graph_model.graph.output if o.name == _output(decoder_spec, "logits"))
    vocab = int(manifest["model"]["vocab_size"])
    values = np.zeros(vocab, dtype=np.float32)
    values[manifest["tokens"]["eos"]] = bias
    for node in graph_model.graph.node:
        node.output[:] = [name + "_unbiased" if name == logits.name else name for name in node.output]
    graph_model.graph.initializer.append(numpy_helper.from_array(values, "end_bias"))
    graph_model.graph.node.append(helper.make_node("Add", [logits.name + "_unbiased", "end_bias"], [logits.name]))
    path = out / decoder_spec["file"]
    onnx.save(graph_model, path)
    data = path.read_bytes()
    manifest["files"][decoder_spec["file"]] = {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
    (out / "onnxmt.json").write_text(json.dumps(manifest, indent=2))
    return out


def _output(spec: dict[str, Any], role: str) -> str:
    return next(o["name"] for o in spec["outputs"] if o.get("role", o["name"]) == role)


def timed(translator: Translator, texts: list[str], refill: bool, **decoding: Any) -> tuple[float, list[list[int]]]:
    prepared = translator.prepare(texts, **decoding)
    started = time.perf_counter()
    outputs: dict[int, list[int]] = {}
    for event in translator.generate(prepared, refill=refill):
        if event.translation is not None:
            outputs[event.index] = list(event.translation.token_ids)
    seconds = time.perf_counter() - started
    return seconds, [outputs[i] for i in range(len(texts))]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(
        prog="bench.py refill", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("model_dir", type=Path)
    p.add_argument("--texts", type=int, default=256)
    p.add_argument("--tokens", type=int, default=32, help="new tokens per text, uniform workload")
    p.add_argument("--mean-tokens", type=int, default=20, help="median new tokens per text, varied workload")
    p.add_argument("--beams", type=int, nargs="+", default=[1, 4])
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--target", default=None)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--name", default=None)
    p.add_argument("--out", type=Path, default=HERE / "results")
    args = p.parse_args(argv)
    runtime = RuntimeOptions(threads=args.threads)
    batching = DecodeOptions(batch_size=args.batch_size)
    texts = sentences(args.texts, "en")
    plain = Translator(args.model_dir, runtime, batching)
    gaps = end_gaps(plain, texts[:64], args.target, 3 * args.mean_tokens)
    bias = end_bias(gaps, args.mean_tokens, SHORTEST)
    biased_dir = with_end_bias(args.model_dir, HERE / ".cache" / f"{args.model_dir.name}-end-bias", bias)
    biased = Translator(biased_dir, runtime, batching)
    workloads = {
        "uniform": (plain, {"max_new_tokens": args.tokens, "min_new_tokens": args.tokens}),
        "varied": (biased, {"max_new_tokens": 3 * args.mean_tokens, "min_new_tokens": SHORTEST}),
    }
    rows = []
    load = os.getloadavg()[0]
    for beams in args.beams:
        for name, (translator, decoding) in workloads.items():
            decoding = {**decoding, "beams": beams, "target_lang": args.target}
            seconds: dict[bool, list[float]] = {False: [], True: []}
            outputs: dict[bool, list[list[int]]] = {}
            timed(translator, texts[:8], False, **decoding)  # warm-up
            for _ in range(args.rounds):
                for refill in (False, True):
                    took, outputs[refill] = timed(translator, texts, refill, **decoding)
                    seconds[refill].append(took)
            tokens = sum(len(o) for o in outputs[False])
            lengths = [len(o) for o in outputs[False]]
            row = {
                "beams": beams,
                "workload": name,
                "generated_tokens": tokens,
                "output_tokens_p10_p50_p90": [int(np.percentile(lengths, q)) for q in (10, 50, 90)],
                "fixed_tokens_per_s": round(tokens / statistics.median(seconds[False]), 1),
                "refill_tokens_per_s": round(sum(len(o) for o in outputs[True]) / statistics.median(seconds[True]), 1),
                "same_tokens": sum(a == b for a, b in zip(outputs[False], outputs[True], strict=True)),
                "seconds": {"fixed": seconds[False], "refill": seconds[True]},
            }
            row["refill_vs_fixed"] = round(row["refill_tokens_per_s"] / row["fixed_tokens_per_s"], 2)
            rows.append(row)
            print(row, file=sys.stderr)
    result = {
        "model_dir": str(args.model_dir),
        "settings": {**vars(args), "model_dir": str(args.model_dir), "out": str(args.out)},
        "end_bias": bias,
        "rows": rows,
        "load_average": [round(load, 2), round(os.getloadavg()[0], 2)],
        "machine": machine.describe(),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"refill-{args.name or args.model_dir.name}.json"
    path.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print("| beams | workload | output tokens p10/p50/p90 | fixed tok/s | refilled tok/s | ratio | same tokens |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(
            f"| {r['beams']} | {r['workload']} | {'/'.join(map(str, r['output_tokens_p10_p50_p90']))} | "
            f"{r['fixed_tokens_per_s']} | {r['refill_tokens_per_s']} | {r['refill_vs_fixed']}x | "
            f"{r['same_tokens']}/{len(texts)} |"
        )
    print(f"wrote {path}")
