"""opus-mt-tc-big and Marian's separate-vocabulary form (model_type marian): tokenizer, export and translation, token
for token against transformers (in float32: tc-big's float16 weights are upcast at export) on tiny random models
with the real checkpoint's metadata (onnxmt/testing/marian.py TcBigSpec)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from onnxmt.manifest import read_manifest
from onnxmt.runtime.translator import Translator
from tests.helpers.hf import generated_ids
from tests.helpers.sentences import SENTENCES
from tests.helpers.skips import SHARED_DATA, importorskip, shared_data

importorskip("torch")

FLORES = SHARED_DATA / "flores200"
FORMS = ["tc_big", "separate"]


def _hf(model_dir: Path):
    import torch
    import transformers

    tokenizer = transformers.MarianTokenizer.from_pretrained(model_dir)
    model = transformers.MarianMTModel.from_pretrained(model_dir, dtype=torch.float32).eval()
    return tokenizer, model


def _hf_generate(model_dir: Path, texts: list[str], beams: int | None) -> list[list[int]]:
    """transformers' generate() under the model's own generation config (`beams` None: its 4 beams)."""
    import torch

    tokenizer, model = _hf(model_dir)
    encoded = tokenizer(texts, return_tensors="pt", padding=True, truncation=True, max_length=64)
    with torch.no_grad():
        out = model.generate(**encoded, **({} if beams is None else {"num_beams": beams}))
    return generated_ids(out, model.generation_config.pad_token_id)


@pytest.mark.parametrize("form", FORMS)
def test_the_fixtures_are_what_they_stand_for(form: str, request: pytest.FixtureRequest) -> None:
    hf_dir = request.getfixturevalue(f"tiny_{form}_hf_dir")
    config = json.loads((hf_dir / "config.json").read_text())
    assert config["dtype"] == "float16" and config["eos_token_id"] == config["forced_eos_token_id"]
    assert config["pad_token_id"] == config["decoder_start_token_id"] == config["decoder_vocab_size"] - 1
    if form == "tc_big":
        assert config["eos_token_id"] not in (0, config["pad_token_id"]) and config["share_encoder_decoder_embeddings"]
    else:
        assert not config["share_encoder_decoder_embeddings"] and config["decoder_vocab_size"] < config["vocab_size"]
        assert (hf_dir / "target_vocab.json").is_file()


@pytest.mark.parametrize("form", FORMS)
def test_tokenizer_matches_transformers_on_flores(form: str, request: pytest.FixtureRequest) -> None:
    shared_data("flores200")  # skips without it, fails in CI
    hf_dir, onnx_dir = (request.getfixturevalue(f"tiny_{form}_{kind}_dir") for kind in ("hf", "onnx"))
    tokenizer, _ = _hf(hf_dir)
    translator = Translator(onnx_dir)
    texts = []
    for name in ("devtest.zho_Hans", "devtest.eng_Latn"):
        texts += (FLORES / name).read_text(encoding="utf-8").splitlines()[:150]
    expected = tokenizer(texts, truncation=True, max_length=64).input_ids
    assert [translator.encode(t, translator.prompt(None, None)) for t in texts] == expected
    assert all(row[-1] == translator.manifest.tokens["eos"] for row in expected)
    # Decoding target ids (the target vocabulary where it is separate), specials skipped.
    for ids in _hf_generate(hf_dir, SENTENCES, 1):
        assert translator.tokenizer.decode(ids) == tokenizer.decode(ids, skip_special_tokens=True)


@pytest.mark.parametrize("beams", [1, None])
@pytest.mark.parametrize("form", FORMS)
def test_translations_match_transformers(form: str, beams: int | None, request: pytest.FixtureRequest) -> None:
    """Greedy and the model's own decoding (4 beams, forced eos, pad as a bad word), padded batches and batch 1."""
    hf_dir, onnx_dir = (request.getfixturevalue(f"tiny_{form}_{kind}_dir") for kind in ("hf", "onnx"))
    translator = Translator(onnx_dir)
    expected = _hf_generate(hf_dir, SENTENCES, beams)
    got = translator.translate(SENTENCES, beams=beams, batch_size=16)
    assert [t.token_ids for t in got] == expected
    for i in (0, 3, 7):
        assert translator.translate(SENTENCES[i : i + 1], beams=beams)[0].token_ids == expected_one(hf_dir, i, beams)
    lengths = {len(t.token_ids) for t in got}
    assert len(lengths) >= 3 and min(lengths) <= 5 and max(lengths) >= 40  # short and long outputs alike


def expected_one(hf_dir: Path, i: int, beams: int | None) -> list[int]:
    return _hf_generate(hf_dir, SENTENCES[i : i + 1], beams)[0]


@pytest.mark.parametrize("form", FORMS)
def test_export_upcasts_and_records_the_ids(form: str, request: pytest.FixtureRequest) -> None:
    hf_dir, onnx_dir = (request.getfixturevalue(f"tiny_{form}_{kind}_dir") for kind in ("hf", "onnx"))
    config = json.loads((hf_dir / "config.json").read_text())
    manifest = read_manifest(onnx_dir)
    assert manifest.tokens["eos"] == config["eos_token_id"] and manifest.tokens["pad"] == config["pad_token_id"]
    assert manifest.model["vocab_size"] == config["decoder_vocab_size"]
    assert manifest.generation["forced_eos_token_id"] == config["eos_token_id"]
    assert max(manifest.provenance["check"].values()) < 1e-4  # float32 graphs against the upcast PyTorch model
    files = set(manifest.files)
    assert ("target_vocab.json" in files) is (form == "separate")
    assert manifest.tokenizer["separate_vocabs"] is (form == "separate")


def test_validate_and_quantize_work_on_tc_big(tiny_tc_big_onnx_dir: Path, tiny_tc_big_hf_dir: Path, tmp_path) -> None:
    from onnxmt.export.quantize import QuantizeOptions, quantize
    from onnxmt.export.validate import ValidateOptions, validate
    from onnxmt.runtime.options import DecodeOptions, RuntimeOptions

    texts = SENTENCES[:6]
    options = ValidateOptions(DecodeOptions(beams=4), RuntimeOptions(threads=1))
    report = validate(tiny_tc_big_onnx_dir, str(tiny_tc_big_hf_dir), texts, options)
    assert report.tokenizer_identical == report.greedy_identical == report.beam_identical == len(texts)
    assert report.max_abs_logit_diff < 1e-4
    for name, quantize_options in (("int8", QuantizeOptions()), ("int4", QuantizeOptions(int4=True))):
        out = tmp_path / name
        quantize(tiny_tc_big_onnx_dir, out, quantize_options, progress=lambda _: None)
        translated = Translator(out).translate(texts, beams=1, max_new_tokens=8)
        assert all(len(t.token_ids) >= 1 for t in translated)


def test_export_names_a_missing_tokenizer_file(tiny_tc_big_hf_dir: Path, tmp_path: Path) -> None:
    from onnxmt.export.exporter import ExportError, ExportOptions, export

    broken = Path(shutil.copytree(tiny_tc_big_hf_dir, tmp_path / "broken"))
    (broken / "target.spm").unlink()
    with pytest.raises(ExportError, match=r"target.spm: missing; a marian model directory needs source.spm"):
        export(str(broken), tmp_path / "out", ExportOptions(check=False), progress=lambda _: None)
    assert not (tmp_path / "out").exists()
