"""A newcomer's mistakes give one line and exit code 2, never a traceback: input that is not UTF-8 text, a
directory for a file, an extra that is not installed (with the command that installs it, for this install)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import ROOT
from tests.helpers.cli import one_line_error, run_cli


def test_binary_and_non_utf8_input_name_the_source(tiny_onnx_dir: Path, tmp_path: Path) -> None:
    model = ["translate", "-m", str(tiny_onnx_dir), "--max-new-tokens", "3"]
    binary = tmp_path / "r.bin"
    binary.write_bytes(bytes(range(256)) * 12)
    assert one_line_error(run_cli(*model, "-i", str(binary))).startswith(f"{binary} is not a text file")
    latin1 = tmp_path / "notes.txt"
    latin1.write_bytes("ok\ncaf\xe9\n".encode("latin-1"))
    message = one_line_error(run_cli(*model, "-i", str(latin1)))
    assert message.startswith(f"{latin1}: not UTF-8 text (byte 0xe9 on line 2)")
    subtitles = tmp_path / "talk.srt"
    subtitles.write_bytes(b"1\n00:00:01,000 --> 00:00:02,000\n\xff\n")
    assert one_line_error(run_cli(*model, "-i", str(subtitles))).startswith(f"{subtitles}: not UTF-8 text")
    assert one_line_error(run_cli(*model, input=b"ok\n\xff\n")) == "stdin, line 2: not UTF-8 text (byte 0xff)"
    assert one_line_error(run_cli(*model, "--format", "html", input=b"<p>\xff</p>")).startswith("stdin: not UTF-8")
    assert one_line_error(run_cli(*model, "-i", str(tmp_path))) == f"{tmp_path} is a directory; --input takes a file"


def test_an_argument_that_is_not_utf8_is_one_line(tiny_onnx_dir: Path) -> None:
    # Python hands such bytes over as lone surrogates (surrogateescape), which no tokenizer can encode: the byte
    # 0xff, and the three bytes a lone surrogate U+D800 would be in UTF-8, as a shell passes them on.
    for raw in ("\udcff", "\udced\udca0\udc80"):
        done = run_cli("translate", "-m", str(tiny_onnx_dir), "--max-new-tokens", "3", "fine", f"a{raw}b")
        assert one_line_error(done) == "text argument 2 is not UTF-8 text"


def test_stdin_keeps_working_for_good_text(tiny_onnx_dir: Path) -> None:
    done = run_cli("translate", "-m", str(tiny_onnx_dir), "--max-new-tokens", "3", input="\ufeffHello\r\n\nworld\n")
    assert done.returncode == 0, done.stderr
    assert len(done.stdout.split("\n")) == 4 and done.stdout.split("\n")[1] == ""


@pytest.mark.parametrize(
    ("blocked", "args", "extra"),
    [
        (("torch", "transformers"), ["export", "{hf}", "{tmp}/out"], "export"),
        (("torch", "transformers"), ["validate", "{onnx}", "--reference", "{hf}"], "export"),
        (("onnx",), ["quantize", "{onnx}", "{tmp}/int8"], "export"),
        (("fastapi", "uvicorn"), ["serve", "{onnx}"], "serve"),
        (("pyarrow",), ["translate-corpus", "{tmp}/in.txt", "{tmp}/out.txt", "-m", "{onnx}"], "ray"),
        (("docx",), ["translate", "-m", "{onnx}", "-i", "{tmp}/in.docx", "-o", "{tmp}/out.docx"], "documents"),
    ],
)
def test_a_missing_extra_is_one_line_with_the_command_that_installs_it(
    blocked: tuple[str, ...],
    args: list[str],
    extra: str,
    tiny_hf_dir: Path,
    tiny_onnx_dir: Path,
    tmp_path: Path,
) -> None:
    (tmp_path / "in.txt").write_text("Hello\n", encoding="utf-8")
    (tmp_path / "in.docx").write_bytes(b"PK")
    paths = {"hf": str(tiny_hf_dir), "onnx": str(tiny_onnx_dir), "tmp": str(tmp_path)}
    done = run_cli(*(arg.format(**paths) for arg in args), blocked=blocked, cwd=tmp_path)
    message = one_line_error(done)
    assert f"needs the {extra} extra" in message and "is not installed" in message
    # From this checkout (an editable install or src/ on PYTHONPATH), quoted: never a bare `onnxmt[...]`.
    assert message.endswith(f"[{extra}]'")
    assert f"pip install '{ROOT}[" in message or f"pip install -e '{ROOT}[" in message
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("model", ["./nosuchdir", "../no/such", "nosuchdir", "a/b/c", ".hidden/x"])
def test_a_path_is_a_path_never_a_hub_id(model: str, tmp_path: Path) -> None:
    done = run_cli("translate", "-m", model, "hi", cwd=tmp_path, env={"ONNXMT_CACHE": str(tmp_path / "cache")})
    assert one_line_error(done) == f"model directory not found: {model}"
    assert "first use" not in done.stderr and not (tmp_path / "cache").exists()


def test_the_hub_error_says_offline_and_points_to_the_tiny_model(tmp_path: Path) -> None:
    env = {"HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf"), "ONNXMT_CACHE": str(tmp_path / "cache")}
    message = one_line_error(run_cli("translate", "-m", "Helsinki-NLP/opus-mt-xx-yy", "hi", env=env, cwd=tmp_path))
    assert message.startswith("HF_HUB_OFFLINE is set and 'Helsinki-NLP/opus-mt-xx-yy' is not in the hub's cache")
    assert "unreachable" not in message and "'Without the hub'" in message
