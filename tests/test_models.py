"""Finding a model directory for a `--model` argument or `Translator(model)`: a directory as it is, a path-looking
argument as a path, a hub id from onnxmt's cache (exported there on first use)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from onnxmt import ModelDirError, Translator
from onnxmt.models import looks_like_path, resolve_model_dir

HUB_ID = "Some-Org/opus-mt-xx-yy"


@pytest.mark.parametrize(
    ("model", "path"),
    [
        ("./x", True),
        ("../x/y", True),
        ("/x/y", True),
        ("~/x", True),
        ("x", True),
        ("a/b/c", True),
        (".hidden/x", True),
        ("org/.x", True),
        ("a\\b", True),
        ("Helsinki-NLP/opus-mt-en-zh", False),
        ("facebook/nllb-200-distilled-600M", False),
    ],
)
def test_a_path_looking_argument_is_a_path(model: str, path: bool) -> None:
    assert looks_like_path(model) is path


def test_hub_id_from_the_cache_and_paths_never_exported(
    tiny_onnx_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ONNXMT_CACHE", str(tmp_path / "cache"))
    cached = tmp_path / "cache" / "models" / HUB_ID.replace("/", "--")
    shutil.copytree(tiny_onnx_dir, cached)
    assert resolve_model_dir(HUB_ID, progress=pytest.fail) == cached
    assert resolve_model_dir(tiny_onnx_dir, progress=pytest.fail) == tiny_onnx_dir  # a Path too
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ModelDirError, match=r"^model directory not found: \./Some-Org/opus-mt-xx-yy$"):
        resolve_model_dir(f"./{HUB_ID}", progress=pytest.fail)


def test_translator_takes_a_hub_id_as_the_cli_does(
    tiny_onnx_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ONNXMT_CACHE", str(tmp_path / "cache"))
    shutil.copytree(tiny_onnx_dir, tmp_path / "cache" / "models" / HUB_ID.replace("/", "--"))
    translated = Translator(HUB_ID).translate(["Hello world"], max_new_tokens=4)
    assert translated == Translator(tiny_onnx_dir).translate(["Hello world"], max_new_tokens=4)
