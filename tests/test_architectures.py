"""The architecture registry: one class per model_type, torch-free, with its build hooks imported lazily."""

from __future__ import annotations

import subprocess
import sys

import pytest

from onnxmt.architectures import SCHEMES, get_architecture, supported
from onnxmt.architectures.m2m100 import M2M100_LANGUAGE_CODES


def test_unknown_architecture_lists_the_supported_ones() -> None:
    assert supported() == ["m2m_100", "marian"]
    with pytest.raises(ValueError, match="'t5' is not supported yet; supported: m2m_100, marian"):
        get_architecture("t5")


def test_the_registry_and_the_schemes_import_without_torch() -> None:
    # The run side reads architectures (schemes, tokenizer kinds); their build hooks must stay unimported.
    code = (
        "import sys, onnxmt.architectures as a\n"
        "a.get_architecture('marian'); a.get_architecture('m2m_100')\n"
        "hooks = ('torch', 'transformers', 'onnxmt.export.marian', 'onnxmt.export.m2m100')\n"
        "bad = [m for m in hooks if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_each_family_names_a_known_scheme_and_tokenizer_kind(tmp_path) -> None:
    from onnxmt.architectures import tokenizer_loader

    (tmp_path / "tokenizer.json").write_text("{}")
    for arch in (
        get_architecture("marian"),
        get_architecture("m2m_100"),
        get_architecture("m2m_100").for_source(tmp_path),
    ):
        assert tokenizer_loader(arch.tokenizer_kind).__self__.tokenizer_kind == arch.tokenizer_kind  # type: ignore[attr-defined]
    assert get_architecture("m2m_100").for_source(tmp_path).tokenizer_kind == "tokenizers"  # NLLB
    assert set(SCHEMES) == {"target_token_prefix", "language_tokens"}


def test_m2m100_language_codes_are_transformers_own() -> None:
    transformers = pytest.importorskip("transformers.models.m2m_100.tokenization_m2m_100")
    assert {k: list(v) for k, v in M2M100_LANGUAGE_CODES.items()} == transformers.FAIRSEQ_LANGUAGE_CODES
