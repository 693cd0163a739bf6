"""`onnxmt.json` is data from disk: a manifest of the wrong shape, naming files outside its directory or token ids
outside the vocabulary is refused at load with a one-line ModelDirError (exit code 2 in the CLI), never a traceback.
"""

from __future__ import annotations

import builtins
import io
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import onnxmt
from onnxmt.manifest import FORMAT_VERSION, MANIFEST_NAME, Manifest, ModelDirError, read_manifest, verify_files

Edit = Callable[[dict[str, Any]], object]


@pytest.fixture
def model_copy(tiny_onnx_dir: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(tiny_onnx_dir, tmp_path / "model"))


def _rewrite(directory: Path, edit: Edit) -> None:
    path = directory / MANIFEST_NAME
    data = json.loads(path.read_text(encoding="utf-8"))
    edit(data)
    path.write_text(json.dumps(data), encoding="utf-8")


def _refused(directory: Path) -> str:
    with pytest.raises(ModelDirError) as info:
        read_manifest(directory)
    message = str(info.value)
    assert "\n" not in message
    return message


def _assert_refused(directory: Path, case: tuple[Edit, str]) -> None:
    """The manifest changed by the case's edit is refused with a message that contains the case's."""
    edit, message = case
    _rewrite(directory, edit)
    assert message in _refused(directory)


def test_an_exported_manifest_reads_back_unchanged(tiny_onnx_dir: Path) -> None:
    manifest = read_manifest(tiny_onnx_dir)
    assert Manifest.from_dict(json.loads(manifest.to_json())) == manifest
    verify_files(tiny_onnx_dir, manifest)


@pytest.mark.parametrize(
    ("content", "kind"),
    [("[]", "an array"), ('"model"', "a string"), ("3", "an integer"), ("null", "null"), ("true", "a boolean")],
)
def test_a_manifest_that_is_not_an_object_is_refused(model_copy: Path, content: str, kind: str) -> None:
    (model_copy / MANIFEST_NAME).write_text(content, encoding="utf-8")
    assert _refused(model_copy).endswith(f"{MANIFEST_NAME}: expected a JSON object, got {kind}")


def test_a_manifest_that_is_not_json_is_refused(model_copy: Path) -> None:
    (model_copy / MANIFEST_NAME).write_bytes(b'{"format": "onnxmt", \xff')
    assert "malformed manifest" in _refused(model_copy)


def _set(path: str, value: Any) -> Edit:
    """An edit setting `a/b/0/c` (dict keys, list indexes) to `value`."""

    def edit(data: dict[str, Any]) -> None:
        *parents, last = path.split("/")
        node: Any = data
        for key in parents:
            node = node[int(key)] if isinstance(node, list) else node[key]
        node[int(last) if isinstance(node, list) else last] = value

    return edit


WRONG_TYPES: dict[str, tuple[Edit, str]] = {
    "graphs-list": (_set("graphs", []), "graphs should be an object, got an array"),
    "architecture-number": (_set("architecture", 1), "architecture should be a string, got an integer"),
    "vocab-size-string": (_set("model/vocab_size", "353"), "model.vocab_size should be an integer, got a string"),
    "eos-bool": (_set("tokens/eos", True), "tokens.eos should be an integer, got a boolean"),
    "pad-float": (_set("tokens/pad", 1.5), "tokens.pad should be an integer or null, got a number"),
    "eos-ids-number": (_set("tokens/eos_ids", 0), "tokens.eos_ids should be an array, got an integer"),
    "shape-string": (
        _set("graphs/encoder/inputs/0/shape", "batch"),
        "graphs.encoder.inputs[0].shape should be an array, got a string",
    ),
    "spec-fields": (
        _set("graphs/decoder/inputs/0", {"name": "x"}),
        "graphs.decoder.inputs[0] should have exactly name, role, dtype, shape",
    ),
    "graph-file-missing": (lambda d: d["graphs"]["decoder"].pop("file"), "graphs.decoder.file is missing"),
    "bytes-string": (_set("files/encoder.onnx/bytes", "1"), "files['encoder.onnx'].bytes should be an integer"),
    "tokenizer-files": (_set("tokenizer/files", [1]), "tokenizer.files[0] should be a string, got an integer"),
    "bad-word-flat": (
        _set("generation/bad_words_ids", [352]),
        "generation.bad_words_ids[0] should be an array or null, got an integer",
    ),
    "beams-string": (_set("generation/num_beams", "4"), "generation.num_beams should be an integer or null"),
    "target-token-number": (_set("languages/target_tokens", {"fr": 1}), "languages.target_tokens['fr'] should be"),
    "quantization-list": (_set("quantization", []), "quantization should be an object or null, got an array"),
    "missing-section": (lambda d: d.pop("tokens"), "missing field(s) ['tokens']"),
    "missing-vocab-size": (lambda d: d["model"].pop("vocab_size"), "model.vocab_size is missing"),
    "unknown-field": (_set("surprise", 1), "unknown field(s) ['surprise']"),
}


