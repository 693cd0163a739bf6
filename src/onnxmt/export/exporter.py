"""`onnxmt export`: a HuggingFace seq2seq model to a self-contained onnxmt model directory."""

from __future__ import annotations

import gc
import json
import os
import platform
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

from ..architectures import Architecture, get_architecture
from ..manifest import (
    CONFIG_FILES,
    DECODER_FILE,
    ENCODER_FILE,
    WEIGHTS_FILE,
    Manifest,
    check_generation_config,
    describe_files,
)
from ..options import option
from ..version import __version__
from .binding import TensorFile
from .graphs import Target, cache_names, export_decoder, export_encoder, graph_spec
from .hub import quiet_transformers, resolve_model
from .staging import occupied, staged
from .weights import rename_weights_file, store_weights

# The weights as traced, in the order the graphs read them; store_weights copies them into WEIGHTS_FILE.
TRACED_WEIGHTS_FILE = "traced-weights.bin"

# Largest export-time difference from PyTorch we accept in fp32; real exports measure ~1e-5.
CHECK_TOLERANCE = 1e-3


TOKENIZER_JSON = "tokenizer.json"

# `onnxmt export --quantize` forms: the `onnxmt quantize` options each stands for.
QUANTIZED_FORMS = ("int8", "int8-rows", "int4")


class ExportError(ValueError):
    pass


@dataclass(frozen=True)
class ExportOptions:
    opset: int = option(17, help="ONNX opset.")
    revision: str | None = option(None, help="Hub revision (branch, tag or commit).")
    force: bool = option(False, help="Replace a non-empty OUTPUT_DIR.", flags=("--force",))
    default_target: str | None = option(None, help="Default target language of a multi-target model, e.g. cmn_Hans.")
    check: bool = option(True, help="Compare the ONNX graphs with PyTorch after export.")
    quantize: str | None = option(
        None,
        help="Write a quantized directory instead: int8, int8-rows (per-row activation scales) or int4. The fp32 "
        "export is made and checked in a temporary directory beside OUTPUT_DIR, which is removed.",
        choices=QUANTIZED_FORMS,
    )
    # marian.py builds both.
    buffered_cache: bool = option(
        True,
        help="Decoder self-attention cache as a buffer the runtime writes in place (the default: the cache is held "
        "once), or taken and returned grown by a Concat in the graph, as directories exported before this default "
        "have it (docs/performance.md).",
        flags=("--cache-buffer/--cache-concat",),
    )
    # decoder_only.py builds both.
    fused_attention: bool = option(
        True,
        help="Decoder-only models: attention as ONNX Runtime's GroupQueryAttention, which writes the new keys and "
        "values into the cache buffer itself (the default; needs ONNX Runtime 1.32 or later), or as separate ops "
        "that return them for the runtime to write (any ONNX Runtime, any execution provider).",
        flags=("--fused-attention/--separate-attention",),
    )


@dataclass(frozen=True)
class CheckReport:
    """The export's check against PyTorch; `encoder_max_abs_diff` None for a decoder-only model (no encoder: its
    first step is the prompt's prefill)."""

    encoder_max_abs_diff: float | None
    first_step_logits_max_abs_diff: float
    cached_step_logits_max_abs_diff: float

    @property
    def worst(self) -> float:
        return max(
            self.encoder_max_abs_diff or 0.0,
            self.first_step_logits_max_abs_diff,
            self.cached_step_logits_max_abs_diff,
        )

    def describe(self) -> str:
        first = f"first-step logits {self.first_step_logits_max_abs_diff:.2e}"
        if self.encoder_max_abs_diff is None:
            first = f"prefill logits {self.first_step_logits_max_abs_diff:.2e}"
        else:
            first = f"encoder max |diff| {self.encoder_max_abs_diff:.2e}, {first}"
        return f"checked against PyTorch: {first}, cached step {self.cached_step_logits_max_abs_diff:.2e}"


Progress = Callable[[str], None]


