"""The models every engine runs, built once and cached: a random model with the architecture of opus-mt-en-zh
(MarianMT) or of NLLB-200-distilled-600M (M2M100), and its onnxmt, CTranslate2 and Optimum conversions.

Each artifact lives in its own directory under the cache with a `.bench-key` file written last; a directory whose
key differs from what would be built now (another spec, another exporter source, another converter version) is
rebuilt, so a cache never silently serves a stale model.
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from importlib import metadata
from pathlib import Path
from typing import Any

from onnxmt.testing import (
    FLAN_T5_BASE,
    MADLAD_400_3B,
    MBART_LARGE_50,
    NLLB_200_1_3B,
    NLLB_200_3_3B,
    NLLB_200_DISTILLED_600M,
    OPUS_MT_EN_ZH,
    OPUS_MT_TC_BIG,
    M2M100Spec,
    MarianSpec,
    MBart50Spec,
    ModelSpec,
    NllbSpec,
    T5Spec,
    TcBigSpec,
    build_random_model,
)

REPO = Path(__file__).resolve().parents[1]
KEY_FILE = ".bench-key"
OPTIMUM_ENV_SCRIPT = REPO / "tests" / "helpers" / "optimum_env.py"
TARGET_LANG = "cmn_Hans"

Spec = MarianSpec | M2M100Spec | MBart50Spec | T5Spec

# The random builder trains its source tokenizer on generated word salad, which splits real English into ~2x the
# tokens opus-mt's tokenizer would: encoder work, and so timings, would be off. The benchmark retrains the source
# tokenizer on real English (Tatoeba plus FLORES devtest), giving ~1.5 tokens per word, close to opus-mt's.
SOURCE_PIECES = 8000

FULL = replace(OPUS_MT_EN_ZH, source_pieces=SOURCE_PIECES)
# --quick: same code paths, a model small enough that the whole run takes seconds.
QUICK = replace(
    MarianSpec(),
    target_languages=OPUS_MT_EN_ZH.target_languages,
    vocab_size=9000,
    max_position_embeddings=256,
    source_pieces=SOURCE_PIECES,
)

NLLB_QUICK = NllbSpec(d_model=64, ffn_dim=128, max_position_embeddings=256, pieces=2000)
TC_BIG_QUICK = TcBigSpec(d_model=64, ffn_dim=128, max_position_embeddings=256, source_pieces=SOURCE_PIECES)
MBART_QUICK = MBart50Spec(d_model=64, ffn_dim=128, max_position_embeddings=256, pieces=2000)
FLAN_T5_QUICK = T5Spec(d_model=64, ffn_dim=128, max_position_embeddings=256, pieces=2000, gated=True, tied=False)
MADLAD_QUICK = replace(FLAN_T5_QUICK, madlad=True, init_std=1.0)
QUICK_SPECS = (QUICK, NLLB_QUICK, TC_BIG_QUICK, MBART_QUICK, FLAN_T5_QUICK, MADLAD_QUICK)


@dataclass(frozen=True)
class Family:
    """What differs between the benchmark's two models: the languages each engine is told, and the files."""

    name: str  # the cache folder of the full-size model
    source_lang: str | None  # the model's own code, for models told the source by a token
    target_lang: str | None  # None: a single-target model
    spm_files: tuple[str, ...]  # sentencepiece models CTranslate2 tokenizes with
    optimum: bool  # whether the Optimum rows are part of this model's table
    # A 3B model: int8 rows only (onnxmt's straight from `export --quantize int8`, CTranslate2's), as fp32 copies
    # of 12-13 GB each would not fit the disk beside them; its source is big_models.py's (a tokenizer trained on
    # generated sentences, so source lengths differ from the smaller models' tables: the legend gives them).
    int8_only: bool = False


MARIAN = Family("opus-mt-en-zh-random", None, TARGET_LANG, ("source.spm", "target.spm"), True)
# The issue asks NLLB's row against transformers and CTranslate2; Optimum's rows are the opus-mt table's.
NLLB = Family("nllb-200-distilled-600M-random", "eng_Latn", "zho_Hans", ("sentencepiece.bpe.model",), False)
NLLB_1_3B = replace(NLLB, name="nllb-200-1.3B-random")
# opus-mt-tc-big-zle-en's architecture: single target (English), its source tokenizer trained on real English as
# the opus-mt model's (so the input's lengths match), float16 weights as shipped.
TC_BIG = Family("opus-mt-tc-big-random", None, None, ("source.spm", "target.spm"), False)
# mBART-50 many-to-many: `[en_XX] X </s>`, zh_CN forced first, as CTranslate2 documents it.
MBART50 = Family("mbart-large-50-random", "en_XX", "zh_CN", ("sentencepiece.bpe.model",), False)
# flan-T5: `translate English to German: ` before the text (its config's task prefix), one tokenizer.
FLAN_T5 = Family("flan-t5-base-random", None, "de", ("tokenizer.json",), False)
NLLB_3_3B = replace(NLLB, name="nllb-200-3.3B-random", int8_only=True)
# MADLAD-400: `<2zh> X </s>`, the target language a token written before the text.
MADLAD_3B = Family("madlad400-3b-mt-random", None, "zh", ("tokenizer.json",), False, int8_only=True)
MODELS: dict[str, tuple[Family, Spec, Spec]] = {  # --model: family, full-size spec, --quick spec
    "opus-mt-en-zh": (MARIAN, FULL, QUICK),
    "nllb-200-distilled-600M": (NLLB, NLLB_200_DISTILLED_600M, NLLB_QUICK),
    "nllb-200-1.3B": (NLLB_1_3B, NLLB_200_1_3B, NLLB_QUICK),
    "opus-mt-tc-big": (TC_BIG, replace(OPUS_MT_TC_BIG, source_pieces=SOURCE_PIECES), TC_BIG_QUICK),
    "mbart-large-50": (MBART50, MBART_LARGE_50, MBART_QUICK),
    "flan-t5-base": (FLAN_T5, FLAN_T5_BASE, FLAN_T5_QUICK),
    "nllb-200-3.3B": (NLLB_3_3B, NLLB_200_3_3B, NLLB_QUICK),
    "madlad400-3b-mt": (MADLAD_3B, MADLAD_400_3B, MADLAD_QUICK),
}


