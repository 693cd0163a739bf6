"""The model directory contract: fixed file names and the `onnxmt.json` manifest.

The manifest is written by `onnxmt export` (build side) and read by the runtime (run side). It is the only thing
the two halves share, so this module imports neither torch nor onnxruntime.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

# 2: the generation section holds every honoured field (renormalize_logits, forced_bos_token_id were added).
FORMAT_VERSION = 2
MANIFEST_NAME = "onnxmt.json"
ENCODER_FILE = "encoder.onnx"
DECODER_FILE = "decoder.onnx"
# Weights that encoder and decoder both use (the tied embedding), stored once as ONNX external data.
WEIGHTS_FILE = "weights.bin"  # the graphs' large and shared tensors (export/weights.py)
CONFIG_FILES = ("config.json", "generation_config.json")
MARIAN_TOKENIZER_FILES = ("source.spm", "target.spm", "vocab.json", "tokenizer_config.json")
OPTIONAL_TOKENIZER_FILES = ("target_vocab.json", "special_tokens_map.json")

# Generation settings copied from generation_config.json into the manifest: the fields that change scores or the
# search and that the decoding loop honours (docs/decoding.md lists every GenerationConfig field).
GENERATION_KEYS = (
    "num_beams",
    "max_length",
    "max_new_tokens",
    "min_length",
    "min_new_tokens",
    "length_penalty",
    "early_stopping",
    "no_repeat_ngram_size",
    "repetition_penalty",
    "num_return_sequences",
    "forced_bos_token_id",
    "forced_eos_token_id",
    "bad_words_ids",
    "suppress_tokens",
    "begin_suppress_tokens",
    "renormalize_logits",
)
# Fields that would change the output but that onnxmt does not implement, with the value(s) at which they are
# inactive. A config that sets one to anything else is refused at export and load, never silently ignored.
REFUSED_GENERATION = {
    "do_sample": (False,),
    "num_beam_groups": (1,),
    "diversity_penalty": (0.0,),
    "penalty_alpha": (),
    "guidance_scale": (1.0,),
    "sequence_bias": (),
    "encoder_repetition_penalty": (1.0,),
    "encoder_no_repeat_ngram_size": (0,),
    "exponential_decay_length_penalty": (),
    "remove_invalid_values": (False,),
    "constraints": (),
    "force_words_ids": (),
    "forced_decoder_ids": (),
    "max_time": (),
    "stop_strings": (),
    "dola_layers": (),
    "token_healing": (False,),
    "watermarking_config": (),
}


class ModelDirError(ValueError):
    """A model directory is missing, incomplete or corrupted; the message names the file."""


@dataclass(frozen=True)
class TensorSpec:
    """One graph input or output: its name in the graph, its role for the runtime, dtype and symbolic shape."""

    name: str
    role: str
    dtype: str
    shape: list[str | int]


@dataclass(frozen=True)
class GraphSpec:
    file: str
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]

    def input_name(self, role: str) -> str:
        return _by_role(self.inputs, role, self.file).name

    def output_name(self, role: str) -> str:
        return _by_role(self.outputs, role, self.file).name

    def has_input(self, role: str) -> bool:
        return any(t.role == role for t in self.inputs)

    def has_output(self, role: str) -> bool:
        return any(t.role == role for t in self.outputs)


def _by_role(specs: list[TensorSpec], role: str, file: str) -> TensorSpec:
    for spec in specs:
        if spec.role == role:
            return spec
    raise ModelDirError(f"{file}: no tensor with role {role!r} (has {[s.role for s in specs]})")


@dataclass(frozen=True)
class Manifest:
    """Everything the runtime needs to know about a model directory, read from `onnxmt.json`."""

    architecture: str
    layout: str  # "onnxmt" (encoder.onnx + decoder.onnx) or "optimum-*"
    files: dict[str, dict[str, Any]]  # file name -> {"sha256": ..., "bytes": ...}
    graphs: dict[str, GraphSpec]  # "encoder", "decoder", optionally "decoder_with_past"
    model: dict[str, Any]  # num_layers, num_heads, head_dim, d_model, vocab_size, max_positions
    tokens: dict[str, Any]  # decoder_start, eos, pad, unk
    generation: dict[str, Any]  # generation defaults from generation_config.json
    languages: dict[str, Any]  # source, target, target_tokens {lang: token}, default_target
    tokenizer: dict[str, Any]  # kind, files, model_max_length, separate_vocabs
    provenance: dict[str, Any] = field(default_factory=dict)
    quantization: dict[str, Any] | None = None
    format_version: int = FORMAT_VERSION

    def to_json(self) -> str:
        data = {"format": "onnxmt", **asdict(self)}
        return json.dumps(data, indent=2, ensure_ascii=False) + "\n"

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Manifest:
        version = data.get("format_version")
        if version != FORMAT_VERSION:
            raise ModelDirError(
                f"{MANIFEST_NAME}: format_version {version!r} is not supported (expected {FORMAT_VERSION})"
            )
        graphs = {
            key: GraphSpec(
                file=g["file"],
                inputs=[TensorSpec(**t) for t in g["inputs"]],
                outputs=[TensorSpec(**t) for t in g["outputs"]],
            )
            for key, g in data["graphs"].items()
        }
        fields = {k: v for k, v in data.items() if k not in ("format", "graphs")}
        return cls(graphs=graphs, **fields)

    def save(self, directory: Path) -> Path:
        path = Path(directory) / MANIFEST_NAME
        path.write_text(self.to_json(), encoding="utf-8")
        return path


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def describe_files(directory: Path, names: list[str]) -> dict[str, dict[str, Any]]:
    """sha256 and size of each named file, for the manifest."""
    directory = Path(directory)
    return {
        name: {"sha256": sha256_file(directory / name), "bytes": (directory / name).stat().st_size} for name in names
    }


def read_manifest(directory: str | Path) -> Manifest:
    """Read `onnxmt.json` from a model directory; a clear ModelDirError when it is missing or malformed."""
    directory = Path(directory)
    if not directory.is_dir():
        raise ModelDirError(f"model directory not found: {directory}")
    path = directory / MANIFEST_NAME
    if not path.is_file():
        raise ModelDirError(f"{path}: no {MANIFEST_NAME} in this directory")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if isinstance(data, dict) and data.get("format_version") == 1:
            data = _upgrade_v1(directory, data)
        return Manifest.from_dict(data)
    except (json.JSONDecodeError, KeyError, TypeError) as e:
        raise ModelDirError(f"{path}: malformed manifest ({e.__class__.__name__}: {e})") from e


def _upgrade_v1(directory: Path, data: dict[str, Any]) -> dict[str, Any]:
    """Version 1 copied fewer generation fields (no renormalize_logits): they are read again from the
    generation_config.json and config.json that every export keeps beside the manifest."""

    def side(name: str) -> dict[str, Any]:
        path = directory / name
        return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}

    return {
        **data,
        "generation": generation_defaults(side("generation_config.json"), side("config.json")),
        "format_version": FORMAT_VERSION,
    }


def verify_files(directory: str | Path, manifest: Manifest, *, check_hash: bool = True) -> None:
    """Check every file the manifest lists: present, the recorded size, and (optionally) the recorded sha256."""
    directory = Path(directory)
    for name, info in manifest.files.items():
        path = directory / name
        if not path.is_file():
            raise ModelDirError(f"{path}: file listed in {MANIFEST_NAME} is missing")
        size = path.stat().st_size
        if "bytes" in info and size != info["bytes"]:
            raise ModelDirError(f"{path}: {size} bytes, the manifest says {info['bytes']} (truncated or replaced?)")
        if check_hash and "sha256" in info and sha256_file(path) != info["sha256"]:
            raise ModelDirError(f"{path}: sha256 does not match the manifest (the file is corrupted or was changed)")


def model_facts(config: dict[str, Any]) -> dict[str, Any]:
    """The sizes the runtime needs, from a Marian/BART-style config.json."""
    heads = config["decoder_attention_heads"]
    return {
        "d_model": config["d_model"],
        "encoder_layers": config["encoder_layers"],
        "num_layers": config["decoder_layers"],
        "num_heads": heads,
        "head_dim": config["d_model"] // heads,
        "vocab_size": config.get("decoder_vocab_size") or config["vocab_size"],
        "max_positions": config["max_position_embeddings"],
    }


def special_tokens(config: dict[str, Any], generation_config: dict[str, Any], unk: int | None) -> dict[str, Any]:
    """Decoder start, eos (one or several) and pad ids as transformers resolves them: generation config first."""

    def pick(key: str) -> Any:
        value = generation_config.get(key)
        return config.get(key) if value is None else value

    eos = pick("eos_token_id")
    return {
        "decoder_start": pick("decoder_start_token_id"),
        "eos": eos[0] if isinstance(eos, list) else eos,
        "eos_ids": eos if isinstance(eos, list) else [eos],
        "pad": pick("pad_token_id"),
        "unk": unk,
    }


def refused_generation_fields(generation_config: dict[str, Any]) -> list[str]:
    """`field=value` for each field of `generation_config` that changes the output and that onnxmt cannot honour.
    None and the inactive values pass; so do the sampling knobs (temperature, top_k, ...) while do_sample is off,
    as transformers ignores them then."""
    return [
        f"{key}={generation_config[key]!r}"
        for key, inactive in REFUSED_GENERATION.items()
        if generation_config.get(key) is not None and generation_config[key] not in inactive
    ]


def check_generation_config(generation_config: dict[str, Any], where: str) -> None:
    refused = refused_generation_fields(generation_config)
    if refused:
        raise ModelDirError(
            f"{where}: generation setting(s) onnxmt does not implement: {', '.join(refused)}; onnxmt decodes with "
            "greedy or beam search (docs/decoding.md lists what is honoured). Remove them from "
            "generation_config.json (or set them to their defaults) to decode without them."
        )


def generation_defaults(generation_config: dict[str, Any], config: dict[str, Any]) -> dict[str, Any]:
    """Generation defaults as transformers resolves them: generation_config.json first, then config.json. Settings
    onnxmt cannot honour raise ModelDirError."""
    check_generation_config(generation_config, "generation_config.json")
    out: dict[str, Any] = {}
    for key in GENERATION_KEYS:
        if key in generation_config and generation_config[key] is not None:
            out[key] = generation_config[key]
        elif key in config and config[key] is not None:
            out[key] = config[key]
    return out