@dataclass(frozen=True)
class _Source:
    """The model an export reads: its directory, its config.json, its architecture, and the hub id and revision it
    came from (for the provenance)."""

    directory: Path
    config: dict[str, Any]
    arch: Architecture
    model_id: str
    revision: str | None

    def generation_config(self) -> dict[str, Any]:
        return _read_json(self.directory / "generation_config.json")


def export(
    model: str, output_dir: str | Path, options: ExportOptions = ExportOptions(), progress: Progress = print
) -> tuple[Manifest, CheckReport | None]:
    """Export `model` (hub id or local directory) to `output_dir`. Nothing is left behind on failure."""
    output = Path(output_dir)
    if occupied(output) and not options.force:
        raise ExportError(f"{output} exists and is not empty; pass --force to replace it")
    if options.quantize is not None:
        return _export_quantized(model, output, options, progress)
    return _export(model, output, options, progress, store=True)


def _export(
    model: str, output: Path, options: ExportOptions, progress: Progress, store: bool
) -> tuple[Manifest, CheckReport | None]:
    """`export` without quantizing; `store=False` leaves the weights where binding wrote them (the traced-weights
    file) instead of writing weights.bin: a directory for `quantize` to read, not for users."""
    progress(f"resolving {model}")
    source, revision = resolve_model(model, options.revision)
    config = json.loads((source / "config.json").read_text(encoding="utf-8"))
    try:
        arch = get_architecture(config.get("model_type")).for_source(source)
    except ValueError as e:
        raise ExportError(str(e)) from e
    # A missing tokenizer file is found before the model is loaded and traced, not after.
    missing = [name for name in arch.tokenizer_files if not (source / name).is_file()]
    if missing:
        needs = ", ".join(arch.tokenizer_files)
        raise ExportError(f"{source / missing[0]}: missing; a {arch.name} model directory needs {needs}")
    # Refuse generation settings onnxmt cannot honour before any work is done (ModelDirError names them).
    generation_config = arch.deterministic(_read_json(source / "generation_config.json"))
    check_generation_config(generation_config, str(source / "generation_config.json"))
    into = _export_decoder_only_into if arch.kind == "decoder_only" else _export_into
    with staged(output, progress) as staging:
        manifest, report = into(staging, _Source(source, config, arch, model, revision), options, progress, store)
    progress(f"wrote {output}")
    return manifest, report


def _export_quantized(
    model: str, output: Path, options: ExportOptions, progress: Progress
) -> tuple[Manifest, CheckReport | None]:
    """Export to fp32 in a temporary directory beside `output`, quantize it into `output`, remove the fp32 one. The
    fp32 weights are never written as weights.bin: the quantizer reads them from the file binding wrote them to,
    so the disk holds the fp32 weights once and the quantized ones."""
    from .quantize import QuantizeOptions, quantize

    if options.quantize not in QUANTIZED_FORMS:
        raise ExportError(f"unknown quantization {options.quantize!r}; valid: {', '.join(QUANTIZED_FORMS)}")
    form = QuantizeOptions(int4=options.quantize == "int4", per_row_scales=options.quantize == "int8-rows", force=True)
    output.parent.mkdir(parents=True, exist_ok=True)
    # Named as a staging directory (staging.py): a killed run's is removed by the next.
    with tempfile.TemporaryDirectory(prefix=f".{output.name}.{os.getpid()}.fp32.", dir=output.parent) as temporary:
        fp32 = Path(temporary) / "fp32"
        _, report = _export(model, fp32, replace(options, quantize=None, force=False), progress, store=False)
        # The fp32 directory is gone once this returns: the provenance says what it was, not where.
        kept = f"an fp32 export of {model} (export --quantize {options.quantize}; not kept)"
        manifest, _ = quantize(fp32, output, form, progress, quantized_from=kept)
    return manifest, report


