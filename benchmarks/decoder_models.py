"""The models of `bench.py decoder --model hy-mt1.5-1.8b | qwen3-1.7b | translategemma-4b`: a random model with
the exact architecture of HY-MT1.5-1.8B, Qwen3-1.7B or TranslateGemma-4B's text decoder, and every engine's
conversion of it, built once and cached (models.cached: a `.bench-key` file written last).

- onnxmt: `onnxmt export` (fp32), `onnxmt quantize` (int8; int4 MatMulNBits at the block sizes and accuracy levels
  asked for);
- llama.cpp: its `convert_hf_to_gguf.py` (f16) and `llama-quantize` (Q4_0, Q4_K_M, Q8_0), from the llama.cpp that
  the llama-cpp-python sdist vendors (`--llama-cpp DIR`: its source tree; `DIR/build/bin` holds llama-quantize and
  llama-server). The random model's tokenizer is a small BPE whose pre-tokenizer llama.cpp does not know by hash:
  the converter is told the family's pre-tokenizer name instead (the engines are fed token ids, never text);
- onnxruntime-genai: its model builder (`python -m onnxruntime_genai.models.builder`), int4 and int8;
- CTranslate2: `TransformersConverter`, int8 (it has loaders for Qwen3 and Gemma 3, none for Hunyuan).

The other engines live in another venv (`--bench-python`, default /work/bench-venv/bin/python): their converters run
there, as subprocesses, so that this environment stays the project's.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from models import Log, _hash_files, cached, in_child
from onnxmt.testing.decoder_only import BENCHMARK_FAMILIES, DecoderOnlySpec, build_decoder_only

REPO = Path(__file__).resolve().parents[1]


def _gemma_layer_types(layers: int) -> list[str]:
    # Gemma 3: every sixth layer global, the others sliding (transformers' Gemma3TextConfig default pattern).
    return ["full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(layers)]


@dataclass(frozen=True)
class DecoderModel:
    """A benchmark model: its random spec (the real config's sizes), the languages of its prompt, and which
    converters exist for its architecture."""

    name: str
    spec: DecoderOnlySpec
    source_lang: str = "en"
    target_lang: str = "zh"
    ct2: bool = True  # CTranslate2 has no Hunyuan loader
    gguf_pre: str = "qwen2"  # the llama.cpp pre-tokenizer name the converter is told (module docstring)
    # The dtype the random checkpoint is saved in, as the real one is (bfloat16 halves a 4B model's 15.6 GB on
    # disk and while it is built). Every engine's loader is told float32 where it computes in float32 (the
    # exporter, validate, the transformers row): transformers 5 would otherwise load it in its saved dtype.
    dtype: str = "float32"
    extra: dict[str, Any] = field(default_factory=dict)


HY_MT_1_8B = DecoderModel(
    "hy-mt1.5-1.8b",
    DecoderOnlySpec(
        family=BENCHMARK_FAMILIES["hy-mt1.5-1.8b"],
        hidden_size=2048,
        layers=32,
        heads=16,
        kv_heads=4,
        head_dim=128,
        intermediate_size=6144,
        vocab_size=120818,
        max_position_embeddings=262144,
        init_std=0.02,
    ),
    ct2=False,
    gguf_pre="hunyuan-dense",
)
QWEN3_1_7B = DecoderModel(
    "qwen3-1.7b",
    DecoderOnlySpec(
        family=BENCHMARK_FAMILIES["qwen3-1.7b"],
        hidden_size=2048,
        layers=28,
        heads=16,
        kv_heads=8,
        head_dim=128,
        intermediate_size=6144,
        vocab_size=151936,
        max_position_embeddings=40960,
        init_std=0.02,
    ),
)
TRANSLATEGEMMA_4B = DecoderModel(
    "translategemma-4b",
    DecoderOnlySpec(
        family=BENCHMARK_FAMILIES["translategemma-4b"],
        hidden_size=2560,
        layers=34,
        heads=8,
        kv_heads=4,
        head_dim=256,
        intermediate_size=10240,
        vocab_size=262208,
        sliding_window=1024,
        max_position_embeddings=131072,
        init_std=0.02,
        config_overrides={"query_pre_attn_scalar": 256, "layer_types": _gemma_layer_types(34)},
    ),
    gguf_pre="default",
    dtype="bfloat16",
)


def smaller(model: DecoderModel, layers: int) -> DecoderModel:
    """The same architecture with fewer layers (`--layers`): the harness's smoke runs."""
    overrides = dict(model.spec.config_overrides)
    if "layer_types" in overrides:
        overrides["layer_types"] = _gemma_layer_types(layers)
    spec = replace(model.spec, layers=layers, config_overrides=overrides)
    return replace(model, name=f"{model.name}-{layers}l", spec=spec)


def quick(model: DecoderModel) -> DecoderModel:
    """--quick: the family's tiny test model (widths of tens), seconds to build and run."""
    # A real window (only Gemma 3 reads it): the tiny model's 8 positions would make every prompt cross it.
    spec = DecoderOnlySpec(family=model.spec.family, max_position_embeddings=2048, sliding_window=1024)
    return replace(model, name=f"{model.name}-quick", spec=spec)


DECODER_MODELS = {m.name: m for m in (HY_MT_1_8B, QWEN3_1_7B, TRANSLATEGEMMA_4B)}


@dataclass(frozen=True)
class Variant:
    """One engine's model directory (or GGUF file) and how the worker runs it."""

    name: str  # row name, e.g. onnxmt-int4-b32-a4
    label: str
    kind: str  # decoder_worker.ENGINES key
    path: Path
    bits: int  # weight bits, for the floor this row is compared with (32, 8 or 4)
    options: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Tools:
    bench_python: Path | None  # the other engines' venv
    llama_cpp: Path | None  # llama.cpp source tree with build/bin


def hf_key(model: DecoderModel) -> dict[str, Any]:
    """The random checkpoint's cache key (shared by bench.py decoder and big-models); the dtype only where it is
    not float32, so that the float32 models' keys stay what they were."""
    key = {"spec": asdict(model.spec), "builder": _hash_files(REPO / "src" / "onnxmt" / "testing")}
    return key if model.dtype == "float32" else {**key, "dtype": model.dtype}


def build_hf(out: Path, spec: DecoderOnlySpec, dtype: str = "float32") -> None:
    """The random model, built and saved in `dtype`; its generation config made plain greedy (no sampling, no
    repetition penalty), so every engine decodes the same way without per-engine options."""
    import torch

    torch.set_default_dtype(getattr(torch, dtype))  # the model is made in it: never held in float32
    try:
        build_decoder_only(out, spec)
    finally:
        torch.set_default_dtype(torch.float32)
    path = out / "generation_config.json"
    generation = json.loads(path.read_text(encoding="utf-8"))
    for key in ("do_sample", "temperature", "top_k", "top_p", "repetition_penalty"):
        generation.pop(key, None)
    path.write_text(json.dumps(generation, indent=2), encoding="utf-8")


def _run(command: list[str], what: str, cwd: Path | None = None) -> None:
    result = subprocess.run(command, capture_output=True, text=True, cwd=cwd)
    if result.returncode != 0:
        raise RuntimeError(f"{what} failed:\n{result.stdout[-2000:]}{result.stderr[-3000:]}")


BUILD_FILE = ".bench-build.json"  # how an onnxmt directory was made: the command, its peak RSS and seconds


def onnxmt_measured(out: Path, *args: str) -> None:
    """`onnxmt ARGS` in a child whose peak RSS (wait4's ru_maxrss: that process alone) and wall time are written
    to out/BUILD_FILE: the memory bounds of export and quantize (docs/performance.md)."""
    import os
    import tempfile
    import time

    with tempfile.TemporaryFile() as log:
        started = time.monotonic()
        child = subprocess.Popen([sys.executable, "-m", "onnxmt.cli", *args], stdout=log, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(child.pid, 0)
        seconds = time.monotonic() - started
        child.returncode = os.waitstatus_to_exitcode(status)
        if child.returncode != 0:
            log.seek(0)
            raise RuntimeError(f"`onnxmt {args[0]}` failed:\n{log.read().decode(errors='replace')[-3000:]}")
    record = {"command": ["onnxmt", *args], "peak_rss_mb": usage.ru_maxrss / 1024, "seconds": round(seconds, 1)}
    (out / BUILD_FILE).write_text(json.dumps(record, indent=1), encoding="utf-8")


# The converter run with the family's pre-tokenizer name instead of a hash lookup (module docstring).
_GGUF_CONVERT = """
import sys
sys.path.insert(0, {root!r})
sys.path.insert(0, {root!r} + "/gguf-py")
sys.argv = ["convert_hf_to_gguf.py", *{args!r}]
import conversion.base as base
base.TextModel.get_vocab_base_pre = lambda self, tokenizer: {pre!r}
import runpy
runpy.run_path({root!r} + "/convert_hf_to_gguf.py", run_name="__main__")
"""


def convert_gguf(tools: Tools, hf: Path, out: Path, pre: str, types: tuple[str, ...]) -> None:
    assert tools.bench_python and tools.llama_cpp
    out.mkdir(parents=True, exist_ok=True)
    f16 = out / "model-f16.gguf"
    code = _GGUF_CONVERT.format(
        root=str(tools.llama_cpp), args=[str(hf), "--outfile", str(f16), "--outtype", "f16"], pre=pre
    )
    _run([str(tools.bench_python), "-c", code], "convert_hf_to_gguf.py")
    quantize = tools.llama_cpp / "build" / "bin" / "llama-quantize"
    for kind in types:
        _run([str(quantize), str(f16), str(out / f"model-{kind}.gguf"), kind, "2"], f"llama-quantize {kind}")
    f16.unlink()


def build_ortgenai(tools: Tools, hf: Path, out: Path, precision: str, extra: tuple[str, ...]) -> None:
    assert tools.bench_python
    cache = out.with_name(out.name + ".builder-cache")
    command = [str(tools.bench_python), "-m", "onnxruntime_genai.models.builder", "-i", str(hf), "-o", str(out)]
    command += ["-p", precision, "-e", "cpu", "-c", str(cache)]
    if extra:
        command += ["--extra_options", *extra]
    try:
        _run(command, f"onnxruntime-genai builder {precision}")
    finally:
        shutil.rmtree(cache, ignore_errors=True)


_CT2_CONVERT = """
from ctranslate2.converters import TransformersConverter
TransformersConverter({hf!r}, low_cpu_mem_usage=True).convert({out!r}, quantization="int8", force=True)
"""


def convert_ct2(tools: Tools, hf: Path, out: Path) -> None:
    assert tools.bench_python
    _run([str(tools.bench_python), "-c", _CT2_CONVERT.format(hf=str(hf), out=str(out))], "CTranslate2 converter")


def bench_version(tools: Tools, package: str) -> str | None:
    if not tools.bench_python:
        return None
    code = f"from importlib import metadata; print(metadata.version({package!r}))"
    result = subprocess.run([str(tools.bench_python), "-c", code], capture_output=True, text=True)
    return result.stdout.strip() if result.returncode == 0 else None


def prepare(
    cache: Path,
    model: DecoderModel,
    tools: Tools,
    int4: list[tuple[int, int]],
    wanted: set[str] | None,
    log: Log,
) -> tuple[list[Variant], dict[str, str]]:
    """Every row's model, built if missing: (variants in table order, skipped rows and why). `int4`: the
    (block size, accuracy level) pairs of onnxmt's int4 rows; `wanted`: row names to build (None: all)."""
    root = cache / model.name
    source_key = hf_key(model)
    hf = cached(root / "hf", source_key, lambda out: in_child(build_hf, out, model.spec, model.dtype), log)
    skipped: dict[str, str] = {}
    variants: list[Variant] = []

    def want(name: str) -> bool:
        return wanted is None or name in wanted

    def add(variant: Variant, key: dict[str, Any], build: Any, reason: str | None = None) -> None:
        if not want(variant.name):
            return
        if reason:
            skipped[variant.name] = reason
            return
        try:
            variants.append(replace(variant, path=cached(variant.path, key, build, log)))
        except Exception as e:
            skipped[variant.name] = f"build failed: {e}"[-1500:]
            log(f"{variant.name}: {skipped[variant.name]}")

    exporter = _hash_files(REPO / "src" / "onnxmt" / "export", REPO / "src" / "onnxmt" / "manifest.py")
    onnxmt_key = {**source_key, "exporter": exporter}

    def export(out: Path) -> None:
        onnxmt_measured(out, "export", str(hf), str(out), "--force")

    def fp32() -> Path:
        # Exported when a quantized row is built, not when one is cached: a 4B model's int8 and int4 rows run
        # with its 15.6 GB fp32 export deleted.
        return cached(root / "onnxmt-fp32", onnxmt_key, export, log)

    add(Variant("onnxmt-fp32", "onnxmt fp32", "onnxmt", root / "onnxmt-fp32", 32), onnxmt_key, export)
    add(
        Variant("onnxmt-int8", "onnxmt int8", "onnxmt", root / "onnxmt-int8", 8),
        {**onnxmt_key, "quantize": "int8"},
        lambda out: onnxmt_measured(out, "quantize", str(fp32()), str(out), "--force"),
    )
    for i, (block, level) in enumerate(int4):
        name = f"onnxmt-int4-b{block}-a{level}"
        label = f"onnxmt int4 (block {block}, accuracy {level})"
        add(
            Variant(name, label, "onnxmt", root / name, 4, {"served": i == 0}),  # the first int4 row is served
            {**onnxmt_key, "quantize": ["int4", block, level]},
            lambda out, b=block, a=level: onnxmt_measured(
                out,
                "quantize",
                str(fp32()),
                str(out),
                "--int4",
                "--block-size",
                str(b),
                "--accuracy-level",
                str(a),
                "--force",
            ),
        )
    no_bench = None if tools.bench_python else "no venv of the other engines (--bench-python)"
    no_llama = no_bench or (None if tools.llama_cpp else "no llama.cpp build (--llama-cpp)")
    gguf_types = ("Q4_0", "Q4_K_M", "Q8_0")
    gguf_dir = root / "gguf"
    gguf_key = {**source_key, "llama_cpp": bench_version(tools, "llama_cpp_python"), "types": gguf_types}
    if any(want(f"llama-{t.lower()}") for t in gguf_types) and not no_llama:
        try:
            cached(gguf_dir, gguf_key, lambda out: convert_gguf(tools, hf, out, model.gguf_pre, gguf_types), log)
        except Exception as e:
            no_llama = f"build failed: {e}"[-1500:]
            log(f"gguf: {no_llama}")
    for kind in gguf_types:
        bits = 8 if kind == "Q8_0" else 4
        variant = Variant(f"llama-{kind.lower()}", f"llama.cpp {kind}", "llama", gguf_dir / f"model-{kind}.gguf", bits)
        if want(variant.name):
            if no_llama:
                skipped[variant.name] = no_llama
            else:
                variants.append(variant)
    genai_key = {**source_key, "onnxruntime_genai": bench_version(tools, "onnxruntime-genai")}
    for precision, bits, extra in (
        ("int4", 4, ()),
        ("int8", 8, ()),
    ):  # the builder's CPU defaults (block 32, accuracy 4)
        add(
            Variant(
                f"ortgenai-{precision}",
                f"onnxruntime-genai {precision}",
                "ortgenai",
                root / f"ortgenai-{precision}",
                bits,
            ),
            {**genai_key, "precision": precision, "extra": extra},
            lambda out, p=precision, x=extra: build_ortgenai(tools, hf, out, p, x),
            no_bench,
        )
    add(
        Variant("ct2-int8", "CTranslate2 int8", "ctranslate2", root / "ct2-int8", 8),
        {**source_key, "ctranslate2": bench_version(tools, "ctranslate2")},
        lambda out: convert_ct2(tools, hf, out),
        no_bench or (None if model.ct2 else "CTranslate2 has no converter for this architecture"),
    )
    if want("transformers"):
        variants.append(Variant("transformers", "transformers PyTorch fp32", "transformers", hf, 32))
    return variants, skipped


def python_of(variant: Variant, tools: Tools) -> Path:
    """The interpreter a row's worker runs in: onnxmt in this environment, the other engines in theirs."""
    if variant.kind == "onnxmt":
        return Path(sys.executable)
    assert tools.bench_python
    return tools.bench_python
