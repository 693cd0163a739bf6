"""The `onnxmt` command line: export, inspect, translate."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from onnxmt import DecodeOptions, Translator
from onnxmt.cli import app
from onnxmt.documents.segment import join, split_sentences
from onnxmt.manifest import MANIFEST_NAME, read_manifest
from onnxmt.testing import generate_corpus
from tests.helpers.skips import importorskip

runner = CliRunner()
ENGLISH = generate_corpus(11, lines=12)[0]


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


def test_plain_text_has_one_rule_through_every_surface(tiny_onnx_dir: Path, tmp_path: Path) -> None:
    """The same plain text gives the same translation through stdin, arguments, -i, -i -o, translate-corpus's
    batch function and /translate_file: line by line, each line sentence by sentence (Marian's unit of text; with
    --unit paragraph a line that fits is one text), a part too long for the model cut, blank lines and the
    whitespace around lines kept."""
    from fastapi.testclient import TestClient

    from onnxmt.documents.translate import translate_lines
    from onnxmt.scale.corpus import TranslateBatch
    from onnxmt.serve.app import create_app
    from onnxmt.serve.options import ServeOptions

    translator = Translator(tiny_onnx_dir, decoding=DecodeOptions(max_new_tokens=5))
    long_line = " ".join(ENGLISH * 3)  # too long for the tiny model: cut
    lines = ["Good morning! How are you?", "", "  What is this?  ", long_line, "12:30", "music", ""]
    text = "\n".join(lines) + "\n"
    expected = list(translate_lines(translator, lines))
    assert len(expected) == len(lines) and expected[1] == "" and expected[4] == "12:30"
    assert expected[2].startswith("  ") and expected[2].endswith("  ")
    sentences = [t.text for t in translator.translate(["Good morning!", "How are you?"])]
    assert expected[0] == join(split_sentences(lines[0]), sentences)  # a sentence-level model's line: its sentences
    whole = list(translate_lines(translator, lines, unit="paragraph"))
    assert whole[0] == translator.translate([lines[0]])[0].text != expected[0]  # a paragraph: the line whole
    source = tmp_path / "in.txt"
    source.write_text(text, encoding="utf-8")
    base = ["translate", "-m", str(tiny_onnx_dir), "--max-new-tokens", "5"]
    paragraphs = runner.invoke(app, [*base, "--unit", "paragraph"], input=text)
    assert paragraphs.exit_code == 0 and paragraphs.stdout == "\n".join(whole) + "\n", paragraphs.output
    piped = runner.invoke(app, base, input=text)
    from_file = runner.invoke(app, [*base, "-i", str(source)])
    to_file = runner.invoke(app, [*base, "-i", str(source), "-o", str(tmp_path / "out.txt")])
    for result in (piped, from_file, to_file):
        assert result.exit_code == 0, result.output
    assert piped.stdout == from_file.stdout == "\n".join(expected) + "\n"
    assert (tmp_path / "out.txt").read_text(encoding="utf-8") == "\n".join(expected) + "\n"
    actor = TranslateBatch(str(tiny_onnx_dir), {}, {"max_new_tokens": 5}, {}, {}, column="text", output_column="out")
    batch = actor({"text": lines})
    assert list(batch["out"]) == expected
    with TestClient(create_app(tiny_onnx_dir, ServeOptions(), decoding=DecodeOptions(max_new_tokens=5))) as client:
        while client.get("/ready").status_code != 200:
            time.sleep(0.05)
        uploaded = client.post("/translate_file", files={"file": ("in.txt", text.encode())}, data={"source": "en"})
        assert uploaded.status_code == 200, uploaded.text
        path = uploaded.json()["translatedFileUrl"].split("/download_file/")[1]
        assert client.get(f"/download_file/{path}").text == "\n".join(expected) + "\n"


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


def test_inspect_says_how_the_decoder_holds_its_cache(
    tiny_onnx_dir: Path, tiny_concat_onnx_dir: Path, tmp_path: Path
) -> None:
    """Per-row lengths (format 4, the default export), one length for all rows (a format-3 buffered decoder:
    simulated here by its manifest, whose past_length is (1,)), or the Concat form; the format-3 directory still
    loads and translates as the format-4 one does."""
    import json
    import shutil

    from onnxmt import Translator

    old = tmp_path / "format-3"
    shutil.copytree(tiny_onnx_dir, old)
    data = json.loads((old / MANIFEST_NAME).read_text())
    data["format_version"] = 3
    for spec in data["graphs"]["decoder"]["inputs"]:
        if spec["role"] == "past_length":
            spec["shape"] = [1]
    (old / MANIFEST_NAME).write_text(json.dumps(data))
    inexact = tmp_path / "before-rows-bit-exact"  # a format-4 export whose decoder's rows are not bit-exact
    shutil.copytree(tiny_onnx_dir, inexact)
    data = json.loads((inexact / MANIFEST_NAME).read_text())
    del data["model"]["rows_bit_exact"]
    (inexact / MANIFEST_NAME).write_text(json.dumps(data))
    forms = {}
    directories = {"rows": tiny_onnx_dir, "inexact": inexact, "one": old, "concat": tiny_concat_onnx_dir}
    for name, directory in directories.items():
        result = runner.invoke(app, ["inspect", str(directory)], env={"COLUMNS": "250"})
        assert result.exit_code == 0, result.output
        forms[name] = next(line for line in result.output.splitlines() if "decoder cache" in line)
    assert "one length per row" in forms["rows"] and "bit-exact" in forms["rows"] and "again" not in forms["rows"]
    assert "one length per row" in forms["inexact"] and "export again for bit-exact rows" in forms["inexact"]
    assert "one length for all rows" in forms["one"] and "static batches" in forms["one"]
    assert "Concat" in forms["concat"]
    texts = ["Hello world.", "The weather is nice today, is it not?"]
    assert Translator(old).translate(texts, beams=2) == Translator(tiny_onnx_dir).translate(texts, beams=2)


def test_export_via_cli_and_refusal_without_force(tiny_hf_dir: Path, tmp_path: Path) -> None:
    importorskip("torch")
    out = tmp_path / "exported"
    result = runner.invoke(app, ["export", str(tiny_hf_dir), str(out), "--no-check"])
    assert result.exit_code == 0, result.output
    assert (out / MANIFEST_NAME).is_file()
    assert read_manifest(out).graphs["decoder"].has_input("past_length")  # the default: the cache as a buffer
    again = runner.invoke(app, ["export", str(tiny_hf_dir), str(out)])
    assert again.exit_code == 2
    assert "--force" in again.output
    concat = runner.invoke(app, ["export", str(tiny_hf_dir), str(out), "--force", "--no-check", "--cache-concat"])
    assert concat.exit_code == 0, concat.output
    assert not read_manifest(out).graphs["decoder"].has_input("past_length")
    bad = runner.invoke(app, ["export", str(tmp_path / "missing"), str(tmp_path / "x")])
    assert bad.exit_code == 2 and "not found" in bad.output


def _document_round_trip(tiny_onnx_dir: Path, source: Path, target: Path) -> None:
    args = ["translate", "-m", str(tiny_onnx_dir), "-i", str(source), "-o", str(target), "--max-new-tokens", "4"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output


def test_translate_a_multi_paragraph_text_file(tiny_onnx_dir: Path, tmp_path: Path) -> None:
    text = "First sentence here. Second one!\nSame paragraph, next line.\n\n\nAnother paragraph. Its end.\n"
    (tmp_path / "in.txt").write_text(text, encoding="utf-8")
    _document_round_trip(tiny_onnx_dir, tmp_path / "in.txt", tmp_path / "out.txt")
    out = (tmp_path / "out.txt").read_text(encoding="utf-8")
    assert [bool(line.strip()) for line in out.split("\n")] == [bool(line.strip()) for line in text.split("\n")]
    assert "First sentence" not in out


def test_translate_an_html_file_keeps_its_tags(tiny_onnx_dir: Path, tmp_path: Path) -> None:
    from onnxmt.documents.html import parse

    page = '<html><body><h1 class="t">A title</h1><p>Some <b>bold</b> words. <a href="/x">A link</a>.</p></body></html>'
    (tmp_path / "in.html").write_text(page, encoding="utf-8")
    _document_round_trip(tiny_onnx_dir, tmp_path / "in.html", tmp_path / "out.html")
    out = (tmp_path / "out.html").read_text(encoding="utf-8")
    assert [e.raw for e in parse(out) if e.kind != "data"] == [e.raw for e in parse(page) if e.kind != "data"]
    assert "A title" not in out


def test_translate_an_srt_file_keeps_its_cues(tiny_onnx_dir: Path, tmp_path: Path) -> None:
    from onnxmt.documents.subtitles import cues

    srt = "1\n00:00:01,000 --> 00:00:02,000\nHello there,\nmy friend.\n\n2\n00:00:03,000 --> 00:00:04,500\nBye.\n"
    (tmp_path / "in.srt").write_text(srt, encoding="utf-8")
    _document_round_trip(tiny_onnx_dir, tmp_path / "in.srt", tmp_path / "out.srt")
    out = cues((tmp_path / "out.srt").read_text(encoding="utf-8"))
    assert [head for head, _ in out] == [head for head, _ in cues(srt)]
    assert [len(lines) for _, lines in out] == [1, 1]


def test_translate_a_docx_file_keeps_styles_and_runs(tiny_onnx_dir: Path, tmp_path: Path) -> None:
    importorskip("docx")
    from tests.helpers.office import docx_structure, make_docx

    make_docx(tmp_path / "in.docx")
    _document_round_trip(tiny_onnx_dir, tmp_path / "in.docx", tmp_path / "out.docx")
    assert docx_structure(tmp_path / "out.docx") == docx_structure(tmp_path / "in.docx")


def test_format_html_on_stdin_and_format_errors(tiny_onnx_dir: Path) -> None:
    base = ["translate", "-m", str(tiny_onnx_dir), "--max-new-tokens", "4"]
    result = runner.invoke(app, [*base, "--format", "html"], input="<p>Hello <i>there</i> world.</p>")
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("<p>") and "<i>" in result.stdout and result.stdout.endswith("</p>\n")
    bad = runner.invoke(app, [*base, "--format", "pdf", "hi"])
    assert bad.exit_code == 2 and "valid formats" in bad.output
    docx = runner.invoke(app, [*base, "--format", "docx"], input="x")
    assert docx.exit_code == 2 and "needs --input FILE and --output FILE" in " ".join(docx.output.split())
