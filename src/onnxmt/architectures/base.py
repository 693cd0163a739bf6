"""The registry and the base class of architectures."""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..extras import missing_extra

_REGISTRY: dict[str, type[Architecture]] = {}
# The manifest's tokenizer.kind -> the family (or variant) whose tokenizer that is.
_TOKENIZER_KINDS: dict[str, type[Architecture]] = {}
# The family of manifests before format 3, which name no tokenizer kind (all were exported from it).
_LEGACY: list[str] = []
# What a family is given to translate at a time (`Architecture.text_unit`; docs/decoder-only.md).
SENTENCE, PARAGRAPH = "sentence", "paragraph"
TEXT_UNITS = (SENTENCE, PARAGRAPH)


def register(
    model_type: str, *, variants: tuple[type[Architecture], ...] = (), legacy: bool = False
) -> Callable[[type[Architecture]], type[Architecture]]:
    """Class decorator: `@register("marian")` makes the class the architecture of configs of that model_type.
    `variants`: subclasses `for_source` may return (with tokenizer kinds of their own); `legacy`: the family of
    manifests that name no tokenizer kind."""

    def wrap(cls: type[Architecture]) -> type[Architecture]:
        _REGISTRY[model_type] = cls
        for family in (cls, *variants):
            _TOKENIZER_KINDS[family.tokenizer_kind] = family
        if legacy:
            _LEGACY[:] = [model_type]
        return cls

    return wrap


def tokenizer_loader(kind: str | None) -> Callable[[Path], Any]:
    """How to load a tokenizer of this manifest kind from a model directory; ValueError naming the known kinds."""
    if kind is None:
        kind = _REGISTRY[_LEGACY[0]].tokenizer_kind
    if kind not in _TOKENIZER_KINDS:
        raise ValueError(f"tokenizer kind {kind!r} is not supported; supported: {', '.join(sorted(_TOKENIZER_KINDS))}")
    return _TOKENIZER_KINDS[kind]().load_tokenizer


def optimum_architectures() -> list[str]:
    """The families whose Optimum-exported graphs onnxmt reads (their input and output names proven)."""
    return sorted(name for name, cls in _REGISTRY.items() if cls.reads_optimum)


def supported() -> list[str]:
    return sorted(_REGISTRY)


def get_architecture(model_type: str | None) -> Architecture:
    if model_type not in _REGISTRY:
        raise ValueError(f"architecture {model_type!r} is not supported yet; supported: {', '.join(supported())}")
    return _REGISTRY[model_type]()


def check_default_target(default_target: str | None, tokens: dict[str, Any], when_none: str) -> None:
    """ValueError unless `default_target` (`--default-target`) is None or one of `tokens`, the model's target
    language tokens; `when_none` says why a model has none."""
    if default_target is not None and default_target not in tokens:
        valid = ", ".join(sorted(tokens)) or when_none
        raise ValueError(f"--default-target {default_target!r} is not a target language of this model; valid: {valid}")


def text_unit(architecture: str) -> str:
    """The unit of text a family translates best (`Architecture.text_unit`), by the manifest's architecture name;
    a sentence for a name no registered family has."""
    families = {cls.name: cls for cls in (*_REGISTRY.values(), *_TOKENIZER_KINDS.values())}
    family = families.get(architecture)
    return family.text_unit if family is not None else SENTENCE


def check_text_unit(unit: str | None) -> str | None:
    """`unit` if it is None (the model's) or one of TEXT_UNITS; ValueError naming them otherwise."""
    if unit is not None and unit not in TEXT_UNITS:
        raise ValueError(f"unit of text {unit!r} is not supported; valid: {', '.join(TEXT_UNITS)}")
    return unit


def read_json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}


