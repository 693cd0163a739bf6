"""Graph tensor names and their roles, for onnxmt's own layout and for Optimum's.

Roles are what the runtime asks for ("past_key.3", "logits"); names are what a graph calls them. onnxmt's export
names tensors by role; Optimum names them `past_key_values.3.decoder.key` and so on. This is the one place that
knows both, so the runtime never matches names by substring.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from .manifest import DECODER_FILE, ENCODER_FILE, MANIFEST_NAME, ModelDirError

_FIXED_ROLES = {
    "input_ids": "input_ids",
    "attention_mask": "attention_mask",
    "encoder_attention_mask": "encoder_attention_mask",
    "encoder_hidden_states": "encoder_hidden_states",
    "last_hidden_state": "encoder_hidden_states",
    "logits": "logits",
    "use_cache_branch": "use_cache_branch",
    "past_length": "past_length",
    "input_length": "input_length",  # a decoder-only graph's own positions per row (export/decoder_only.py)
}
_ONNXMT_CACHE = re.compile(
    r"^(past_key|past_value|present_key|present_value|new_key|new_value|cross_key|cross_value)\.(\d+)$"
)
# Optimum: decoder-side cache is the self-attention cache, encoder-side is the cross-attention K/V.
_OPTIMUM_CACHE = re.compile(r"^(past_key_values|present)\.(\d+)\.(decoder|encoder)\.(key|value)$")

# Optimum's file names without `.onnx`, by part. Transformers.js / onnx-community repositories keep them, under
# `onnx/`, and name each variant by a suffix (its scripts/quantize.py): `encoder_model_quantized.onnx`.
OPTIMUM_STEMS = {
    "encoder": "encoder_model",
    "decoder": "decoder_model",
    "decoder_with_past": "decoder_with_past_model",
    "decoder_merged": "decoder_model_merged",
}
VARIANT_SUFFIXES = {
    "fp32": "",
    "quantized": "_quantized",  # Transformers.js's dtype "q8": dynamic 8-bit, int8 weights unless the model has Conv
    "int8": "_int8",
    "uint8": "_uint8",
    "q4": "_q4",  # MatMulNBits, 4-bit weights in blocks
    "bnb4": "_bnb4",  # MatMulBnb4 (NF4 or FP4)
    "fp16": "_fp16",
    "q4f16": "_q4f16",  # q4, then the rest in fp16
}
VARIANT_ALIASES = {"q8": "quantized"}  # Transformers.js's dtype names
# The variant loaded when none is asked for: the first complete one in this order. Full precision first (the one
# that is token-identical to transformers); then the 8-bit ones, close to it and the fastest on CPU; then the 4-bit
# weight-only ones; fp16 last, because CPUs have few fp16 kernels: ONNX Runtime casts to fp32 around the others,
# which is slower than fp32 and no more accurate.
DEFAULT_VARIANT_ORDER = ("fp32", "quantized", "int8", "uint8", "q4", "bnb4", "fp16", "q4f16")
# What a Transformers.js variant holds, for manifests written from its file names (inspect reads the graphs).
VARIANT_METHODS = {
    "quantized": "dynamic 8-bit (Transformers.js q8)",
    "int8": "dynamic int8",
    "uint8": "dynamic uint8",
    "q4": "weight-only int4 (MatMulNBits)",
    "bnb4": "weight-only 4-bit (MatMulBnb4)",
    "fp16": "fp16",
    "q4f16": "weight-only int4 (MatMulNBits), fp16",
}
# onnxmt's own directories hold one variant; `onnxmt quantize` records which (manifest "quantization.method").
ONNXMT_VARIANTS = {None: "fp32", "dynamic int8": "int8", "weight-only int4": "q4"}
PYTORCH_WEIGHTS = (
    "model.safetensors",
    "pytorch_model.bin",
    "model.safetensors.index.json",
    "pytorch_model.bin.index.json",
)
NEED_GRAPHS = (
    f"{MANIFEST_NAME} with {ENCODER_FILE} and {DECODER_FILE} (onnxmt export), or encoder_model*.onnx with "
    "decoder_model_merged*.onnx or decoder_model*.onnx + decoder_with_past_model*.onnx of one variant, at the top "
    "or in onnx/ (Optimum, Transformers.js)"
)


def role_of(name: str) -> str:
    """The runtime role of a graph tensor name; ValueError for a name neither layout uses."""
    if name in _FIXED_ROLES:
        return _FIXED_ROLES[name]
    if _ONNXMT_CACHE.match(name):
        return name
    match = _OPTIMUM_CACHE.match(name)
    if match:
        kind, layer, side, kv = match.groups()
        if side == "encoder":
            return f"cross_{kv}.{layer}"
        return f"{'past' if kind == 'past_key_values' else 'present'}_{kv}.{layer}"
    raise ValueError(f"unrecognised graph tensor name {name!r}")


def canonical_variant(variant: str) -> str:
    """A variant name as this module spells it ("q8" is "quantized"); ValueError naming the valid ones."""
    name = VARIANT_ALIASES.get(variant, variant)
    if name not in VARIANT_SUFFIXES:
        valid = ", ".join([*VARIANT_SUFFIXES, *VARIANT_ALIASES])
        raise ValueError(f"unknown variant {variant!r}; valid: {valid}")
    return name


def find_variants(directory: Path) -> dict[str, dict[str, str]]:
    """Optimum-layout graphs in `directory` or its `onnx/` subfolder: variant -> part -> path relative to
    `directory` (the top level wins over `onnx/`); empty when there are none."""
    found: dict[str, dict[str, str]] = {}
    for sub in ("", "onnx"):
        base = directory / sub if sub else directory
        if not base.is_dir():
            continue
        for variant, suffix in VARIANT_SUFFIXES.items():
            for part, stem in OPTIMUM_STEMS.items():
                name = f"{stem}{suffix}.onnx"
                if (base / name).is_file():
                    found.setdefault(variant, {}).setdefault(part, f"{sub}/{name}" if sub else name)
    return found


def is_complete(parts: dict[str, str]) -> bool:
    """An encoder, and a merged decoder or the two decoders."""
    return "encoder" in parts and ("decoder_merged" in parts or {"decoder", "decoder_with_past"} <= set(parts))


def select_variant(directory: Path, variant: str | None = None) -> tuple[str, dict[str, str]]:
    """The variant to load and its graphs by part; ModelDirError naming the variants present when `variant` is not
    one of them (or, with None, when none is complete).

    Encoder and decoder always come from the same variant: a repository that publishes an encoder variant without
    the matching decoder (Transformers.js repositories sometimes do) has that variant listed as incomplete, never
    mixed with another variant's decoder, whose numerics it was not converted with.
    """
    variants = find_variants(directory)
    complete = [v for v in DEFAULT_VARIANT_ORDER if v in variants and is_complete(variants[v])]
    if variant is None:
        if not complete:
            raise ModelDirError(diagnose(directory))
        return complete[0], variants[complete[0]]
    name = canonical_variant(variant)
    if name not in complete:
        raise ModelDirError(f"{directory}: no complete {name!r} variant; {describe_variants(variants)}")
    return name, variants[name]


def describe_variants(variants: dict[str, dict[str, str]]) -> str:
    """`variants present: fp32, quantized; incomplete: fp16 (encoder only)`, for error messages."""
    complete = [v for v in DEFAULT_VARIANT_ORDER if v in variants and is_complete(variants[v])]
    partial = [
        f"{v} ({'+'.join(variants[v])} only)" for v in DEFAULT_VARIANT_ORDER if v in variants and v not in complete
    ]
    text = f"variants present: {', '.join(complete) or 'none'}"
    return text + (f"; incomplete: {', '.join(partial)}" if partial else "")


def has_pytorch_weights(directory: Path) -> list[str]:
    """The PyTorch weight files in `directory` (those `onnxmt export` reads), if any."""
    names = [n for n in PYTORCH_WEIGHTS if (directory / n).is_file()]
    return names or sorted(p.name for p in directory.glob("*.safetensors"))


def diagnose(directory: Path) -> str:
    """Why `directory` cannot be loaded, in one line: what it holds and what is missing."""
    if not directory.is_dir():
        return f"model directory not found: {directory}"
    onnxmt_graphs = [n for n in (ENCODER_FILE, DECODER_FILE) if (directory / n).is_file()]
    if len(onnxmt_graphs) == 2 and not (directory / MANIFEST_NAME).is_file():
        return (
            f"{directory}: {MANIFEST_NAME} is missing; the directory holds onnxmt's {ENCODER_FILE} and {DECODER_FILE} "
            f"but the runtime reads their names from the manifest: export the model again with `onnxmt export`"
        )
    variants = find_variants(directory)
    if variants:
        return (
            f"{directory}: incomplete Optimum/Transformers.js export, {describe_variants(variants)}; need {NEED_GRAPHS}"
        )
    weights = has_pytorch_weights(directory)
    if weights:
        return (
            f"{directory} is a PyTorch model directory ({', '.join(weights)}), not an exported one; "
            f"run `onnxmt export {directory} OUT_DIR` first"
        )
    return f"{directory}: incomplete model directory: found {_listing(directory)}; need {NEED_GRAPHS}"


def _listing(directory: Path, most: int = 8) -> str:
    names = sorted(p.name for p in directory.iterdir() if p.name != "onnx")
    onnx = directory / "onnx"
    if onnx.is_dir():
        names += sorted(f"onnx/{p.name}" for p in onnx.iterdir())
    if not names:
        return "nothing (an empty directory)"
    more = f" and {len(names) - most} more" if len(names) > most else ""
    return ", ".join(names[:most]) + more


def onnxmt_variant(quantization: dict[str, Any] | None) -> str:
    """The variant name of an onnxmt directory, from its manifest's quantization record."""
    method = None if quantization is None else quantization.get("method")
    return ONNXMT_VARIANTS.get(method, str(method))
