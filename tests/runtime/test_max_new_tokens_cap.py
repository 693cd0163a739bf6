"""More new tokens than the model has positions for: capped at the model's length with a warning, as transformers
does, in the library, the CLI and so the README's snippets (runtime/search.py's resolve_settings)."""

from __future__ import annotations

from pathlib import Path

import pytest

from onnxmt import DecodeOptions, Translator
from onnxmt.manifest import read_manifest
from tests.helpers.cli import run_cli


def test_library_caps_with_a_warning(tiny_onnx_dir: Path) -> None:
    positions = int(read_manifest(tiny_onnx_dir).model["max_positions"])
    with pytest.warns(UserWarning, match=f"capped at {positions}"):
        translator = Translator(tiny_onnx_dir, decoding=DecodeOptions(beams=4, max_new_tokens=256))
        capped = translator.translate(["Hello world", "How are you?"])
    expected = Translator(tiny_onnx_dir).translate(["Hello world", "How are you?"], max_new_tokens=positions)
    assert [t.token_ids for t in capped] == [t.token_ids for t in expected]


def test_cli_caps_with_a_one_line_warning(tiny_onnx_dir: Path) -> None:
    done = run_cli("translate", "-m", str(tiny_onnx_dir), "--max-new-tokens", "256", "Hello world")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip()
    warnings = [line for line in done.stderr.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and "capped at" in warnings[0], done.stderr
