"""M2M100 and NLLB-200 (model_type m2m_100): tokenizers, export and translation, token for token against
transformers on tiny random models with the real checkpoints' metadata (onnxmt/testing/m2m100.py)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from onnxmt.manifest import read_manifest
from onnxmt.runtime.options import BatchLimits, DecodeOptions, RuntimeOptions
from onnxmt.runtime.translator import Translator
from tests.helpers.hf import M2M100_PAIRS, NLLB_PAIRS, generated_ids, hf_language_id, hf_m2m100, hf_special_tokens
from tests.helpers.sentences import SENTENCES
from tests.helpers.skips import SHARED_DATA, importorskip, shared_data

importorskip("torch")

FLORES = SHARED_DATA / "flores200"


def _flores(limit: int = 150) -> list[str]:
    shared_data("flores200")  # skips without it, fails in CI
    lines = []
    for name in ("devtest.eng_Latn", "devtest.zho_Hans"):
        lines += (FLORES / name).read_text(encoding="utf-8").splitlines()[:limit]
    return lines


def _hf_generate(model_dir: Path, texts: list[str], source: str, target: str, beams: int) -> list[list[int]]:
    import torch

    tokenizer, model = hf_m2m100(model_dir)
    tokenizer.src_lang = source
    limit = model.config.max_position_embeddings
    encoded = tokenizer(texts, return_tensors="pt", padding=True, truncation=True, max_length=limit)
    with torch.no_grad():
        out = model.generate(**encoded, num_beams=beams, forced_bos_token_id=hf_language_id(tokenizer, target))
    return generated_ids(out, model.generation_config.pad_token_id)


@pytest.mark.parametrize("family", ["m2m100", "nllb"])
def test_tokenizer_matches_transformers_on_flores(family: str, request: pytest.FixtureRequest) -> None:
    onnx_dir = request.getfixturevalue(f"tiny_{family}_onnx_dir")
    hf_dir = request.getfixturevalue(f"tiny_{family}_hf_dir")
    tokenizer, _ = hf_m2m100(hf_dir)
    translator = Translator(onnx_dir)
    kind = {"m2m100": "m2m100", "nllb": "tokenizers"}[family]
    assert translator.manifest.tokenizer["kind"] == kind
    texts = _flores()
    sources = ("en", "zh", "fr") if family == "m2m100" else ("eng_Latn", "zho_Hans", "fra_Latn")
    for source in sources:
        tokenizer.src_lang = source
        expected = tokenizer(texts, truncation=True, max_length=64).input_ids
        prompt = translator.prompt(source, sources[1])
        assert [translator.encode(t, prompt) for t in texts] == expected, source
    # Decoding: the ids of real text, plus language tokens and specials that decoding must skip.
    for ids in expected[:50]:
        noisy = [ids[0], 2, *ids, 1, 3]
        assert translator.tokenizer.decode(noisy) == tokenizer.decode(noisy, skip_special_tokens=True)


@pytest.mark.parametrize("beams", [1, 4])
@pytest.mark.parametrize("family", ["m2m100", "nllb"])
def test_translations_match_transformers(family: str, beams: int, request: pytest.FixtureRequest) -> None:
    onnx_dir = request.getfixturevalue(f"tiny_{family}_onnx_dir")
    hf_dir = request.getfixturevalue(f"tiny_{family}_hf_dir")
    source, targets = M2M100_PAIRS if family == "m2m100" else NLLB_PAIRS
    translator = Translator(onnx_dir)
    lengths = set()
    for target in targets:
        expected = _hf_generate(hf_dir, SENTENCES, source, target, beams)
        got = translator.translate(SENTENCES, source_lang=source, target_lang=target, beams=beams, batch_size=16)
        assert [t.token_ids for t in got] == expected, target
        lengths |= {len(t.token_ids) for t in got}
        # One sentence alone: the same as transformers on that sentence alone.
        one = translator.translate(SENTENCES[3:4], source_lang=source, target_lang=target, beams=beams)
        assert one[0].token_ids == _hf_generate(hf_dir, SENTENCES[3:4], source, target, beams)[0]
    assert len(lengths) >= 5 and min(lengths) <= 5 and max(lengths) >= 20  # short and long outputs alike


@pytest.mark.parametrize("beams", [1, 4])
@pytest.mark.parametrize("family", ["m2m100", "nllb"])
def test_a_batch_may_mix_target_and_source_languages(family: str, beams: int, request: pytest.FixtureRequest) -> None:
    onnx_dir = request.getfixturevalue(f"tiny_{family}_onnx_dir")
    hf_dir = request.getfixturevalue(f"tiny_{family}_hf_dir")
    source, (first, second) = M2M100_PAIRS if family == "m2m100" else NLLB_PAIRS
    texts = SENTENCES[:8]
    targets = [first, second] * 4
    got = Translator(onnx_dir).translate(texts, source_lang=source, target_lang=targets, beams=beams, batch_size=8)
    for target in (first, second):
        rows = [i for i, t in enumerate(targets) if t == target]
        for i in rows:  # transformers cannot mix them in one batch: one sentence at a time
            assert got[i].token_ids == _hf_generate(hf_dir, [texts[i]], source, target, beams)[0], (i, target)
    assert {got[i].token_ids[0] for i in range(len(texts))} == {
        hf_language_id(hf_m2m100(hf_dir)[0], first),
        hf_language_id(hf_m2m100(hf_dir)[0], second),
    }


@pytest.mark.parametrize("family", ["m2m100", "nllb"])
def test_export_writes_the_language_scheme_and_checks_logits(family: str, request: pytest.FixtureRequest) -> None:
    manifest = read_manifest(request.getfixturevalue(f"tiny_{family}_onnx_dir"))
    assert manifest.architecture == "m2m_100"
    expected = hf_special_tokens(*hf_m2m100(request.getfixturevalue(f"tiny_{family}_hf_dir")))
    assert {name: manifest.tokens[name] for name in expected} == expected
    langs = manifest.languages
    assert langs["scheme"] == "language_tokens" and langs["source_token_last"] is False
    if family == "nllb":
        assert len(langs["target_tokens"]) == 202 and langs["target_tokens"]["zho_Hans"] == "zho_Hans"
        assert langs["default_source"] == "eng_Latn" and "tokenizer.json" in manifest.files
    else:
        assert len(langs["target_tokens"]) == 100 and langs["target_tokens"]["en"] == "__en__"
        assert langs["default_source"] == "en" and "sentencepiece.bpe.model" in manifest.files
    check = manifest.provenance["check"]
    assert max(check.values()) < 1e-4, check  # encoder, first-step and cached-step logits against PyTorch


def test_unknown_language_codes_name_the_valid_ones(tiny_nllb_onnx_dir: Path) -> None:
    translator = Translator(tiny_nllb_onnx_dir)
    with pytest.raises(ValueError, match="unknown target language 'xx_Yyyy'; valid: .*zho_Hans"):
        translator.translate(["Hello."], target_lang="xx_Yyyy")
    with pytest.raises(ValueError, match="this model needs a target language"):
        translator.translate(["Hello."])
    with pytest.raises(ValueError, match="unknown source language"):
        translator.translate(["Hello."], source_lang="xx_Yyyy", target_lang="zho_Hans")


def test_nllb_legacy_behaviour_puts_the_source_token_last(tiny_nllb_hf_dir: Path, tmp_path: Path) -> None:
    import shutil

    from onnxmt.architectures import scheme_for
    from onnxmt.architectures.m2m100 import Nllb
    from onnxmt.tokenization import JsonTokenizer

    legacy = Path(shutil.copytree(tiny_nllb_hf_dir, tmp_path / "legacy"))
    config = json.loads((legacy / "tokenizer_config.json").read_text())
    (legacy / "tokenizer_config.json").write_text(json.dumps({**config, "legacy_behaviour": True}))
    tokenizer, _ = hf_m2m100(legacy)
    tokenizer.src_lang = "fra_Latn"
    ours = JsonTokenizer.from_dir(legacy)
    ours.model_max_length = 64  # as the Translator sets it: the model's positions
    scheme = scheme_for(Nllb().languages(legacy, None), ours.token_id)
    prompt = scheme.prompt("fra_Latn", "eng_Latn")
    texts = SENTENCES[:20]
    expected = tokenizer(texts, truncation=True, max_length=64).input_ids
    assert [ours.encode(t, prefix=prompt.prefix, suffix=prompt.suffix) for t in texts] == expected
    assert expected[0][-2:] == [2, tokenizer.convert_tokens_to_ids("fra_Latn")]


def test_cli_translates_with_source_and_target_languages(tiny_nllb_onnx_dir: Path, tiny_nllb_hf_dir: Path) -> None:
    from typer.testing import CliRunner

    from onnxmt.cli import app

    text = SENTENCES[5]
    args = [
        "translate",
        "--model",
        str(tiny_nllb_onnx_dir),
        "--source-lang",
        "eng_Latn",
        "--target-lang",
        "fra_Latn",
        "--beams",
        "1",
    ]
    result = CliRunner().invoke(app, args, input=text + "\n")
    assert result.exit_code == 0, result.output
    expected = Translator(tiny_nllb_onnx_dir).translate([text], source_lang="eng_Latn", target_lang="fra_Latn", beams=1)
    assert result.stdout.strip() == expected[0].text
    tokenizer, _ = hf_m2m100(tiny_nllb_hf_dir)
    ids = _hf_generate(tiny_nllb_hf_dir, [text], "eng_Latn", "fra_Latn", 1)[0]
    assert expected[0].text == tokenizer.decode(ids, skip_special_tokens=True)
    assert np.array_equal(expected[0].token_ids, ids)


def test_validate_quantize_eval_and_inspect_work_on_nllb(
    tiny_nllb_onnx_dir: Path, tiny_nllb_hf_dir: Path, tmp_path: Path
) -> None:
    from typer.testing import CliRunner

    from onnxmt.cli import app
    from onnxmt.eval import EvalOptions, evaluate
    from onnxmt.export.quantize import QuantizeOptions, quantize
    from onnxmt.export.validate import ValidateOptions, validate

    texts = SENTENCES[:6]
    options = ValidateOptions(
        DecodeOptions(beams=4), RuntimeOptions(threads=1), source_lang="eng_Latn", target_lang="fra_Latn"
    )
    report = validate(tiny_nllb_onnx_dir, str(tiny_nllb_hf_dir), texts, options)
    assert report.tokenizer_identical == report.greedy_identical == report.beam_identical == len(texts)
    assert report.max_abs_logit_diff < 1e-4

    int8 = tmp_path / "int8"
    quantize(tiny_nllb_onnx_dir, int8, QuantizeOptions(), progress=lambda _: None)
    translated = Translator(int8).translate(texts, source_lang="eng_Latn", target_lang="fra_Latn")
    assert all(t.token_ids[0] == Translator(int8).tokenizer.token_id("fra_Latn") for t in translated)

    src, ref = tmp_path / "test.eng_Latn", tmp_path / "test.fra_Latn"
    src.write_text("\n".join(texts) + "\n", encoding="utf-8")
    ref.write_text("\n".join(texts) + "\n", encoding="utf-8")
    decoding, runtime = DecodeOptions(max_new_tokens=6), RuntimeOptions(threads=1)
    fast = EvalOptions(
        decoding=decoding, batching=BatchLimits(2), latency_sentences=1, runtime=runtime, target_lang="fra_Latn"
    )
    rows = evaluate([tiny_nllb_onnx_dir], src, ref, fast, reference=str(tiny_nllb_hf_dir)).rows
    assert [r.kind for r in rows] == ["onnx", "pytorch"] and rows[0].hypotheses == rows[1].hypotheses

    result = CliRunner().invoke(app, ["inspect", str(int8)])
    assert result.exit_code == 0, result.output
    assert "m2m_100" in result.stdout and "language_tokens" in result.stdout


@pytest.fixture(scope="module")
def m2m100_concat_dir(tiny_m2m100_hf_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`tiny_m2m100_hf_dir` exported with `--cache-concat` (the other tests run the default, buffered form)."""
    from onnxmt.export.exporter import ExportOptions, export

    out = tmp_path_factory.mktemp("m2m100-concat") / "model"
    export(str(tiny_m2m100_hf_dir), out, ExportOptions(buffered_cache=False), progress=lambda _: None)
    return out