class Architecture:
    """One family. Subclasses set the class attributes and implement `facts`, `languages` and (if the defaults do
    not fit) `tokens`; `build_hooks` names the export module with `load(path)`, `encoder(model)` and
    `decoder(model, buffered)`."""

    name = ""
    tokenizer_kind = ""  # the manifest's tokenizer.kind: `load_tokenizer` reads it
    tokenizer_files: tuple[str, ...] = ()  # copied into the model directory; export fails without them
    optional_tokenizer_files: tuple[str, ...] = ()  # copied when present
    build_hooks = ""  # module path, e.g. "onnxmt.export.marian"
    reads_optimum = False  # Optimum's exported graphs of this family load (their names proven by tests)
    # The encoder-decoder translators (Marian, NLLB, M2M100, mBART-50, MADLAD, T5) were trained on sentence pairs
    # and degrade on longer inputs (NLLB's model card says so): they get one sentence at a time, as LibreTranslate
    # gives Argos. Decoder-only translators take a paragraph with its context (architectures/decoder_only.py).
    text_unit = SENTENCE

    def for_source(self, source: Path) -> Architecture:
        """The variant of this family that the files in `source` make (NLLB is an m2m_100 with a tokenizer.json)."""
        return self

    def facts(self, config: dict[str, Any]) -> dict[str, Any]:
        """Sizes the runtime needs: d_model, encoder_layers, num_layers (decoder), num_heads, head_dim, vocab_size,
        max_positions."""
        raise NotImplementedError

    def tokens(self, source: Path, config: dict[str, Any], generation_config: dict[str, Any]) -> dict[str, Any]:
        """decoder_start, eos, eos_ids, pad, unk, as transformers resolves them: generation config first."""

        def pick(key: str) -> Any:
            value = generation_config.get(key)
            return config.get(key) if value is None else value

        eos = pick("eos_token_id")
        return {
            "decoder_start": pick("decoder_start_token_id"),
            "eos": eos[0] if isinstance(eos, list) else eos,
            "eos_ids": eos if isinstance(eos, list) else [eos],
            "pad": pick("pad_token_id"),
            "unk": self.unk_id(source),
        }

    def unk_id(self, source: Path) -> int | None:
        return None

    kind = "encoder_decoder"  # or "decoder_only" (architectures/decoder_only.py): which graphs export writes

    def deterministic(self, generation_config: dict[str, Any]) -> dict[str, Any]:
        """The generation config export checks and follows: as it is, unless a family sets sampling aside."""
        return generation_config

    def generation(self, generation_config: dict[str, Any], config: dict[str, Any]) -> dict[str, Any]:
        """The manifest's generation defaults: generation_config.json first, then config.json, as transformers."""
        from ..manifest import generation_defaults

        return generation_defaults(generation_config, config)

    def load_tokenizer(self, directory: Path) -> Any:
        """This family's tokenizer (tokenization/), from a model directory that holds its files."""
        raise NotImplementedError

    def languages(self, source: Path, default_target: str | None) -> dict[str, Any]:
        """The manifest's `languages` section: `scheme` (a key of schemes.SCHEMES) and what it needs."""
        raise NotImplementedError

    def tokenizer_section(self, source: Path, files: list[str], facts: dict[str, Any]) -> dict[str, Any]:
        tokenizer_config = read_json(source / "tokenizer_config.json")
        return {
            "kind": self.tokenizer_kind,
            "files": [n for n in files if n in (*self.tokenizer_files, *self.optional_tokenizer_files)],
            "model_max_length": tokenizer_config.get("model_max_length", facts["max_positions"]),
        }

    # Build hooks (torch), imported on first use so that the run side never imports them.

    def _hooks(self) -> Any:
        try:
            return importlib.import_module(self.build_hooks)
        except ImportError as e:
            raise missing_extra(f"exporting a {self.name} model", "export", e) from e

    def load(self, path: str) -> Any:
        return self._hooks().load(path)

    def encoder(self, model: Any) -> Any:
        return self._hooks().encoder(model)

    def write_tokenizer(self, source: Path, staging: Path) -> list[str]:
        """Tokenizer files the export makes from the source's (a build hook, e.g. transformers converting a
        sentencepiece model into tokenizer.json), written into `staging`; their names. None by default: the
        family's files are copied as they are."""
        return []

    def decoder(self, model: Any, buffered: bool = False, **options: Any) -> Any:
        """The decoder step module; `buffered`: the self-attention cache is a buffer the runtime writes (marian.py);
        `options`: the family's own (a decoder-only model's `fused_attention`)."""
        return self._hooks().decoder(model, buffered, **options)
