"""Peak resident memory of each step that takes a large model from its checkpoint to a served directory: export,
quantize (int8, per-row int8, int4) and validate, against the bytes of its fp32 weights; and the service's memory
at rest with the int4 directory loaded, against its files on disk.

    python benchmarks/bench.py big-models --model nllb-200-3.3B
    python benchmarks/bench.py big-models --model nllb-200-distilled-600M --steps export,int8,validate
    python benchmarks/bench.py big-models --model qwen3-1.7b --steps export,int8,int4,validate,serve
    python benchmarks/bench.py big-models --model qwen3-1.7b --steps serve --work DIR --name qwen3-1.7b-serve
    (steps: export, int8, int8-rows, int4, validate, export-int8 = `export --quantize int8`, serve)

The decoder-only models (hy-mt1.5-1.8b, qwen3-1.7b, translategemma-4b) are decoder_models.py's, their sources
shared with `bench.py decoder --model NAME` (in --decoder-cache). `serve`: `onnxmt serve` on the int4 directory
(the int4 step's, in --work), its RSS "at rest": idle after a short text, a 500-token prompt and a batch of 8 (the
service gives back what requests let go once idle: runtime.sessions.release_memory), against the bytes of the
directory's files; once ready and right after the requests too. `--steps serve` alone builds nothing and removes
nothing.

The model is a random one with the real architecture (benchmarks/models.py's specs, built once into
benchmarks/.cache/). Each step runs `onnxmt` in a fresh child process; its peak RSS is the kernel's (wait4's
ru_maxrss: the child's VmHWM, file-backed pages it mapped included; this script itself stays small, as Linux
carries a parent's peak over to its children). Steps run one after another, never beside other work. Every
peak is divided by the fp32 weight bytes, except validate's: it is divided by the larger of its two sides, each
measured alone first (validate_sides.py: PyTorch's side, then ONNX Runtime's). Results go to
benchmarks/results/big-models/<model or --name>.{md,json}.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

import decoder_models
import decoder_serve
import models
from load import free_port, rss_mb
from machine import describe as describe_machine
from onnxmt.testing import (
    MADLAD_400_3B,
    NLLB_200_1_3B,
    NLLB_200_3_3B,
    NLLB_200_DISTILLED_600M,
    build_random_model,
)

REPO = Path(__file__).resolve().parents[1]
CACHE = REPO / "benchmarks" / ".cache"
RESULTS = REPO / "benchmarks" / "results" / "big-models"
MODELS = {
    "nllb-200-distilled-600M": NLLB_200_DISTILLED_600M,
    "nllb-200-1.3B": NLLB_200_1_3B,
    "nllb-200-3.3B": NLLB_200_3_3B,
    "madlad400-3b-mt": MADLAD_400_3B,
}
DECODER_ONLY = {
    m.name: m for m in (decoder_models.HY_MT_1_8B, decoder_models.QWEN3_1_7B, decoder_models.TRANSLATEGEMMA_4B)
}
# Step -> the targets of "Big models on a 24 GB machine", as a multiple of the fp32 weight bytes (validate: of its
# larger side, each side's peak measured alone by validate_sides.py).
# serve: of the int4 directory's files.
TARGETS = {
    "export": 1.25,
    "int8": 0.5,
    "int8-rows": 0.5,
    "int4": 0.5,
    "validate": 1.1,
    "export-int8": 1.25,
    "serve": 1.2,
}
STEPS = tuple(TARGETS)
TARGETS_LANG = {"madlad400-3b-mt": ["--target-lang", "zh"], "nllb-200-3.3B": ["--target-lang", "zho_Hans"]}
TARGETS_LANG["nllb-200-1.3B"] = TARGETS_LANG["nllb-200-distilled-600M"] = TARGETS_LANG["nllb-200-3.3B"]
for _m in DECODER_ONLY.values():
    TARGETS_LANG[_m.name] = ["--source-lang", _m.source_lang, "--target-lang", _m.target_lang]
VALIDATE_TEXTS = [
    "The river is long and the mountain is high.",
    "Where is the doctor?",
    "Tom is reading a letter to his family in the garden.",
    "We should go home before the evening.",
]


@dataclass
class Step:
    name: str
    seconds: float
    peak_mb: float
    ratio: float
    target: float
    # What the ratio divides by: the fp32 weights, or for validate its larger side (the sides' peaks in MB).
    basis: str = "fp32 weights"
    sides_mb: dict[str, float] | None = None


def run(command: list[str]) -> tuple[float, float]:
    """Run `command` as a child; its wall seconds and peak RSS in MB."""
    start = time.perf_counter()
    child = subprocess.Popen(command)
    _, status, usage = os.wait4(child.pid, 0)
    seconds = time.perf_counter() - start
    code = os.waitstatus_to_exitcode(status)
    if code != 0:
        raise SystemExit(f"{' '.join(command)} exited with {code}")
    return seconds, usage.ru_maxrss / 1024


def validate_sides(validate_args: list[str], state: Path) -> dict[str, float]:
    """The peak RSS in MB of each side of `onnxmt validate VALIDATE_ARGS`, each alone in a fresh process: PyTorch's
    (load, generate, teacher-forced logits) and ONNX Runtime's (load, translate, logits, report)."""
    script = [sys.executable, str(Path(__file__).with_name("bench.py")), "validate-sides"]
    sides = {}
    for side in ("reference", "onnx"):
        print(f"== validate, {side} side alone", flush=True)
        seconds, peak = run([*script, side, str(state), "--", *validate_args])
        print(f"   {seconds:.0f} s, peak {peak:.0f} MB", flush=True)
        sides[side] = round(peak)
    shutil.rmtree(state, ignore_errors=True)
    return sides