def _export_into(
    staging: Path, src: _Source, options: ExportOptions, progress: Progress, store: bool
) -> tuple[Manifest, CheckReport | None]:
    """An encoder-decoder model's two graphs, its files and manifest, checked against PyTorch."""
    source, arch = src.directory, src.arch
    progress("loading the PyTorch model")
    with quiet_transformers():  # our progress line, not transformers' weight-loading bars beside it
        model = arch.load(str(source))
    facts = arch.facts(src.config)
    traced = TensorFile(staging / TRACED_WEIGHTS_FILE)
    try:
        progress(f"exporting the encoder ({ENCODER_FILE})")
        export_encoder(arch.encoder(model), Target(staging / ENCODER_FILE, facts, options.opset, traced, progress))
        progress(f"exporting the decoder ({DECODER_FILE})")
        decoder = arch.decoder(model, options.buffered_cache)
        export_decoder(decoder, Target(staging / DECODER_FILE, facts, options.opset, traced, progress))
    finally:
        traced.close()
    feed = _check_feed(facts, arch.tokens(source, src.config, src.generation_config()))
    expected = _pytorch_outputs(model, feed) if options.check else None
    # The PyTorch model goes before the weights are stored and ONNX Runtime loads them: never both resident.
    del model
    gc.collect()
    graph_files = _store_graphs(staging, [ENCODER_FILE, DECODER_FILE], store, progress)
    copied = _copy_side_files(source, staging, arch) + arch.write_tokenizer(source, staging)
    manifest = _build_manifest(staging, src, facts, graph_files + copied, options)
    check = None if expected is None else lambda: check_against_pytorch(expected, feed, staging, manifest)
    return _checked(staging, manifest, "graphs", check, progress)


def _store_graphs(staging: Path, names: list[str], store: bool, progress: Progress) -> list[str]:
    """The traced weights into WEIGHTS_FILE (`store`), or the traced file renamed to it as it is (store_weights runs
    on the quantized graphs instead); every other file in `staging` removed. The graph files and the weights'."""
    graphs = [staging / name for name in names]
    if store:
        progress(f"writing {WEIGHTS_FILE}")
        kept = store_weights(graphs, WEIGHTS_FILE, progress=progress)
    else:
        kept = (staging / TRACED_WEIGHTS_FILE).stat().st_size > 0
        if kept:
            rename_weights_file(graphs, TRACED_WEIGHTS_FILE, WEIGHTS_FILE)
    graph_files = names + ([WEIGHTS_FILE] if kept else [])
    # The traced weights were copied into WEIGHTS_FILE (or into the graphs, for a small model).
    for leftover in set(os.listdir(staging)) - set(graph_files):
        (staging / leftover).unlink()
    return graph_files


def _export_decoder_only_into(
    staging: Path, src: _Source, options: ExportOptions, progress: Progress, store: bool
) -> tuple[Manifest, CheckReport | None]:
    """A decoder-only model's one graph (export/decoder_only.py), its files and manifest, checked against PyTorch
    on two prompts of different lengths and one step."""
    from .graphs import export_decoder_only

    source, arch = src.directory, src.arch
    if not options.buffered_cache:
        raise ExportError("a decoder-only model is exported with the cache buffer only (no --cache-concat)")
    progress("loading the PyTorch model")
    model = arch.load(str(source))
    # The config as transformers resolved it: TranslateGemma's config.json leaves Gemma 3's defaults out of its
    # text_config (heads, head_dim, vocab_size).
    facts = arch.facts(model.config.to_dict())
    traced = TensorFile(staging / TRACED_WEIGHTS_FILE)
    try:
        progress(f"exporting the decoder ({DECODER_FILE})")
        target = Target(staging / DECODER_FILE, facts, options.opset, traced, progress)
        export_decoder_only(arch.decoder(model, True, fused_attention=options.fused_attention), target)
    finally:
        traced.close()
    prompts = np.random.default_rng(0).integers(3, facts["vocab_size"] - 1, size=(2, 9)).astype(np.int64)
    expected = _pytorch_decoder_only(model, prompts) if options.check else None
    del model
    gc.collect()
    graph_files = _store_graphs(staging, [DECODER_FILE], store, progress)
    copied = _copy_side_files(source, staging, arch)
    generation_config = src.generation_config()
    try:
        languages = arch.languages(source, options.default_target)
    except ValueError as e:
        raise ExportError(str(e)) from e
    manifest = Manifest(
        architecture=arch.name,
        layout="onnxmt",
        files=describe_files(staging, graph_files + copied),
        graphs={"decoder": graph_spec(staging / DECODER_FILE, DECODER_FILE)},
        # Rows of other prompt lengths and cache capacities beside a row change none of its bits, given the same
        # chunks of its own prompt (tests/runtime/test_decoder_only.py): in-flight batching is exact.
        model={**facts, "decoder_only": True, "rows_bit_exact": True},
        tokens=arch.tokens(source, src.config, generation_config),
        generation=arch.generation(generation_config, src.config),
        languages=languages,
        tokenizer=arch.tokenizer_section(source, graph_files + copied, facts),
        provenance=_provenance(src, options.opset),
    )
    check = None if expected is None else lambda: check_decoder_only(expected, prompts, staging, manifest)
    return _checked(staging, manifest, "graph", check, progress)


