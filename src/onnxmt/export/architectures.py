"""Architecture quirks, one registered class per `config.model_type`.

An unknown architecture is an error that lists the supported ones (as CTranslate2's converters do).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..manifest import MARIAN_TOKENIZER_FILES, OPTIONAL_TOKENIZER_FILES, model_facts

_REGISTRY: dict[str, type[Architecture]] = {}


def register(model_type: str) -> Callable[[type[Architecture]], type[Architecture]]:
    def wrap(cls: type[Architecture]) -> type[Architecture]:
        _REGISTRY[model_type] = cls
        return cls

    return wrap


def supported() -> list[str]:
    return sorted(_REGISTRY)


def get_architecture(model_type: str | None) -> Architecture:
    if model_type not in _REGISTRY:
        raise ValueError(f"architecture {model_type!r} is not supported yet; supported: {', '.join(supported())}")
    return _REGISTRY[model_type]()


class Architecture:
    name = ""
    tokenizer_kind = ""
    tokenizer_files: tuple[str, ...] = ()
    optional_tokenizer_files: tuple[str, ...] = ()

    def load(self, path: str) -> Any:
        raise NotImplementedError

    def encoder(self, model: Any) -> Any:
        raise NotImplementedError

    def decoder(self, model: Any, buffered: bool = False) -> Any:
        """The decoder step module; `buffered`: the self-attention cache is a buffer the runtime writes (marian.py)."""
        raise NotImplementedError

    def facts(self, config: dict[str, Any]) -> dict[str, Any]:
        raise NotImplementedError


@register("marian")
class Marian(Architecture):
    name = "marian"
    tokenizer_kind = "marian"
    tokenizer_files = MARIAN_TOKENIZER_FILES
    # target_vocab.json exists only for models with separate source/target vocabularies.
    optional_tokenizer_files = OPTIONAL_TOKENIZER_FILES

    def load(self, path: str) -> Any:
        from transformers import MarianMTModel

        # Eager attention: the exported graph must compute what transformers' reference path computes.
        return MarianMTModel.from_pretrained(path, attn_implementation="eager").eval()

    def encoder(self, model: Any) -> Any:
        from .marian import MarianEncoderExport

        return MarianEncoderExport(model).eval()

    def decoder(self, model: Any, buffered: bool = False) -> Any:
        from .marian import MarianDecoderExport

        return MarianDecoderExport(model, buffered=buffered).eval()

    def facts(self, config: dict[str, Any]) -> dict[str, Any]:
        return model_facts(config)
