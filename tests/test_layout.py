"""Transformers.js / onnx-community directories (variants as file-name suffixes under `onnx/`) load, the variant is
chosen as documented, and a directory that cannot be loaded is described by what it holds and what it lacks.

The directory is `tiny_optimum_merged_dir` laid out as those repositories are, with variants made as Transformers.js
makes them (tests/conftest.py). fp32 is token-identical to transformers' generate(); the other variants are measured
against fp32 on this tiny random model, whose near-tied logits make it a harsh test for quantization.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from onnxmt.cli import app
from onnxmt.layout import DEFAULT_VARIANT_ORDER, find_variants, select_variant
from onnxmt.manifest import MANIFEST_NAME, ModelDirError
from onnxmt.models import resolve_model_dir
from onnxmt.runtime.options import RuntimeOptions
from onnxmt.runtime.translator import Translator
from tests.helpers.hf import generated_ids
from tests.helpers.skips import importorskip

torch = importorskip("torch")
transformers = importorskip("transformers")

runner = CliRunner()
SENTENCES = [
    "a",
    "This through so.",
    "What is this?",
    "In paper way many such must heavy it because just over.",
    "Here story music back under while morning must off some the.",
    "The river was quiet in the morning, and the market of the old city was closed.",
    "Green, yellow, bright and heavy: the number of windows in this school is more than the men who work there.",
    "My friend is a doctor, and his family came to the city from the mountain before the evening music.",
    "Good morning!",
    "He came from the city with three friends and a green paper for the school market.",
    "music",
    "Could these two may first then do any like my now over such our man me even most made after also did",
    "The doctor and the letter",
    "where much your way well down should because each just those people how too",
    "Hello world.",
    "The river is long and the mountain is high",
]
PRESENT = "variants present: fp32, quantized, uint8, q4, fp16; incomplete: q4f16 (encoder only)"
# How many of the 16 SENTENCES a variant translates token-identically to fp32, and how many start with fp32's first
# token, (greedy, beam 4), at the model's full length (up to 63 tokens). Measured (ORT 1.32, 2 threads): identical
# quantized 4/1, uint8 5/3, q4 1/0, fp16 15/13; first token quantized 8/10, uint8 10/11, q4 4/3, fp16 16/16. The
# floors are one sentence below. Random weights put many logits within quantization noise of each other, so real
# models agree far more; what these floors catch is a variant that runs the wrong graphs or feeds them wrong: then
# even the first token agrees by chance only (1 in 353).
FLOORS = {
    "quantized": ((3, 0), (7, 9)),
    "uint8": ((4, 2), (9, 10)),
    "q4": ((0, 0), (3, 2)),
    "fp16": ((14, 12), (15, 15)),
}


def _reference(hf_dir: Path, texts: list[str], beams: int) -> list[list[int]]:
    """transformers' generate() token ids: decoder start dropped, trailing padding dropped, eos kept."""
    tokenizer = transformers.MarianTokenizer.from_pretrained(hf_dir)
    model = transformers.MarianMTModel.from_pretrained(hf_dir).eval()
    encoded = tokenizer(texts, return_tensors="pt", padding=True, truncation=True, max_length=64)
    with torch.no_grad():
        out = model.generate(**encoded, num_beams=beams)
    return generated_ids(out, model.generation_config.pad_token_id)


@pytest.fixture(scope="module")
def fp32_ids(tiny_transformersjs_dir: Path) -> dict[int, list[list[int]]]:
    translator = Translator(tiny_transformersjs_dir, RuntimeOptions(variant="fp32"))
    return {b: [t.token_ids for t in translator.translate(SENTENCES, beams=b, batch_size=8)] for b in (1, 4)}


def test_variants_are_found_by_suffix(tiny_transformersjs_dir: Path) -> None:
    variants = find_variants(tiny_transformersjs_dir)
    assert list(variants) == ["fp32", "quantized", "uint8", "q4", "fp16", "q4f16"]
    assert variants["q4"] == {
        "encoder": "onnx/encoder_model_q4.onnx",
        "decoder_merged": "onnx/decoder_model_merged_q4.onnx",
    }
    assert variants["q4f16"] == {"encoder": "onnx/encoder_model_q4f16.onnx"}


