"""The architecture registry: one class per model_type, torch-free, with its build hooks imported lazily."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

from onnxmt.architectures import SCHEMES, get_architecture, supported
from onnxmt.architectures.m2m100 import M2M100_LANGUAGE_CODES
from tests.helpers import ROOT
from tests.helpers.skips import importorskip


def test_unknown_architecture_lists_the_supported_ones() -> None:
    names = ["gemma3", "gemma3_text", "hunyuan_v1_dense", "m2m_100", "marian", "mbart", "mt5", "qwen3", "t5"]
    assert supported() == names
    with pytest.raises(ValueError, match=f"'fsmt' is not supported yet; supported: {', '.join(names)}"):
        get_architecture("fsmt")


def test_the_registry_and_the_schemes_import_without_torch() -> None:
    # The run side reads architectures (schemes, tokenizer kinds); their build hooks must stay unimported.
    code = (
        "import sys, onnxmt.architectures as a\n"
        "[a.get_architecture(name) for name in ('marian', 'm2m_100', 'mbart', 't5', 'mt5', 'qwen3', 'gemma3')]\n"
        "import onnxmt.tokenization.chat, onnxmt.runtime.decoder_only\n"
        "hooks = ('torch', 'transformers', 'onnxmt.export.marian', 'onnxmt.export.m2m100', 'onnxmt.export.mbart',\n"
        "         'onnxmt.export.t5', 'onnxmt.export.decoder_only')\n"
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
        get_architecture("qwen3"),
    ):
        assert tokenizer_loader(arch.tokenizer_kind).__self__.tokenizer_kind == arch.tokenizer_kind  # type: ignore[attr-defined]
    assert get_architecture("m2m_100").for_source(tmp_path).tokenizer_kind == "tokenizers"  # NLLB
    assert set(SCHEMES) == {"target_token_prefix", "language_tokens", "chat_template"}


def test_m2m100_language_codes_are_transformers_own() -> None:
    transformers = importorskip("transformers.models.m2m_100.tokenization_m2m_100")
    assert {k: list(v) for k, v in M2M100_LANGUAGE_CODES.items()} == transformers.FAIRSEQ_LANGUAGE_CODES


def test_mbart50_language_codes_are_transformers_own() -> None:
    from onnxmt.architectures.mbart import ML50_CODES
    from onnxmt.testing.mbart import MBART_50_SPECIAL_TOKENS_MAP

    transformers = importorskip("transformers.models.mbart50.tokenization_mbart50")
    assert list(ML50_CODES) == transformers.FAIRSEQ_LANGUAGE_CODES
    assert json.loads(MBART_50_SPECIAL_TOKENS_MAP)["additional_special_tokens"] == list(ML50_CODES)


# Where a family may be named in code: its registry module, its build hooks and its test-model spec.
FAMILY_PLACES = ("src/onnxmt/architectures/{}.py", "src/onnxmt/export/{}.py", "src/onnxmt/testing/{}.py")


def _family_names() -> dict[str, str]:
    """Each registered family's names (its model_type and tokenizer kinds, spelled as code spells them) -> the
    module stem of its registry module."""
    from onnxmt.architectures import base

    names = {}
    for model_type, cls in base._REGISTRY.items():
        stem = Path(sys.modules[cls.__module__].__file__ or "").stem
        for name in (model_type, cls.name):
            names[name] = stem
    for kind, cls in base._TOKENIZER_KINDS.items():
        if kind != "tokenizers":  # the library's name, not a family's
            names[kind] = Path(sys.modules[cls.__module__].__file__ or "").stem
    return names


def test_no_module_outside_a_family_s_places_names_it_in_code() -> None:
    """Adding a family touches only its own modules: nothing else in src/ or benchmarks/ compares against, looks
    up or branches on a registered family's name (string constants; docstrings and comments may name it)."""

    root = ROOT
    names = _family_names()
    assert {"marian", "m2m_100"} <= set(names)
    found = []
    for folder in ("src", "benchmarks"):
        for path in sorted((root / folder).rglob("*.py")):
            relative = path.relative_to(root).as_posix()
            tree = ast.parse(path.read_text(encoding="utf-8"))
            docstrings = {
                id(node.body[0].value)
                for node in ast.walk(tree)
                if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                and node.body
                and isinstance(node.body[0], ast.Expr)
            }
            for node in ast.walk(tree):
                if not (isinstance(node, ast.Constant) and isinstance(node.value, str)) or id(node) in docstrings:
                    continue
                family = names.get(node.value.lower())
                if family is not None and relative not in {place.format(family) for place in FAMILY_PLACES}:
                    found.append(f"{relative}:{node.lineno} {node.value!r}")
    assert not found, "family names outside the family's modules:\n" + "\n".join(found)