def _checked(
    staging: Path, manifest: Manifest, what: str, check: Callable[[], CheckReport] | None, progress: Progress
) -> tuple[Manifest, CheckReport | None]:
    """`manifest` saved into `staging`, with the report of `check` (the graphs against PyTorch, unless there is
    none: export --no-check) in its provenance; ExportError when they disagree past CHECK_TOLERANCE."""
    report = None
    if check is not None:
        progress(f"checking the ONNX {what} against PyTorch")
        report = check()
        if report.worst > CHECK_TOLERANCE:
            disagree = "disagree" if what == "graphs" else "disagrees"
            raise ExportError(f"exported {what} {disagree} with PyTorch: {report} (tolerance {CHECK_TOLERANCE})")
        manifest = _with_provenance(manifest, check=report.__dict__)
    manifest.save(staging)
    return manifest, report


def _pytorch_decoder_only(model: Any, prompts: np.ndarray) -> np.ndarray:
    """PyTorch's logits at every position of each prompt, each run alone: (rows, length, vocab)."""
    import torch

    with torch.no_grad():
        return np.stack([model(input_ids=torch.from_numpy(p[None])).logits[0].float().numpy() for p in prompts])


def check_decoder_only(expected: np.ndarray, prompts: np.ndarray, directory: Path, manifest: Manifest) -> CheckReport:
    """The graph's logits against PyTorch's (`expected`): two prompts of lengths 9 and 5 prefilled in one call (each
    one's last position), then one step of both rows at once, row 1's compared (its position 5)."""
    import onnxruntime as ort

    from ..runtime.decoder_only import DecoderOnlyGraphs
    from ..runtime.options import RuntimeOptions

    so = ort.SessionOptions()
    so.add_session_config_entry("session.disable_prepacking", "1")  # as check_against_pytorch, and for its reason
    session = ort.InferenceSession(str(directory / DECODER_FILE), so, providers=["CPUExecutionProvider"])
    graphs = DecoderOnlyGraphs(directory, manifest, RuntimeOptions(threads=1, verify=False), session)
    short = 5
    logits, cache = graphs.prefill([prompts[0].tolist(), prompts[1, :short].tolist()])
    prefill_diff = max(
        float(np.abs(logits[0] - expected[0, -1]).max()), float(np.abs(logits[1] - expected[1, short - 1]).max())
    )
    step, _ = graphs.step(np.array([[prompts[0, -1]], [prompts[1, short]]], dtype=np.int64), cache)
    return CheckReport(
        encoder_max_abs_diff=None,
        first_step_logits_max_abs_diff=prefill_diff,
        cached_step_logits_max_abs_diff=float(np.abs(step[1] - expected[1, short]).max()),
    )


