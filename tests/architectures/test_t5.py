"""T5 (model_type t5): t5-small's layout and MADLAD-400's, exported and translated token for token as transformers on
tiny random models (onnxmt/testing/t5.py), decoding past the 128 positions where the relative buckets saturate."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from onnxmt.manifest import read_manifest
from onnxmt.runtime.translator import Translator
from tests.helpers.hf import hf_special_tokens
from tests.helpers.sentences import SENTENCES
from tests.helpers.skips import SHARED_DATA, importorskip, shared_data

importorskip("torch")

FLORES = SHARED_DATA / "flores200"
# (fixture stem, the code onnxmt is given, the text transformers is given before the source); mt5-base names no
# task, so its text goes as it is.
FORMS = [("t5", "de", "translate English to German: "), ("madlad", "zh", "<2zh> "), ("mt5", None, "")]


def _hf(model_dir: Path):
    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    return tokenizer, transformers.AutoModelForSeq2SeqLM.from_pretrained(model_dir).eval()


def _hf_generate(model_dir: Path, texts: list[str], prefix: str, **kwargs) -> list[list[int]]:
    import torch

    tokenizer, model = _hf(model_dir)
    encoded = tokenizer([prefix + t for t in texts], return_tensors="pt", padding=True, truncation=True, max_length=256)
    with torch.no_grad():
        out = model.generate(**encoded, **kwargs)
    eos, pad = model.config.eos_token_id, model.config.pad_token_id
    rows = []
    for row in out.tolist():
        row = row[1:]  # the decoder start
        row = row[: row.index(eos) + 1] if eos in row else row
        while row and row[-1] == pad and pad != eos:
            row.pop()
        rows.append(row)
    return rows


@pytest.mark.parametrize(("form", "code", "prefix"), FORMS)
def test_tokenizer_matches_transformers_on_flores(form: str, code: str | None, prefix: str, request) -> None:
    shared_data("flores200")  # skips without it, fails in CI
    hf_dir, onnx_dir = (request.getfixturevalue(f"tiny_{form}_{kind}_dir") for kind in ("hf", "onnx"))
    tokenizer, _ = _hf(hf_dir)
    translator = Translator(onnx_dir)
    texts = []
    for name in ("devtest.eng_Latn", "devtest.zho_Hans"):
        texts += (FLORES / name).read_text(encoding="utf-8").splitlines()[:100]
    prompt = translator.prompt(None, code)
    assert prompt.text == prefix
    ours = [translator.encode(t, prompt) for t in texts]
    if form == "madlad":
        # transformers 5's T5Tokenizer rebuilds the unigram model with unk_id 2 whatever tokenizer.json says: a
        # character outside MADLAD's vocabulary becomes </s> (2) there, <unk> (0) here. Lines without one match.
        unknown = [0 in ids for ids in ours]
        assert 10 < sum(unknown) < len(texts) - 50  # the Chinese lines have some (the tiny vocab has few hanzi)
        texts = [t for t, u in zip(texts, unknown, strict=True) if not u]
        ours = [ids for ids, u in zip(ours, unknown, strict=True) if not u]
    # Truncated where onnxmt truncates: the model's positions (t5 and MADLAD: n_positions 256; mT5 names none: 512).
    limit = translator.tokenizer.model_max_length
    expected = tokenizer([prefix + t for t in texts], truncation=True, max_length=limit).input_ids
    assert ours == expected
    for ids in expected[:30]:
        assert translator.tokenizer.decode(ids) == tokenizer.decode(ids, skip_special_tokens=True)


@pytest.mark.parametrize("beams", [1, 3])
@pytest.mark.parametrize(("form", "code", "prefix"), FORMS)
def test_long_outputs_match_transformers_past_the_saturated_buckets(
    form: str, code: str | None, prefix: str, beams: int, request
) -> None:
    """140 new tokens (forced), so every step past 128 reads saturated buckets: a padded batch and one alone."""
    hf_dir, onnx_dir = (request.getfixturevalue(f"tiny_{form}_{kind}_dir") for kind in ("hf", "onnx"))
    translator = Translator(onnx_dir)
    texts = SENTENCES[:6]
    forced = {"num_beams": beams, "max_new_tokens": 140, "min_new_tokens": 140}
    expected = _hf_generate(hf_dir, texts, prefix, **forced)
    got = translator.translate(texts, target_lang=code, beams=beams, max_new_tokens=140, min_new_tokens=140)
    assert [t.token_ids for t in got] == expected
    one = translator.translate(texts[2:3], target_lang=code, beams=beams, max_new_tokens=140, min_new_tokens=140)
    assert one[0].token_ids == _hf_generate(hf_dir, texts[2:3], prefix, **forced)[0]


@pytest.mark.parametrize("beams", [1, 4])
@pytest.mark.parametrize(("form", "code", "prefix"), FORMS)
def test_translations_match_transformers(form: str, code: str | None, prefix: str, beams: int, request) -> None:
    hf_dir, onnx_dir = (request.getfixturevalue(f"tiny_{form}_{kind}_dir") for kind in ("hf", "onnx"))
    expected = _hf_generate(hf_dir, SENTENCES, prefix, num_beams=beams)
    got = Translator(onnx_dir).translate(SENTENCES, target_lang=code, beams=beams, batch_size=16)
    assert [t.token_ids for t in got] == expected
    assert len({len(t.token_ids) for t in got}) >= 2  # the outputs end at different steps


def test_madlad_mixes_target_languages_in_one_batch(tiny_madlad_onnx_dir: Path, tiny_madlad_hf_dir: Path) -> None:
    translator = Translator(tiny_madlad_onnx_dir)
    assert {"en", "zh", "de", "fr"} <= set(translator.manifest.languages["target_tokens"])
    texts, targets = SENTENCES[:6], ["zh", "de", "fr"] * 2
    got = translator.translate(texts, target_lang=targets, beams=1, max_new_tokens=30, min_new_tokens=30)
    for i, target in enumerate(targets):
        expected = _hf_generate(tiny_madlad_hf_dir, [texts[i]], f"<2{target}> ", max_new_tokens=30, min_new_tokens=30)
        assert got[i].token_ids == expected[0], (i, target)
    assert (
        translator.translate(["Hello."], target_lang="zh-Hans", beams=1)[0].token_ids
        == translator.translate(["Hello."], target_lang="zh", beams=1)[0].token_ids
    )


def test_t5_translates_only_the_pairs_its_config_names(tiny_t5_onnx_dir: Path) -> None:
    manifest = read_manifest(tiny_t5_onnx_dir)
    assert manifest.architecture == "t5" and manifest.languages["source"] == "en"
    assert set(manifest.languages["target_tokens"]) == {"de", "fr", "ro"}
    with pytest.raises(ValueError, match="unknown target language 'zh'"):
        Translator(tiny_t5_onnx_dir).translate(["Hello."], target_lang="zh")
    assert max(manifest.provenance["check"].values()) < 1e-4


@pytest.mark.parametrize(("form", "code", "prefix"), FORMS)
def test_per_row_int8_and_int4_translate_sanely(form: str, code: str | None, prefix: str, request, tmp_path) -> None:
    """int4 matters most here (MADLAD-3B): its graphs load (no ReduceMean, whose axes input the quantizer's opset 21
    needs) and, like per-row int8, start as fp32 does; no output is all `<unk>` (what fp16 gives MADLAD)."""
    from onnxmt.export.quantize import QuantizeOptions, quantize

    onnx_dir = request.getfixturevalue(f"tiny_{form}_onnx_dir")
    reference = [t.token_ids for t in Translator(onnx_dir).translate(SENTENCES, target_lang=code, beams=1)]
    # (options, how many of the 16 outputs start with fp32's first token at least; measured: 16, and 12 to 13)
    for options, agreeing in ((QuantizeOptions(per_row_scales=True), 15), (QuantizeOptions(int4=True), 10)):
        out = tmp_path / ("int4" if options.int4 else "rows")
        quantize(onnx_dir, out, options, progress=lambda _: None)
        translator = Translator(out)
        assert translator.manifest.quantization is not None
        got = [t.token_ids for t in translator.translate(SENTENCES, target_lang=code, beams=1)]
        assert sum(g[:1] == r[:1] for g, r in zip(got, reference, strict=True)) >= agreeing, (out.name, got)
        tokens = [t for ids in got for t in ids]
        assert tokens.count(translator.manifest.tokens["unk"]) < len(tokens) / 10, out.name


def test_mt5_export_writes_transformers_tokenizer_json(tiny_mt5_hf_dir: Path, tiny_mt5_onnx_dir: Path) -> None:
    """mT5 ships only spiece.model: the export writes T5Tokenizer's conversion, with mT5's ids and no extra ids."""
    import torch

    tokenizer, model = _hf(tiny_mt5_hf_dir)
    assert not (tiny_mt5_hf_dir / "tokenizer.json").exists() and type(model).__name__ == "MT5ForConditionalGeneration"
    assert not torch.equal(model.lm_head.weight, model.shared.weight)  # a head of its own, as mt5-base's
    manifest = read_manifest(tiny_mt5_onnx_dir)
    assert manifest.architecture == "mt5" and "tokenizer.json" in manifest.files
    expected = hf_special_tokens(tokenizer, model)
    assert manifest.tokens == {**expected, "eos_ids": [expected["eos"]]}
    assert manifest.languages["target_tokens"] == {} and max(manifest.provenance["check"].values()) < 1e-4
    translator = Translator(tiny_mt5_onnx_dir)
    vocab = tokenizer.get_vocab()
    assert len(vocab) == manifest.model["vocab_size"] and not any(t.startswith("<extra_id_") for t in vocab)
    assert all(translator.tokenizer.token_id(token) == index for token, index in vocab.items())


def test_mt5_export_refuses_a_directory_without_a_tokenizer(tiny_mt5_hf_dir: Path, tmp_path: Path) -> None:
    from onnxmt.export.exporter import ExportError, ExportOptions, export

    broken = Path(shutil.copytree(tiny_mt5_hf_dir, tmp_path / "broken"))
    (broken / "spiece.model").unlink()
    with pytest.raises(ExportError, match="an mT5 model directory needs tokenizer.json or spiece.model"):
        export(str(broken), tmp_path / "out", ExportOptions(check=False), progress=lambda _: None)
    assert not (tmp_path / "out").exists()


def test_madlad_without_a_length_in_its_configs_stops_at_transformers_default(
    tiny_madlad_no_length_hf_dir: Path, tiny_madlad_no_length_onnx_dir: Path, tiny_madlad_onnx_dir: Path
) -> None:
    """MADLAD's generation config names only ids: generate() then makes at most 20 new tokens (GenerationConfig's
    max_length 20, counted after the decoder start), and so does onnxmt; `onnxmt inspect` says so."""
    from typer.testing import CliRunner

    from onnxmt.cli import app

    manifest = read_manifest(tiny_madlad_no_length_onnx_dir)
    assert "max_length" not in manifest.generation and "max_new_tokens" not in manifest.generation
    translator = Translator(tiny_madlad_no_length_onnx_dir)
    for beams in (1, 4):
        got = translator.translate(SENTENCES, target_lang="zh", beams=beams)
        expected = _hf_generate(tiny_madlad_no_length_hf_dir, SENTENCES, "<2zh> ", num_beams=beams)
        assert [t.token_ids for t in got] == expected
        assert max(len(t.token_ids) for t in got) == 20  # some reach the limit

    for directory, line in (
        (tiny_madlad_no_length_onnx_dir, "at most 20 new tokens: transformers' default, as the model's configs name"),
        (tiny_madlad_onnx_dir, "at most 255 new tokens (the model's max_length 256)"),
    ):
        result = CliRunner().invoke(app, ["inspect", str(directory)], env={"COLUMNS": "400"})
        assert result.exit_code == 0, result.output
        assert line in " ".join(result.output.split())


def test_the_madlad_fixture_has_a_head_of_its_own(tiny_madlad_hf_dir: Path, tiny_t5_hf_dir: Path) -> None:
    """MADLAD's checkpoint holds `lm_head` apart from `shared` (transformers 5 unties them on load only then; its
    T5Config ties them whatever it is told), and t5's ties them: the fixtures are built so, and the parity tests
    above run both forms."""
    import torch
    from transformers import T5ForConditionalGeneration

    madlad = T5ForConditionalGeneration.from_pretrained(str(tiny_madlad_hf_dir))
    assert not torch.equal(madlad.lm_head.weight, madlad.shared.weight) and not madlad.config.scale_decoder_outputs
    t5 = T5ForConditionalGeneration.from_pretrained(str(tiny_t5_hf_dir))
    assert t5.lm_head.weight.data_ptr() == t5.shared.weight.data_ptr() and t5.config.scale_decoder_outputs


@pytest.mark.parametrize(("form", "code", "prefix"), FORMS)
def test_validate_passes_on_the_family(form: str, code: str | None, prefix: str, request) -> None:
    """`onnxmt validate` on t5, MADLAD and mT5 (whose configs have no max_position_embeddings): token-identical,
    greedy and beam, with the reference run and freed before the ONNX side."""
    from onnxmt.export.validate import ValidateOptions, validate
    from onnxmt.runtime.options import DecodeOptions

    hf_dir, onnx_dir = (request.getfixturevalue(f"tiny_{form}_{kind}_dir") for kind in ("hf", "onnx"))
    options = ValidateOptions(decoding=DecodeOptions(beams=2, max_new_tokens=12), target_lang=code)
    report = validate(onnx_dir, str(hf_dir), SENTENCES[:4], options)
    assert report.greedy_identical == report.beam_identical == report.tokenizer_identical == 4
    assert report.max_abs_logit_diff < 1e-3
