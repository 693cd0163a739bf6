"""The model directory contract: fixed file names and the `onnxmt.json` manifest.

The manifest is written by `onnxmt export` (build side) and read by the runtime (run side). It is the only thing
the two halves share, so this module imports neither torch nor onnxruntime.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import MISSING, asdict, dataclass, field
from dataclasses import fields as dataclass_fields
from pathlib import Path, PurePosixPath
from typing import Any

# 2: the generation section holds every honoured field (renormalize_logits, forced_bos_token_id were added).
# 3: the languages section names its scheme (onnxmt.architectures.schemes) and may hold source-language tokens;
# the tokenizer section's kind is read (a kind the families register, architectures/). Versions 1 and 2 still load.
# 4: a buffered decoder's `past_length` is one length per row, (rows,): rows of different lengths share a decoder
# call (in-flight batching). Versions 1 to 3 still load; their decoders take one length for all rows
# (`GraphSpec.per_row_positions`), so they run static batches.
FORMAT_VERSION = 4
MANIFEST_NAME = "onnxmt.json"
ENCODER_FILE = "encoder.onnx"
DECODER_FILE = "decoder.onnx"
# Weights that encoder and decoder both use (the tied embedding), stored once as ONNX external data.
WEIGHTS_FILE = "weights.bin"  # the graphs' large and shared tensors (export/weights.py)
CONFIG_FILES = ("config.json", "generation_config.json")

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

    def per_row_positions(self) -> bool:
        """A decoder with a cache buffer whose rows each have their own length (`past_length` (rows,)): rows of
        different lengths share one call. Buffered decoders exported before format 4 take one length, (1,)."""
        return self.has_input("past_length") and _by_role(self.inputs, "past_length", self.file).shape != [1]


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
    # scheme, source, target, target_tokens {lang: token}, default_target; for the language_tokens scheme also
    # source_tokens {lang: token}, default_source, source_token_last, eos_token
    languages: dict[str, Any]
    tokenizer: dict[str, Any]  # kind, files, model_max_length (Marian: separate_vocabs)
    provenance: dict[str, Any] = field(default_factory=dict)
    quantization: dict[str, Any] | None = None
    format_version: int = FORMAT_VERSION

    def to_json(self) -> str:
        data = {"format": "onnxmt", **asdict(self)}
        return json.dumps(data, indent=2, ensure_ascii=False) + "\n"

    @classmethod
    def from_dict(cls, data: Any) -> Manifest:
        """A manifest from parsed `onnxmt.json`; ModelDirError naming the first field that is wrong: a type, a file
        name that leaves the directory (absolute or with `..`), a token id outside the vocabulary."""
        if not isinstance(data, dict):
            raise ModelDirError(f"{MANIFEST_NAME}: expected a JSON object, got {_json_type(data)}")
        version = data.get("format_version")
        if version != FORMAT_VERSION:
            raise ModelDirError(
                f"{MANIFEST_NAME}: format_version {version!r} is not supported (this onnxmt reads 1 to "
                f"{FORMAT_VERSION}); export the model again with this onnxmt, or install the onnxmt that wrote it"
            )
        _check_manifest_fields(data, {f.name: f for f in dataclass_fields(cls)})
        graphs = {
            key: GraphSpec(
                file=g["file"],
                inputs=[TensorSpec(**t) for t in g["inputs"]],
                outputs=[TensorSpec(**t) for t in g["outputs"]],
            )
            for key, g in data["graphs"].items()
        }
        fields = {k: v for k, v in data.items() if k not in ("format", "graphs")}
        manifest = cls(graphs=graphs, **fields)
        for name in manifest.referenced_files():
            _check_file_name(name)
        _check_token_ids(manifest)
        return manifest

    def referenced_files(self) -> list[str]:
        """Every file name the manifest makes the runtime open: listed files, graphs, tokenizer files."""
        names = [*self.files, *(g.file for g in self.graphs.values()), *self.tokenizer.get("files", [])]
        return list(dict.fromkeys(names))

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
    """Read `onnxmt.json` from a model directory; a clear ModelDirError when it is missing or malformed, or when it
    names a file outside the directory (also through a symlink)."""
    directory = Path(directory)
    if not directory.is_dir():
        raise ModelDirError(f"model directory not found: {directory}")
    path = directory / MANIFEST_NAME
    if not path.is_file():
        raise ModelDirError(f"{path}: no {MANIFEST_NAME} in this directory")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as e:  # JSONDecodeError is a ValueError
        raise ModelDirError(f"{path}: malformed manifest ({e.__class__.__name__}: {e})") from e
    try:
        if isinstance(data, dict) and data.get("format_version") == 1:
            data = _upgrade_v1(directory, data)
        if isinstance(data, dict) and data.get("format_version") in (2, 3):
            # Version 2 directories name no language scheme and no tokenizer kind: the defaults apply (the legacy
            # family's, architectures/). Versions 2 and 3: the decoder's graph says its form (per_row_positions).
            data = {**data, "format_version": FORMAT_VERSION}
        manifest = Manifest.from_dict(data)
    except ModelDirError as e:
        raise ModelDirError(f"{directory}/{e}") from e
    except (KeyError, TypeError) as e:
        raise ModelDirError(f"{path}: malformed manifest ({e.__class__.__name__}: {e})") from e
    for name in manifest.referenced_files():
        _check_inside(directory, name)
    return manifest


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
    """Check every file the manifest lists: inside the directory, present, the recorded size, and (optionally) the
    recorded sha256."""
    directory = Path(directory)
    paths = {name: _check_inside(directory, name) for name in manifest.files}  # all of them before opening any
    for name, info in manifest.files.items():
        path = paths[name]
        if not path.is_file():
            raise ModelDirError(f"{path}: file listed in {MANIFEST_NAME} is missing")
        size = path.stat().st_size
        if "bytes" in info and size != info["bytes"]:
            raise ModelDirError(f"{path}: {size} bytes, the manifest says {info['bytes']} (truncated or replaced?)")
        if check_hash and "sha256" in info and sha256_file(path) != info["sha256"]:
            raise ModelDirError(f"{path}: sha256 does not match the manifest (the file is corrupted or was changed)")


# Manifest checks (read_manifest, Manifest.from_dict, verify_files). A manifest is data from disk: whatever it holds
# must fail here with one line that names the field, not later as a traceback or as a file opened elsewhere.

_JSON_TYPES = {dict: "an object", list: "an array", str: "a string", int: "an integer", float: "a number"}
_INT = (int,)
_NUMBER = (int, float)
_OPTIONAL_INT = (int, type(None))
# Sections that must be objects, and the types of the entries the runtime reads from them (absent is fine unless
# listed in _REQUIRED).
_SECTIONS = ("files", "graphs", "model", "tokens", "generation", "languages", "tokenizer", "provenance")
_ENTRY_TYPES: dict[str, dict[str, tuple[type, ...]]] = {
    "model": {
        k: _INT
        for k in ("d_model", "encoder_layers", "num_layers", "num_heads", "head_dim", "vocab_size", "max_positions")
    },
    "tokens": {"decoder_start": _INT, "eos": _INT, "eos_ids": (list,), "pad": _OPTIONAL_INT, "unk": _OPTIONAL_INT},
    "generation": {
        **{
            k: _OPTIONAL_INT
            for k in (
                "num_beams",
                "max_length",
                "max_new_tokens",
                "min_length",
                "min_new_tokens",
                "no_repeat_ngram_size",
                "num_return_sequences",
            )
        },
        "length_penalty": (*_NUMBER, type(None)),
        "repetition_penalty": (*_NUMBER, type(None)),
        "early_stopping": (bool, str, type(None)),
        "forced_eos_token_id": (int, list, type(None)),
        "forced_bos_token_id": (int, type(None)),
        "renormalize_logits": (bool, type(None)),
        "bad_words_ids": (list, type(None)),
        "suppress_tokens": (list, type(None)),
        "begin_suppress_tokens": (list, type(None)),
    },
    "languages": {
        "scheme": (str,),
        "target_tokens": (dict,),
        "source_tokens": (dict,),
        "default_target": (str, type(None)),
        "default_source": (str, type(None)),
        "source_token_last": (bool,),
        "eos_token": (str,),
    },
    "tokenizer": {"kind": (str,), "files": (list,)},
}
_REQUIRED = {
    "model": ("num_layers", "num_heads", "head_dim", "vocab_size", "max_positions"),
    "tokens": ("decoder_start", "eos"),
}


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    return next((name for t, name in _JSON_TYPES.items() if isinstance(value, t)), type(value).__name__)


def _expect(value: Any, types: tuple[type, ...], where: str) -> None:
    # JSON true/false are bools, which Python also counts as ints: an id or a size must not be `true`.
    ok = isinstance(value, types) and not (isinstance(value, bool) and bool not in types)
    if not ok:
        wanted = " or ".join(dict.fromkeys(_json_type(t()) if t is not type(None) else "null" for t in types))
        raise ModelDirError(f"{MANIFEST_NAME}: {where} should be {wanted}, got {_json_type(value)} ({value!r:.60})")


def _check_manifest_fields(data: dict[str, Any], known: dict[str, Any]) -> None:
    """Top-level fields, sections and graph specs have the types the runtime reads them as."""
    unknown = sorted(set(data) - set(known) - {"format"})
    if unknown:
        raise ModelDirError(f"{MANIFEST_NAME}: unknown field(s) {unknown}")
    missing = [k for k, f in known.items() if k not in data and f.default is MISSING and f.default_factory is MISSING]
    if missing:
        raise ModelDirError(f"{MANIFEST_NAME}: missing field(s) {missing}")
    for key in ("architecture", "layout"):
        _expect(data[key], (str,), key)
    _expect(data.get("quantization"), (dict, type(None)), "quantization")
    for section in _SECTIONS:
        if section in data:
            _expect(data[section], (dict,), section)
    for section, types in _ENTRY_TYPES.items():
        values = data.get(section, {})
        for key in _REQUIRED.get(section, ()):
            if key not in values:
                raise ModelDirError(f"{MANIFEST_NAME}: {section}.{key} is missing")
        for key, wanted in types.items():
            if key in values:
                _expect(values[key], wanted, f"{section}.{key}")
    for name, info in data["files"].items():
        _expect(info, (dict,), f"files[{name!r}]")
        for key, wanted in (("bytes", _INT), ("sha256", (str,))):
            if key in info:
                _expect(info[key], wanted, f"files[{name!r}].{key}")
    for part, graph in data["graphs"].items():
        _check_graph(graph, f"graphs.{part}")
    for i, name in enumerate(data["tokenizer"].get("files", [])):
        _expect(name, (str,), f"tokenizer.files[{i}]")
    for section in ("target_tokens", "source_tokens"):
        for lang, token in data["languages"].get(section, {}).items():
            _expect(token, (str,), f"languages.{section}[{lang!r}]")


def _check_graph(graph: Any, where: str) -> None:
    _expect(graph, (dict,), where)
    for key, wanted in (("file", (str,)), ("inputs", (list,)), ("outputs", (list,))):
        if key not in graph:
            raise ModelDirError(f"{MANIFEST_NAME}: {where}.{key} is missing")
        _expect(graph[key], wanted, f"{where}.{key}")
    for side in ("inputs", "outputs"):
        for i, spec in enumerate(graph[side]):
            at = f"{where}.{side}[{i}]"
            _expect(spec, (dict,), at)
            if sorted(spec) != ["dtype", "name", "role", "shape"]:
                raise ModelDirError(f"{MANIFEST_NAME}: {at} should have exactly name, role, dtype, shape")
            for key in ("name", "role", "dtype"):
                _expect(spec[key], (str,), f"{at}.{key}")
            _expect(spec["shape"], (list,), f"{at}.shape")
            for dim in spec["shape"]:
                _expect(dim, (int, str), f"{at}.shape")


def _check_file_name(name: str) -> None:
    """A relative path that stays in the directory on any OS: no absolute path, drive, `..` or backslash."""
    pure = PurePosixPath(name)
    if not name or pure.is_absolute() or ".." in pure.parts or "\\" in name or ":" in name:
        raise ModelDirError(f"{MANIFEST_NAME}: file name {name!r} points outside the model directory; refused")


def model_root(directory: Path) -> Path:
    """The folder a model directory's files must resolve into: the directory itself; for a snapshot in the Hugging
    Face hub's cache (`models--ORG--NAME/snapshots/REVISION`, whose files are links to `../../blobs/`), its
    model's folder in the cache."""
    resolved = directory.resolve()
    if resolved.parent.name == "snapshots" and resolved.parent.parent.name.startswith("models--"):
        return resolved.parent.parent
    return resolved