@pytest.mark.parametrize("beams", [1, 4])
def test_cache_concat_export_translates_like_transformers(
    m2m100_concat_dir: Path, tiny_m2m100_onnx_dir: Path, tiny_m2m100_hf_dir: Path, beams: int
) -> None:
    assert Translator(tiny_m2m100_onnx_dir).graphs.buffered  # the default export: a buffer
    translator = Translator(m2m100_concat_dir)
    assert not translator.manifest.graphs["decoder"].has_input("past_length")
    source, (target, _) = M2M100_PAIRS
    got = translator.translate(SENTENCES, source_lang=source, target_lang=target, beams=beams)
    assert [t.token_ids for t in got] == _hf_generate(tiny_m2m100_hf_dir, SENTENCES, source, target, beams)


def test_benchmark_vocabulary_has_the_real_nllb_layout(tmp_path: Path) -> None:
    """The benchmark's NLLB model pads its sentencepiece model to the real size: 256,204 tokens with the language
    codes and <mask> at the hub model's ids, two embedding rows past them, and real text still tokenized by the
    trained pieces alone (the padding is unreachable)."""
    import transformers

    from onnxmt.testing import NllbSpec, build_random_model

    spec = NllbSpec(d_model=8, ffn_dim=16, attention_heads=2, pieces=400, vocab_size=256206)
    directory = build_random_model(tmp_path / "nllb", spec, corpus=list(SENTENCES) * 20)
    tokenizer = transformers.AutoTokenizer.from_pretrained(directory, src_lang="eng_Latn")
    assert len(tokenizer) == 256204
    assert json.loads((directory / "config.json").read_text())["vocab_size"] == 256206
    ids = tokenizer.convert_tokens_to_ids(["ace_Arab", "eng_Latn", "fra_Latn", "zho_Hans", "zul_Latn", "<mask>"])
    assert ids == [256001, 256047, 256057, 256200, 256202, 256203]
    encoded = tokenizer(SENTENCES[:50]).input_ids
    assert all(row[0] == 256047 and row[-1] == 2 for row in encoded)
    assert max(i for row in encoded for i in row[1:-1]) < 400 + 4  # only trained pieces (and <unk>)