@pytest.mark.parametrize("case", WRONG_TYPES)
def test_fields_of_the_wrong_type_are_refused(model_copy: Path, case: str) -> None:
    _assert_refused(model_copy, WRONG_TYPES[case])


OUTSIDE = ["../../etc/passwd", "/etc/passwd", "sub/../../x.onnx", "..", "C:\\model\\x.onnx", "a\\..\\..\\x", ""]


def _rename_file(old: str, new: str) -> Edit:
    def edit(data: dict[str, Any]) -> None:
        data["files"] = {new if k == old else k: v for k, v in data["files"].items()}

    return edit


@pytest.mark.parametrize("name", OUTSIDE)
@pytest.mark.parametrize("where", ["files", "graph", "tokenizer"])
def test_file_names_outside_the_directory_are_refused(model_copy: Path, name: str, where: str) -> None:
    if where == "files":
        edit = _rename_file("vocab.json", name)
    elif where == "graph":
        edit = _set("graphs/decoder/file", name)
    else:
        edit = _set("tokenizer/files", [name])
    _rewrite(model_copy, edit)
    assert f"file name {name!r} points outside the model directory; refused" in _refused(model_copy)


def test_a_symlink_out_of_the_directory_is_refused_before_it_is_opened(
    model_copy: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    secret = tmp_path / "outside" / "vocab.json"
    secret.parent.mkdir()
    shutil.move(model_copy / "vocab.json", secret)
    (model_copy / "vocab.json").symlink_to(secret)
    opened: list[str] = []

    def spy(file: Any, *args: Any, **kwargs: Any) -> Any:
        opened.append(Path(file).name)
        return real_open(file, *args, **kwargs)

    real_open = io.open
    monkeypatch.setattr(io, "open", spy)
    monkeypatch.setattr(builtins, "open", spy)
    assert "vocab.json: resolves outside the model directory (a symlink?); refused" in _refused(model_copy)
    unchecked = Manifest.from_dict(json.loads(real_open(model_copy / MANIFEST_NAME, encoding="utf-8").read()))
    with pytest.raises(ModelDirError, match="resolves outside the model directory"):
        verify_files(model_copy, unchecked)
    assert opened == [MANIFEST_NAME]  # read_manifest; verify_files refused before hashing any file


def test_a_symlink_inside_the_directory_is_fine(model_copy: Path) -> None:
    (model_copy / "tokenizer").mkdir()
    shutil.move(model_copy / "vocab.json", model_copy / "tokenizer" / "vocab.json")
    (model_copy / "vocab.json").symlink_to(Path("tokenizer") / "vocab.json")
    verify_files(model_copy, read_manifest(model_copy))


# The tiny model's vocabulary has 353 entries (ids 0..352): test_the_cases_know_the_vocabulary_size checks it.
TINY_VOCAB = 353


def test_the_cases_know_the_vocabulary_size(model_copy: Path) -> None:
    assert read_manifest(model_copy).model["vocab_size"] == TINY_VOCAB


BAD_IDS: dict[str, tuple[Edit, str]] = {
    "eos-past-the-end": (_set("tokens/eos", 353), "tokens.eos = 353 is outside the vocabulary [0, 353)"),
    "pad-negative": (_set("tokens/pad", -1), "tokens.pad = -1 is outside"),
    "decoder-start": (_set("tokens/decoder_start", 65000), "tokens.decoder_start = 65000 is outside"),
    "unk": (_set("tokens/unk", 10**9), "tokens.unk = 1000000000 is outside"),
    "eos-ids": (_set("tokens/eos_ids", [0, 999]), "tokens.eos_ids[1] = 999 is outside"),
    "bad-words": (_set("generation/bad_words_ids", [[1], [2, 353]]), "generation.bad_words_ids[1][1] = 353"),
    "suppress": (_set("generation/suppress_tokens", [400]), "generation.suppress_tokens[0] = 400"),
    "begin-suppress": (_set("generation/begin_suppress_tokens", [-2]), "generation.begin_suppress_tokens[0] = -2"),
    "forced-eos": (_set("generation/forced_eos_token_id", 1000), "generation.forced_eos_token_id = 1000"),
    "forced-eos-list": (_set("generation/forced_eos_token_id", [0, 353]), "generation.forced_eos_token_id[1] = 353"),
    "vocab-zero": (_set("model/vocab_size", 0), "model.vocab_size must be positive, got 0"),
}


@pytest.mark.parametrize("case", BAD_IDS)
def test_token_ids_outside_the_vocabulary_are_refused(model_copy: Path, case: str) -> None:
    _assert_refused(model_copy, BAD_IDS[case])


def test_token_ids_at_the_edges_are_accepted(model_copy: Path) -> None:
    _rewrite(model_copy, _set("generation/suppress_tokens", [0, 352]))
    assert read_manifest(model_copy).generation["suppress_tokens"] == [0, 352]


@pytest.mark.parametrize(
    ("command", "edit", "message"),
    [
        ("inspect", lambda d: d.clear(), "format_version None is not supported"),
        ("inspect", _set("model/vocab_size", "x"), "model.vocab_size should be an integer, got a string"),
        ("translate", _set("tokens/eos", 353), "tokens.eos = 353 is outside the vocabulary"),
        ("translate", _set("graphs/encoder/file", "../encoder.onnx"), "points outside the model directory"),
    ],
)
def test_the_cli_exits_2_with_one_line(model_copy: Path, command: str, edit: Edit, message: str) -> None:
    _rewrite(model_copy, edit)
    args = ["inspect", str(model_copy)] if command == "inspect" else ["translate", "-m", str(model_copy), "hi"]
    src = str(Path(onnxmt.__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": src, "COLUMNS": "1000"}
    result = subprocess.run(
        [sys.executable, "-c", "from onnxmt.cli import main; main()", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("Error: ") and message in lines[0]
    assert result.stdout == ""


def test_a_version_2_directory_loads_as_marian(model_copy: Path) -> None:
    # Version 2 wrote no language scheme and no tokenizer kind was read: every such directory is Marian's. It reads
    # as the current format (versions 2 and 3 are upgraded on reading).
    from onnxmt.runtime.translator import Translator

    def as_v2(data: dict[str, Any]) -> None:
        data["format_version"] = 2
        data["languages"].pop("scheme")

    _rewrite(model_copy, as_v2)
    manifest = read_manifest(model_copy)
    assert manifest.format_version == FORMAT_VERSION and "scheme" not in manifest.languages
    translator = Translator(model_copy)
    assert type(translator.scheme).__name__ == "TargetTokenPrefix"
    assert translator.translate(["Hello world."], max_new_tokens=4)[0].token_ids


def test_an_unknown_tokenizer_kind_names_the_supported_ones(model_copy: Path) -> None:
    from onnxmt.runtime.translator import Translator

    _rewrite(model_copy, lambda d: d["tokenizer"].update(kind="bpe-of-my-own"))
    kinds = "chat, m2m100, marian, tokenizers"
    with pytest.raises(ModelDirError, match=f"'bpe-of-my-own' is not supported; supported: {kinds}"):
        Translator(model_copy)