def _check_inside(directory: Path, name: str) -> Path:
    """`directory / name`, refused when it resolves (following symlinks) outside `directory` (model_root)."""
    _check_file_name(name)
    path = directory / name
    if not path.resolve().is_relative_to(model_root(directory)):
        raise ModelDirError(f"{path}: resolves outside the model directory (a symlink?); refused")
    return path


def _check_token_ids(manifest: Manifest) -> None:
    """Every special and generation token id is in [0, vocab_size)."""
    vocab = manifest.model["vocab_size"]
    if vocab < 1:
        raise ModelDirError(f"{MANIFEST_NAME}: model.vocab_size must be positive, got {vocab}")
    tokens, gen = manifest.tokens, manifest.generation

    def each(where: str, values: Any) -> list[tuple[str, Any]]:
        _expect(values, (list, type(None)), where)
        return [(f"{where}[{i}]", t) for i, t in enumerate(values or [])]

    ids: list[tuple[str, Any]] = [(f"tokens.{k}", tokens.get(k)) for k in ("decoder_start", "eos", "pad", "unk")]
    ids += each("tokens.eos_ids", tokens.get("eos_ids"))
    forced = gen.get("forced_eos_token_id")  # one id or several
    ids += (
        each("generation.forced_eos_token_id", forced)
        if isinstance(forced, list)
        else [("generation.forced_eos_token_id", forced)]
    )
    ids.append(("generation.forced_bos_token_id", gen.get("forced_bos_token_id")))
    ids += each("generation.suppress_tokens", gen.get("suppress_tokens"))
    ids += each("generation.begin_suppress_tokens", gen.get("begin_suppress_tokens"))
    for where, word in each("generation.bad_words_ids", gen.get("bad_words_ids")):
        ids += each(where, word)
    for where, token in ids:
        if token is None:
            continue
        _expect(token, _INT, where)
        if not 0 <= token < vocab:
            raise ModelDirError(f"{MANIFEST_NAME}: {where} = {token} is outside the vocabulary [0, {vocab})")


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