@pytest.mark.parametrize("beams", [1, 4])
def test_the_default_is_fp32_and_matches_transformers(
    tiny_transformersjs_dir: Path, tiny_hf_dir: Path, fp32_ids: dict[int, list[list[int]]], beams: int
) -> None:
    translator = Translator(tiny_transformersjs_dir)
    assert translator.manifest.provenance["variant"] == "fp32"
    assert translator.manifest.quantization is None
    got = [t.token_ids for t in translator.translate(SENTENCES, beams=beams, batch_size=8)]
    assert got == _reference(tiny_hf_dir, SENTENCES, beams) == fp32_ids[beams]


@pytest.mark.parametrize("beams", [1, 4])
@pytest.mark.parametrize("variant", FLOORS)
def test_quantized_variants_agree_with_fp32(
    tiny_transformersjs_dir: Path, fp32_ids: dict[int, list[list[int]]], variant: str, beams: int
) -> None:
    translator = Translator(tiny_transformersjs_dir, RuntimeOptions(variant=variant))
    manifest = translator.manifest
    assert manifest.provenance["variant"] == variant
    assert all(f"_{variant}.onnx" in g.file for g in manifest.graphs.values())
    got = [t.token_ids for t in translator.translate(SENTENCES, beams=beams, batch_size=8)]
    assert all(ids for ids in got)
    pairs = list(zip(got, fp32_ids[beams], strict=True))
    identical = sum(a == b for a, b in pairs)
    first = sum(a[0] == b[0] for a, b in pairs)
    n = len(SENTENCES)
    print(f"{variant} beams={beams}: {identical}/{n} token-identical to fp32, {first}/{n} with the same first token")
    floors = FLOORS[variant]
    assert identical >= floors[0][beams > 1] and first >= floors[1][beams > 1]


def test_fp16_graphs_take_and_return_fp16(tiny_transformersjs_dir: Path) -> None:
    manifest = Translator(tiny_transformersjs_dir, RuntimeOptions(variant="fp16")).manifest
    decoder = manifest.graphs["decoder_merged"]
    dtypes = {t.role: t.dtype for t in [*decoder.inputs, *decoder.outputs]}
    assert dtypes["encoder_hidden_states"] == dtypes["past_key.0"] == dtypes["logits"] == "float16"


def test_without_fp32_the_first_complete_variant_in_the_documented_order_loads(
    tiny_transformersjs_dir: Path, tmp_path: Path
) -> None:
    only = shutil.copytree(tiny_transformersjs_dir, tmp_path / "model")
    for path in (only / "onnx").iterdir():
        if not path.name.endswith(("_q4.onnx", "_quantized.onnx")):
            path.unlink()
    assert DEFAULT_VARIANT_ORDER.index("quantized") < DEFAULT_VARIANT_ORDER.index("q4")
    assert resolve_model_dir(str(only)) == only
    translator = Translator(only)
    assert translator.manifest.provenance["variant"] == "quantized"
    assert translator.translate(["Hello world."], max_new_tokens=3)[0].token_ids


def test_optimums_quantized_files_load(tiny_optimum_int8_dir: Path) -> None:
    # Optimum's quantizer writes `*_quantized.onnx` at the top and nothing else: the "quantized" variant.
    translator = Translator(tiny_optimum_int8_dir)
    assert translator.manifest.provenance["variant"] == "quantized"
    assert translator.manifest.layout == "optimum"
    assert translator.translate(["Hello world."], max_new_tokens=3)[0].token_ids


def test_the_variant_option_picks_and_is_reported(tiny_transformersjs_dir: Path) -> None:
    expected = Translator(tiny_transformersjs_dir, RuntimeOptions(variant="q4")).translate(["Hello world."])[0].text
    args = ["translate", "-m", str(tiny_transformersjs_dir), "--variant", "q4", "Hello world."]
    result = runner.invoke(app, args, env={"COLUMNS": "300"})
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == [expected]
    assert "variant: q4 (also present: fp32, quantized, uint8, fp16; choose with --variant)" in result.stderr
    # The Transformers.js dtype name of `_quantized` is q8; the environment variable works like the flag.
    env = {"COLUMNS": "300", "ONNXMT_VARIANT": "q8"}
    inspect = runner.invoke(app, ["inspect", str(tiny_transformersjs_dir)], env=env)
    assert inspect.exit_code == 0, inspect.output
    assert "variant                 │ quantized (also present" in inspect.stdout
    assert "onnx/decoder_model_merged_quantized.onnx" in inspect.stdout


