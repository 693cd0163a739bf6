"""The `onnxmt` command line: export, inspect, translate."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from onnxmt import Translator
from onnxmt.cli import app
from onnxmt.manifest import MANIFEST_NAME, read_manifest
from skips import importorskip

runner = CliRunner()


def test_translate_arguments_and_stdin(tiny_onnx_dir: Path) -> None:
    expected = [t.text for t in Translator(tiny_onnx_dir).translate(["Hello world.", "", "a"], max_new_tokens=5)]
    result = runner.invoke(
        app, ["translate", "-m", str(tiny_onnx_dir), "--max-new-tokens", "5", "Hello world.", "", "a"]
    )
    assert result.exit_code == 0, result.output
    assert result.stdout.split("\n")[:3] == expected
    piped = runner.invoke(
        app, ["translate", "-m", str(tiny_onnx_dir), "--max-new-tokens", "5"], input="Hello world.\n\na\n"
    )
    assert piped.exit_code == 0, piped.output
    assert piped.stdout.split("\n")[:3] == expected


def test_translate_file_to_file_keeps_lines(tiny_onnx_dir: Path, tmp_path: Path) -> None:
    lines = ["Good morning!", "", "What is this?", "music", ""]
    source = tmp_path / "in.txt"
    source.write_text("\n".join(lines) + "\n", encoding="utf-8")
    target = tmp_path / "out.txt"
    args = ["translate", "-m", str(tiny_onnx_dir), "-i", str(source), "-o", str(target), "--beams", "2"]
    result = runner.invoke(app, [*args, "--max-new-tokens", "4", "--batch-size", "2", "--threads", "1"])
    assert result.exit_code == 0, result.output
    written = target.read_text(encoding="utf-8").split("\n")[:-1]
    expected = Translator(tiny_onnx_dir).translate(lines, beams=2, max_new_tokens=4)
    assert written == [t.text for t in expected]
    assert written[1] == "" and written[4] == ""


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["translate", "-m", "/nonexistent/model", "hi"], "model directory not found"),
        (["translate", "-i", "/nonexistent.txt"], "input file not found"),
        (["translate", "--target-lang", "fra", "hi"], "single target language"),
        (["translate", "--beams", "0", "hi"], "beams must be at least 1"),
        (["inspect", "/nonexistent/model"], "model directory not found"),
    ],
)
def test_errors_exit_2_with_a_message(tiny_onnx_dir: Path, args: list[str], message: str) -> None:
    if args[0] == "translate" and "-m" not in args:
        args = [*args, "-m", str(tiny_onnx_dir)]
    result = runner.invoke(app, args)
    assert result.exit_code == 2
    assert message in " ".join(result.output.split())
    assert "Traceback" not in result.output


def test_pytorch_directory_is_not_a_model_dir(tiny_hf_dir: Path) -> None:
    result = runner.invoke(app, ["translate", "-m", str(tiny_hf_dir), "hi"])
    assert result.exit_code == 2
    assert "onnxmt export" in " ".join(result.output.split())


def test_inspect_shows_manifest_and_graph_names(tiny_onnx_dir: Path) -> None:
    result = runner.invoke(app, ["inspect", str(tiny_onnx_dir)], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    manifest = read_manifest(tiny_onnx_dir)
    for graph in manifest.graphs.values():
        assert graph.file in result.output
        for spec in [*graph.inputs, *graph.outputs]:
            assert spec.name in result.output
    assert "decoder_start=" in result.output and "bad_words_ids=" in result.output


def test_export_via_cli_and_refusal_without_force(tiny_hf_dir: Path, tmp_path: Path) -> None:
    importorskip("torch")
    out = tmp_path / "exported"
    result = runner.invoke(app, ["export", str(tiny_hf_dir), str(out), "--no-check"])
    assert result.exit_code == 0, result.output
    assert (out / MANIFEST_NAME).is_file()
    again = runner.invoke(app, ["export", str(tiny_hf_dir), str(out)])
    assert again.exit_code == 2
    assert "--force" in again.output
    bad = runner.invoke(app, ["export", str(tmp_path / "missing"), str(tmp_path / "x")])
    assert bad.exit_code == 2 and "not found" in bad.output