def write_tokenizer_json(tokenizer_class: Any, source: Path, staging: Path, family: str, needs: tuple[str, ...]) -> str:
    """`tokenizer.json` as transformers' `tokenizer_class` builds it from the source's files (its conversion of a
    sentencepiece model, or the source's own tokenizer.json), for a family whose checkpoints may ship only the
    sentencepiece model (an `Architecture.write_tokenizer` hook); `needs`: the files of which one must exist."""
    if not any((source / name).is_file() for name in needs):
        raise ExportError(f"{source}: no tokenizer; an {family} model directory needs {' or '.join(needs)}")
    try:
        tokenizer = tokenizer_class.from_pretrained(str(source))
    except Exception as e:  # sentencepiece and tokenizers raise their own types for a corrupt file
        raise ExportError(f"{source}: the {family} tokenizer does not load ({e})") from e
    with tempfile.TemporaryDirectory() as tmp:
        tokenizer.save_pretrained(tmp)
        (staging / TOKENIZER_JSON).write_bytes((Path(tmp) / TOKENIZER_JSON).read_bytes())
    return TOKENIZER_JSON


def _copy_side_files(source: Path, staging: Path, arch: Architecture) -> list[str]:
    copied = []
    for name in (*arch.tokenizer_files, *CONFIG_FILES):
        if not (source / name).is_file():
            if name == "generation_config.json":
                continue  # older checkpoints keep generation settings in config.json
            raise ExportError(
                f"{source / name}: missing; a {arch.name} model directory needs {', '.join(arch.tokenizer_files)}"
            )
        shutil.copy2(source / name, staging / name)
        copied.append(name)
    for name in arch.optional_tokenizer_files:
        if (source / name).is_file():
            shutil.copy2(source / name, staging / name)
            copied.append(name)
    return copied


def _read_json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}


def _build_manifest(
    staging: Path, src: _Source, facts: dict[str, Any], files: list[str], options: ExportOptions
) -> Manifest:
    source, arch, config = src.directory, src.arch, src.config
    generation_config = src.generation_config()
    try:
        languages = arch.languages(source, options.default_target)
    except ValueError as e:
        raise ExportError(str(e)) from e
    tokens = arch.tokens(source, config, generation_config)
    if tokens["decoder_start"] is None:
        raise ExportError("the model config has no decoder_start_token_id")
    return Manifest(
        architecture=arch.name,
        layout="onnxmt",
        files=describe_files(staging, files),
        graphs={
            "encoder": graph_spec(staging / ENCODER_FILE, ENCODER_FILE),
            "decoder": graph_spec(staging / DECODER_FILE, DECODER_FILE),
        },
        # The decoder graph broadcasts each sentence's cross-attention K/V over its beams (marian._attend_beams),
        # and gives a row the same logits, bit for bit, whatever rows and buffer capacity share its call
        # (marian._attend_buffer and _attend_beams, cache.KEY_BLOCK): in-flight batching is exact.
        model={**facts, "cross_kv_per_sentence": True, "rows_bit_exact": True},
        tokens=tokens,
        generation=arch.generation(generation_config, config),
        languages=languages,
        tokenizer=arch.tokenizer_section(source, files, facts),
        provenance=_provenance(src, options.opset),
    )


def _provenance(src: _Source, opset: int) -> dict[str, Any]:
    import onnx
    import torch
    import transformers

    return {
        "source_model": src.model_id,
        "revision": src.revision,
        "opset": opset,
        "exporter": f"onnxmt {__version__}",
        "versions": {
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "onnx": onnx.__version__,
            "python": platform.python_version(),
        },
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }


def _with_provenance(manifest: Manifest, **extra: Any) -> Manifest:
    return replace(manifest, provenance={**manifest.provenance, **extra})


@dataclass(frozen=True)
class _CheckFeed:
    """The check's inputs: a padded batch of two sentences, the decoder start, and a second token per row."""

    ids: np.ndarray
    mask: np.ndarray
    start: np.ndarray
    second_ids: np.ndarray