Log = Callable[[str], None]


@dataclass(frozen=True)
class Artifacts:
    """Model directories by engine variant; None where the tool to make it is not available."""

    hf: Path
    onnxmt_fp32: Path | None  # None for an int8-only family
    onnxmt_int8: Path | None
    ct2_float32: Path | None
    ct2_int8: Path | None
    optimum_fp32: Path | None
    optimum_python: Path | None  # the Optimum venv's interpreter
    skipped: dict[str, str]  # artifact -> why it is missing


def _hash_files(*paths: Path) -> str:
    digest = hashlib.sha256()
    for path in paths:
        for file in sorted(path.rglob("*.py")) if path.is_dir() else [path]:
            digest.update(file.read_bytes())
    return digest.hexdigest()[:16]


def _version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def source_key(spec: ModelSpec, corpus: list[str] | None) -> dict[str, Any]:
    """What a random source model is built from: its `.bench-key` (big_models.py's source has the same)."""
    return {
        "spec": asdict(spec),
        "corpus": hashlib.sha256("\n".join(corpus).encode()).hexdigest()[:16] if corpus is not None else None,
        "pieces": SOURCE_PIECES,
        "builder": _hash_files(REPO / "src" / "onnxmt" / "testing"),
    }


def cached(path: Path, key: dict, build: Callable[[Path], None], log: Log) -> Path:
    """`path`, built by `build(tmp)` unless it already holds an artifact built with the same `key`."""
    text = json.dumps(key, sort_keys=True)
    if (path / KEY_FILE).is_file() and (path / KEY_FILE).read_text() == text:
        return path
    log(f"building {path.name}")
    shutil.rmtree(path, ignore_errors=True)
    tmp = path.with_name(path.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.parent.mkdir(parents=True, exist_ok=True)
    build(tmp)
    (tmp / KEY_FILE).write_text(text)
    tmp.rename(path)
    return path


def read_lines(path: Path, n: int | None = None) -> list[str]:
    lines = [line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    return lines if n is None else lines[:n]


def build_hf(out: Path, spec: Spec, corpus: list[str] | None) -> None:
    """The random model, its source tokenizer trained on `corpus` (real English: see SOURCE_PIECES; None: on
    generated sentences)."""
    build_random_model(out, spec, corpus)


def in_child(function: Callable[..., None], *args: Any) -> None:
    """`function(*args)` in a fresh (spawned) process: building or converting a 3B model holds it whole in
    PyTorch, and this process must not keep that memory while the engines run."""
    child = multiprocessing.get_context("spawn").Process(target=function, args=args)
    child.start()
    child.join()
    if child.exitcode != 0:
        raise RuntimeError(f"{function.__name__} failed in a child process (exit code {child.exitcode})")


def onnxmt_command(*args: str) -> None:
    result = subprocess.run([sys.executable, "-m", "onnxmt.cli", *args], capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"`onnxmt {args[0]}` failed:\n{result.stdout[-2000:]}{result.stderr[-2000:]}")


def export_onnxmt(hf: Path, out: Path) -> None:
    onnxmt_command("export", str(hf), str(out), "--force")


def export_onnxmt_int8(hf: Path, out: Path) -> None:
    """int8 straight from the checkpoint (`export --quantize int8`), for families with no fp32 rows."""
    onnxmt_command("export", str(hf), str(out), "--quantize", "int8", "--force")


def quantize_available() -> bool:
    """Whether this onnxmt has the `quantize` command (the int8 row is optional until it does)."""
    result = subprocess.run([sys.executable, "-m", "onnxmt.cli", "quantize", "--help"], capture_output=True)
    return result.returncode == 0


def quantize_onnxmt(fp32: Path, out: Path, *flags: str) -> None:
    onnxmt_command("quantize", str(fp32), str(out), *flags)


def convert_ct2(hf: Path, out: Path, quantization: str, spm_files: tuple[str, ...]) -> None:
    from ctranslate2.converters import TransformersConverter

    # low_cpu_mem_usage: transformers loads the checkpoint without first filling a randomly initialised copy.
    TransformersConverter(str(hf), low_cpu_mem_usage=True).convert(str(out), quantization=quantization, force=True)
    # The benchmark tokenizes with sentencepiece directly, as a CTranslate2 deployment does.
    for name in spm_files:
        shutil.copy2(hf / name, out / name)


def export_optimum(hf: Path, out: Path) -> None:
    _optimum_env().export(hf, out)


def _optimum_env():
    """tests/helpers/optimum_env.py, the venv helper the tests use, imported by path (a script of its own: it runs
    in the Optimum venv too)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("optimum_env", OPTIMUM_ENV_SCRIPT)
    if spec is None or spec.loader is None:
        return None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def optimum_python(create: bool, log: Log = print) -> Path | None:
    """The Optimum venv's python; None when the helper is missing, or the venv is absent and `create` is False,
    or it cannot be made."""
    if not OPTIMUM_ENV_SCRIPT.is_file():
        return None
    env = _optimum_env()
    venv = env.venv_path()
    if not create and not (venv / env.STAMP).is_file():
        return None
    try:
        return env.ensure_venv(log=log)
    except env.OptimumEnvError as e:
        log(f"no Optimum venv: {str(e)[-2000:]}")
        return None


def prepare(
    cache: Path,
    family: Family,
    spec: Spec,
    corpus: list[str],
    *,
    skip_ct2: str | None = None,
    skip_optimum: str | None = None,
    create_optimum_venv: bool = True,
    with_fp32: bool = False,
    log: Log = print,
) -> Artifacts:
    """`family` names the cache folder: the spec alone does not tell NLLB-200-1.3B from the 600M model.
    `with_fp32`: an int8-only family's fp32 rows too (onnxmt's and CTranslate2's; not transformers')."""
    quick = spec in QUICK_SPECS
    root = cache / (f"{family.name}-quick" if quick else family.name)
    source_corpus = None if family.int8_only else corpus
    hf_key = source_key(spec, source_corpus)
    hf = cached(root / "hf", hf_key, lambda out: in_child(build_hf, out, spec, source_corpus), log)
    onnxmt_key = {
        **hf_key,
        "exporter": _hash_files(REPO / "src" / "onnxmt" / "export", REPO / "src" / "onnxmt" / "manifest.py"),
    }
    skipped: dict[str, str] = {}

    def optional(name: str, key: dict, build: Callable[[Path], None], reason: str | None) -> Path | None:
        # Rows other than onnxmt fp32 and transformers depend on tools that may be missing or broken here:
        # a failure drops the row and says why, it does not stop the benchmark.
        if reason:
            skipped[name] = reason
            return None
        try:
            return cached(root / name, key, build, log)
        except Exception as e:
            skipped[name] = f"build failed: {e}"[-1000:]
            log(f"{name}: {skipped[name]}")
            return None

    if family.int8_only:
        fp32 = cached(root / "onnxmt-fp32", onnxmt_key, lambda out: export_onnxmt(hf, out), log) if with_fp32 else None
        int8 = cached(root / "onnxmt-int8", onnxmt_key, lambda out: export_onnxmt_int8(hf, out), log)
        fp32_reason: str | None = None if with_fp32 else "an int8-only model (--with-fp32 adds the fp32 rows)"
    else:
        fp32_reason = None
        fp32 = cached(root / "onnxmt-fp32", onnxmt_key, lambda out: export_onnxmt(hf, out), log)
        int8 = optional(
            "onnxmt-int8",
            onnxmt_key,
            lambda out: quantize_onnxmt(fp32, out),
            None if quantize_available() else "this onnxmt has no `quantize` command",
        )
    ct2_key = {**hf_key, "ctranslate2": _version("ctranslate2"), "transformers": _version("transformers")}
    no_ct2 = None if _version("ctranslate2") else "ctranslate2 is not installed"
    ct2 = {
        q: optional(
            f"ct2-{q}",
            {**ct2_key, "quantization": q},
            lambda out, q=q: in_child(convert_ct2, hf, out, q, family.spm_files),
            no_ct2 or skip_ct2 or (fp32_reason if q == "float32" else None),
        )
        for q in ("float32", "int8")
    }
    optimum = None
    if not family.optimum or family.int8_only:
        skip_optimum = skip_optimum or "not part of this model's table (transformers and CTranslate2 only)"
    if skip_optimum:
        skipped["optimum-fp32"] = skip_optimum
    elif (python := optimum_python(create_optimum_venv, log)) is None:
        skipped["optimum-fp32"] = "no Optimum venv (tests/helpers/optimum_env.py missing, not created yet, or failed)"
    else:
        optimum_key = {**hf_key, "optimum_env": _hash_files(OPTIMUM_ENV_SCRIPT)}
        optimum = optional("optimum-fp32", optimum_key, lambda out: export_optimum(hf, out), None)
    return Artifacts(hf, fp32, int8, ct2["float32"], ct2["int8"], optimum, python if optimum else None, skipped)