def build(model: str, directory: str) -> None:
    build_random_model(Path(directory), MODELS[model])


def source_model(model: str, decoder_cache: Path) -> Path:
    """The model's random checkpoint, built once (in a child: Linux carries a parent's peak RSS over to the
    children it forks, ru_maxrss, and the build holds the whole model)."""
    if model in DECODER_ONLY:
        decoder = DECODER_ONLY[model]
        key = decoder_models.hf_key(decoder)
        out = decoder_cache / model / "hf"  # bench.py --model's source
        build = decoder_models.build_hf
        return models.cached(out, key, lambda o: models.in_child(build, o, decoder.spec, decoder.dtype), print)
    source = CACHE / f"{model}-random" / "hf"  # the source bench.py's int8 rows of the same model use
    if not (source / "config.json").is_file():
        key = models.source_key(MODELS[model], None)
        models.cached(source, key, lambda out: models.in_child(build, model, str(out)), print)
    return source


# The serve step's requests, one after another: a short text, a prompt of about LONG_PROMPT tokens, a batch; then
# REST seconds with none (past serve/batcher.py's IDLE_SECONDS, when the service gives back what they let go).
LONG_PROMPT = 500
BATCH = [f"Sentence number {i} is about the weather in the mountains and the rivers." for i in range(8)]
REST = 5.0