def _check_feed(facts: dict[str, Any], tokens: dict[str, Any]) -> _CheckFeed:
    rng = np.random.default_rng(0)
    ids = rng.integers(2, facts["vocab_size"] - 1, size=(2, 7)).astype(np.int64)
    ids[:, -1] = tokens["eos"]
    mask = np.ones_like(ids)
    mask[1, 4:] = 0
    ids[1, 4:] = tokens["pad"]
    start = np.full((2, 1), tokens["decoder_start"], dtype=np.int64)
    return _CheckFeed(ids, mask, start, np.array([[5], [6]], dtype=np.int64))


def _pytorch_outputs(model: Any, feed: _CheckFeed) -> tuple[np.ndarray, np.ndarray]:
    """PyTorch's encoder states and the logits of both decoder steps, for the check after the model is gone."""
    import torch

    with torch.no_grad():
        t_ids, t_mask = torch.from_numpy(feed.ids), torch.from_numpy(feed.mask)
        states = model.get_encoder()(input_ids=t_ids, attention_mask=t_mask).last_hidden_state.numpy()
        decoder_ids = torch.from_numpy(np.concatenate([feed.start, feed.second_ids], axis=1))
        logits = model(input_ids=t_ids, attention_mask=t_mask, decoder_input_ids=decoder_ids).logits.numpy()
    return states.copy(), logits.copy()


def check_against_pytorch(
    expected: tuple[np.ndarray, np.ndarray], feed: _CheckFeed, directory: Path, manifest: Manifest
) -> CheckReport:
    """Encoder states, first-step logits and one cached step of the ONNX graphs against PyTorch's (`expected`,
    from `_pytorch_outputs`), on a padded batch. One graph is loaded at a time (NLLB-200-3.3B's decoder alone is
    7 GB in fp32). ONNX Runtime does not prepack the weights here: a prepacked MatMul holds a packed copy beside the
    mapped weights (an unchunked head, as `export --quantize` checks it, would be twice its 1 GB at NLLB's
    vocabulary), for a check that runs each graph once."""
    import onnxruntime as ort

    layers, heads, head_dim = (manifest.model[k] for k in ("num_layers", "num_heads", "head_dim"))
    rng = np.random.default_rng(1)
    ids, mask = feed.ids, feed.mask
    so = ort.SessionOptions()
    so.add_session_config_entry("session.disable_prepacking", "1")  # same results, another kernel path than serving's
    encoder = ort.InferenceSession(str(directory / ENCODER_FILE), so, providers=["CPUExecutionProvider"])
    encoded = encoder.run(None, {"input_ids": ids, "attention_mask": mask})
    del encoder
    decoder = ort.InferenceSession(str(directory / DECODER_FILE), so, providers=["CPUExecutionProvider"])
    run: dict[str, np.ndarray] = {"input_ids": feed.start, "encoder_attention_mask": mask}
    buffered = manifest.graphs["decoder"].has_input("past_length")
    # A buffer's spare positions hold junk here, so that the check also proves they are masked out.
    size = (2, heads, 4 if buffered else 0, head_dim)
    past = [(rng.standard_normal(size) * 100).astype(np.float32) for _ in cache_names("past", layers)]
    run.update(zip(cache_names("past", layers), past, strict=True))
    run.update(dict(zip(cache_names("cross", layers), encoded[1:], strict=True)))
    if buffered:
        run["past_length"] = np.zeros(2, dtype=np.int64)
    first = decoder.run(None, run)
    run["input_ids"] = feed.second_ids
    if buffered:  # the new key/value go into the buffers, at position 0
        for buffer, new in zip(past, first[1:], strict=True):
            buffer[:, :, :1] = new
        run["past_length"] = np.ones(2, dtype=np.int64)
    else:
        run.update(zip(cache_names("past", layers), first[1:], strict=True))
    second = decoder.run(None, run)
    states, logits = expected
    valid = mask.astype(bool)  # padded encoder positions carry no meaning
    return CheckReport(
        encoder_max_abs_diff=float(np.abs(encoded[0] - states)[valid].max()),
        first_step_logits_max_abs_diff=float(np.abs(first[0] - logits[:, 0]).max()),
        cached_step_logits_max_abs_diff=float(np.abs(second[0] - logits[:, 1]).max()),
    )