def test_a_missing_variant_names_the_present_ones(tiny_transformersjs_dir: Path) -> None:
    for missing in ("int8", "q4f16", "bnb4"):
        with pytest.raises(ModelDirError, match=re.escape(f"no complete '{missing}' variant; {PRESENT}")):
            Translator(tiny_transformersjs_dir, RuntimeOptions(variant=missing))
    result = runner.invoke(app, ["translate", "-m", str(tiny_transformersjs_dir), "--variant", "int8", "hi"])
    assert result.exit_code == 2
    assert PRESENT in " ".join(result.output.split())


def test_an_unknown_variant_name_lists_the_valid_ones() -> None:
    with pytest.raises(ValueError, match="unknown variant 'int3'; valid: fp32, quantized, int8, uint8, q4, bnb4"):
        RuntimeOptions(variant="int3")


def test_an_onnxmt_directory_holds_one_variant(tiny_onnx_dir: Path) -> None:
    assert Translator(tiny_onnx_dir, RuntimeOptions(variant="fp32")).manifest.layout == "onnxmt"
    with pytest.raises(ModelDirError, match="no 'int8' variant; this onnxmt directory holds fp32 only"):
        Translator(tiny_onnx_dir, RuntimeOptions(variant="int8"))


def _copy(source: Path, out: Path, keep: tuple[str, ...]) -> Path:
    out.mkdir()
    for name in keep:
        shutil.copy2(source / name, out / name)
    return out


TOKENIZER = ("config.json", "generation_config.json", "source.spm", "target.spm", "vocab.json", "tokenizer_config.json")


def _errors(directory: Path) -> list[str]:
    """The message of every way to load `directory`: the library, `resolve_model_dir`, the CLI (exit code 2)."""
    with pytest.raises(ModelDirError) as library:
        Translator(directory)
    with pytest.raises(ModelDirError) as resolved:
        resolve_model_dir(str(directory))
    result = runner.invoke(app, ["translate", "-m", str(directory), "hi"])
    assert result.exit_code == 2 and "Traceback" not in result.output
    messages = [str(library.value), str(resolved.value), " ".join(result.output.split())]
    return messages


def test_a_weightless_directory_is_incomplete_not_pytorch(tiny_hf_dir: Path, tmp_path: Path) -> None:
    directory = _copy(tiny_hf_dir, tmp_path / "model", TOKENIZER)
    for message in _errors(directory):
        assert "incomplete model directory: found config.json, generation_config.json, source.spm" in message
        assert "need onnxmt.json with encoder.onnx and decoder.onnx (onnxmt export), or encoder_model*.onnx" in message
        assert "PyTorch" not in message


def test_a_missing_onnxmt_manifest_is_reported_as_such(tiny_onnx_dir: Path, tmp_path: Path) -> None:
    directory = Path(shutil.copytree(tiny_onnx_dir, tmp_path / "model"))
    (directory / MANIFEST_NAME).unlink()
    for message in _errors(directory):
        assert f"{MANIFEST_NAME} is missing; the directory holds onnxmt's encoder.onnx and decoder.onnx" in message
        assert "PyTorch" not in message


def test_an_encoder_without_a_decoder_is_an_incomplete_export(tiny_transformersjs_dir: Path, tmp_path: Path) -> None:
    directory = _copy(tiny_transformersjs_dir, tmp_path / "model", TOKENIZER)
    (directory / "onnx").mkdir()
    shutil.copy2(tiny_transformersjs_dir / "onnx" / "encoder_model_quantized.onnx", directory / "onnx")
    for message in _errors(directory):
        assert "incomplete Optimum/Transformers.js export, variants present: none; incomplete: quantized" in message


def test_a_pytorch_directory_is_still_one(tiny_hf_dir: Path) -> None:
    weights = "model.safetensors" if (tiny_hf_dir / "model.safetensors").is_file() else "pytorch_model.bin"
    message = _errors(tiny_hf_dir)[0]
    assert f"is a PyTorch model directory ({weights}), not an exported one; run `onnxmt export" in message


def test_an_empty_directory_says_so(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    assert "found nothing (an empty directory)" in _errors(tmp_path / "empty")[0]


def test_select_variant_prefers_the_top_level(tiny_transformersjs_dir: Path, tmp_path: Path) -> None:
    directory = Path(shutil.copytree(tiny_transformersjs_dir, tmp_path / "model"))
    for stem in ("encoder_model", "decoder_model_merged"):
        os.link(directory / "onnx" / f"{stem}_uint8.onnx", directory / f"{stem}_uint8.onnx")
    name, files = select_variant(directory, "uint8")
    assert name == "uint8" and files["encoder"] == "encoder_model_uint8.onnx"
