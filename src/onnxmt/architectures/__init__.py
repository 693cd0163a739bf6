"""Architecture quirks, one registered class per `config.model_type`, read by both halves.

Torch-free: the run side reads an architecture's language scheme and tokenizer kind; the build side also calls its
build hooks (`load`, `encoder`, `decoder`), which live in `onnxmt.export` and are imported only when called. An
unknown architecture is an error that lists the supported ones (as CTranslate2's converters do). Adding a family is
one module here, one export-graphs module, a tokenizer kind if it needs a new one, and a random-model fixture
(docs/architectures.md).
"""

from __future__ import annotations

from .base import (
    PARAGRAPH,
    SENTENCE,
    TEXT_UNITS,
    Architecture,
    check_text_unit,
    get_architecture,
    optimum_architectures,
    register,
    supported,
    text_unit,
    tokenizer_loader,
)
from .schemes import SCHEMES, LanguageScheme, Prompt, scheme_for

# Importing the families registers them.
from . import decoder_only, m2m100, marian, mbart, t5  # noqa: F401  isort: skip

__all__ = [
    "PARAGRAPH",
    "SCHEMES",
    "SENTENCE",
    "TEXT_UNITS",
    "Architecture",
    "LanguageScheme",
    "Prompt",
    "check_text_unit",
    "get_architecture",
    "optimum_architectures",
    "register",
    "scheme_for",
    "supported",
    "text_unit",
    "tokenizer_loader",
]