def long_text(model_dir: Path, tokens: int) -> str:
    """Sentences that the directory's tokenizer makes at least `tokens` tokens of."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    sentence = "The committee met in the old town hall to discuss the river, the bridges and the new school."
    text = sentence
    while len(tokenizer.encode(text, add_special_tokens=False).ids) < tokens:
        text += " " + sentence
    return text


def served(model_dir: Path, translate: dict[str, str]) -> dict[str, float]:
    """`onnxmt serve MODEL_DIR` in a child: seconds to ready, and its RSS in MB once ready, right after the
    requests (a short text, a prompt of LONG_PROMPT tokens, a batch of 8; `translate`: their language fields, 32
    new tokens at most) and at rest (REST seconds later)."""
    port = free_port()
    command = [sys.executable, "-m", "onnxmt.cli", "serve", str(model_dir), "--port", str(port)]
    print(f"== serve: {' '.join(command)}", flush=True)
    child = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        out = {"ready_s": decoder_serve.wait_ready(child, url, "/ready")}  # /health is liveness
        time.sleep(REST)
        out["ready_mb"] = rss_mb(child.pid)["rss_mb"]
        for q in ("Where is the train station?", long_text(model_dir, LONG_PROMPT), BATCH):
            fields = {"q": q, "max_new_tokens": 32, **translate}
            httpx.post(f"{url}/translate", json=fields, timeout=900).raise_for_status()
        out["after_mb"] = rss_mb(child.pid)["rss_mb"]
        time.sleep(REST)
        out["rest_mb"] = rss_mb(child.pid)["rss_mb"]
        return out
    finally:
        child.terminate()
        child.wait(60)


def weight_bytes(model_dir: Path) -> int:
    """The checkpoint's weights in float32 bytes (4 per parameter), whatever dtype it is saved in: what export
    holds and writes (TranslateGemma-4B's random checkpoint is saved in bfloat16)."""
    total = 0
    for path in model_dir.glob("*.safetensors"):
        with path.open("rb") as f:
            header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
        total += sum(4 * math.prod(t["shape"]) for name, t in header.items() if name != "__metadata__")
    return total


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="bench.py big-models", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", choices=sorted(MODELS) + sorted(DECODER_ONLY), default="nllb-200-3.3B")
    parser.add_argument("--decoder-cache", type=Path, default=Path("/work/bench-models"), help="decoder-only sources")
    parser.add_argument("--steps", default=",".join(STEPS), help=f"comma-separated, of {', '.join(STEPS)}")
    parser.add_argument("--keep", action="store_true", help="keep the exported directories (disk: 2x the weights)")
    parser.add_argument("--work", type=Path, help="the steps' directories (default: benchmarks/.cache/MODEL-big)")
    parser.add_argument("--name", help="the results' file name (default: the model's)")
    args = parser.parse_args(argv)
    steps = args.steps.split(",")
    unknown = set(steps) - set(STEPS)
    if unknown:
        parser.error(f"unknown steps {sorted(unknown)}; choose from {', '.join(STEPS)}")

    # The serve step alone needs only the int4 directory: the source is not built for it (only its size read).
    serve_only = steps == ["serve"]
    if serve_only and args.model in DECODER_ONLY:
        source = args.decoder_cache / args.model / "hf"
    elif serve_only:
        source = CACHE / f"{args.model}-random" / "hf"
    else:
        source = source_model(args.model, args.decoder_cache)
    weights = weight_bytes(source)
    work = args.work or CACHE / f"{args.model}-big"
    fp32 = work / "fp32"
    onnxmt = [sys.executable, "-m", "onnxmt.cli"]
    commands = {
        "export": [*onnxmt, "export", str(source), str(fp32), "--force"],
        "int8": [*onnxmt, "quantize", str(fp32), str(work / "int8"), "--force"],
        "int8-rows": [*onnxmt, "quantize", str(fp32), str(work / "int8-rows"), "--per-row-scales", "--force"],
        "int4": [*onnxmt, "quantize", str(fp32), str(work / "int4"), "--int4", "--force"],
        # Straight to int8 (no fp32 weights.bin written): its peak is export's, its time export's and quantize's.
        "export-int8": [*onnxmt, "export", str(source), str(work / "export-int8"), "--quantize", "int8", "--force"],
    }
    texts = work / "texts.txt"
    if not serve_only:
        work.mkdir(parents=True, exist_ok=True)
        texts.write_text("\n".join(VALIDATE_TEXTS) + "\n", encoding="utf-8")
    commands["validate"] = [
        *onnxmt,
        "validate",
        str(fp32),
        "--reference",
        str(source),
        "--input",
        str(texts),
        "--report",
        str(work / "validate"),
        "--min-identical",
        "0",
        "--max-new-tokens",
        "30",  # random weights run to the length limit: 30 steps bound the time, not the memory
        *TARGETS_LANG.get(args.model, []),
    ]
    results: list[Step] = []
    for name in STEPS:
        if name not in steps:
            continue
        if name == "serve":
            results.append(serve_step(work / "int4", args.model))
            continue
        arguments = commands[name][len(onnxmt) + 1 :]
        sides = validate_sides(arguments, work / "reference-side") if name == "validate" else None
        print(f"== {name}: {' '.join(commands[name])}", flush=True)
        seconds, peak = run(commands[name])
        if sides is None:
            step = Step(name, round(seconds, 1), round(peak), round(peak * 2**20 / weights, 3), TARGETS[name])
        else:
            larger = max(sides.values())
            basis = "the larger side (" + ", ".join(f"{k} alone {v:,.0f} MB" for k, v in sides.items()) + ")"
            step = Step(name, round(seconds, 1), round(peak), round(peak / larger, 3), TARGETS[name], basis, sides)
        results.append(step)
        print(f"   {seconds:.0f} s, peak {peak:.0f} MB = {step.ratio:.2f}x {step.basis}", flush=True)
    report(args.name or args.model, args.model, weights, results)
    if not args.keep and not serve_only:
        shutil.rmtree(work, ignore_errors=True)


def serve_step(int4: Path, model: str) -> Step:
    """RSS at rest (idle after requests) against the int4 directory's files."""
    if not (int4 / "onnxmt.json").is_file():
        raise SystemExit("the serve step serves the int4 step's directory: run it with --steps int4,serve (or --keep)")
    files = sum(p.stat().st_size for p in int4.iterdir() if p.is_file())
    decoder = DECODER_ONLY.get(model)
    fields = {"source": decoder.source_lang, "target": decoder.target_lang} if decoder else {"target": "zh"}
    rss = served(int4, fields)
    basis = (
        f"the int4 files ({files / 2**20:,.0f} MB); RSS idle {REST:.0f} s after a short text, a {LONG_PROMPT}-token "
        f"prompt and a batch of {len(BATCH)} (once ready {rss['ready_mb']:,.0f} MB, right after them "
        f"{rss['after_mb']:,.0f} MB = {rss['after_mb'] * 2**20 / files:.2f}x)"
    )
    print(f"   ready in {rss['ready_s']:.0f} s; RSS {rss}", flush=True)
    ratio = round(rss["rest_mb"] * 2**20 / files, 3)
    return Step("serve", round(rss["ready_s"], 1), round(rss["rest_mb"]), ratio, TARGETS["serve"], basis)


def report(name: str, model: str, weights: int, results: list[Step]) -> None:
    """Write the table to RESULTS/NAME.{md,json}, keeping the steps of an earlier run of the same name that this run
    did not repeat."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    earlier = RESULTS / f"{name}.json"
    if earlier.is_file():
        ran = {s.name for s in results}
        kept = [Step(**s) for s in json.loads(earlier.read_text(encoding="utf-8"))["steps"] if s["name"] not in ran]
        results = sorted(kept + results, key=lambda s: STEPS.index(s.name))
    machine = describe_machine()
    lines = [
        f"# {model} (random weights, real architecture): peak RSS per step",
        "",
        f"fp32 weights: {weights / 2**20:,.0f} MB. {machine['cpu']}, {machine['cores']} cores, "
        f"{machine['memory_gb']} GB; load average at the end {machine['load_average'][0]:.1f}; commit "
        f"{machine['git_commit']}; Python {platform.python_version()}.",
        "",
        "| step | wall | peak RSS | ratio | of | target |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for s in results:
        mark = "met" if s.ratio <= s.target else "missed"
        lines.append(
            f"| {s.name} | {s.seconds:.0f} s | {s.peak_mb:,.0f} MB | {s.ratio:.2f}x | {s.basis} "
            f"| <= {s.target}x ({mark}) |"
        )
    text = "\n".join(lines) + "\n"
    print(text)
    (RESULTS / f"{name}.md").write_text(text, encoding="utf-8")
    data = {"model": model, "weight_bytes": weights, "machine": machine, "steps": [s.__dict__ for s in results]}
    (RESULTS / f"{name}.json").write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
