"""mBART-50 (model_type mbart): tokenizer, export and translation, token for token against transformers on a tiny
random model with facebook/mbart-large-50-many-to-many-mmt's metadata (onnxmt/testing/mbart.py)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from onnxmt.manifest import read_manifest
from onnxmt.runtime.options import BatchLimits, DecodeOptions, RuntimeOptions
from onnxmt.runtime.translator import Translator
from tests.helpers.hf import MBART50_PAIRS, generated_ids, hf_language_id, hf_m2m100, hf_special_tokens
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


def _hf_generate(model_dir: Path, texts: list[str], source: str, target: str, beams: int | None) -> list[list[int]]:
    """transformers' generate() under the model's own generation config (`beams` None: its 5 beams)."""
    import torch

    tokenizer, model = hf_m2m100(model_dir)
    tokenizer.src_lang = source
    limit = model.config.max_position_embeddings
    encoded = tokenizer(texts, return_tensors="pt", padding=True, truncation=True, max_length=limit)
    kwargs = {} if beams is None else {"num_beams": beams}
    with torch.no_grad():
        out = model.generate(**encoded, forced_bos_token_id=hf_language_id(tokenizer, target), **kwargs)
    return generated_ids(out, model.generation_config.pad_token_id)


def test_tokenizer_matches_transformers_on_flores(tiny_mbart50_onnx_dir: Path, tiny_mbart50_hf_dir: Path) -> None:
    tokenizer, _ = hf_m2m100(tiny_mbart50_hf_dir)
    assert type(tokenizer).__name__ == "MBart50Tokenizer"
    translator = Translator(tiny_mbart50_onnx_dir)
    assert translator.manifest.tokenizer["kind"] == "tokenizers"
    texts = _flores()
    for source in ("en_XX", "zh_CN", "fr_XX"):
        tokenizer.src_lang = source
        expected = tokenizer(texts, truncation=True, max_length=64).input_ids
        prompt = translator.prompt(source, "de_DE")
        assert [translator.encode(t, prompt) for t in texts] == expected, source
    # The special ids are fairseq's; the language codes follow the pieces, <mask> is last.
    codes = tokenizer.convert_tokens_to_ids(["en_XX", "zh_CN", "sl_SI", "<mask>"])
    assert [translator.tokenizer.token_id(t) for t in ("en_XX", "zh_CN", "sl_SI", "<mask>")] == codes
    assert codes[-1] == len(tokenizer) - 1 and codes[-2] == codes[-1] - 1
    # Decoding: real ids with language codes and specials that decoding must skip.
    for ids in expected[:50]:
        noisy = [codes[1], *ids, 1, 2, codes[-1]]
        assert translator.tokenizer.decode(noisy) == tokenizer.decode(noisy, skip_special_tokens=True)


@pytest.mark.parametrize("beams", [1, None])
def test_translations_match_transformers(tiny_mbart50_onnx_dir: Path, tiny_mbart50_hf_dir: Path, beams) -> None:
    """Greedy and the model's own decoding (5 beams, early stopping, forced eos), batch 1 and padded batches."""
    source, targets = MBART50_PAIRS
    translator = Translator(tiny_mbart50_onnx_dir)
    assert translator.manifest.generation["num_beams"] == 5
    lengths = set()
    for target in targets:
        expected = _hf_generate(tiny_mbart50_hf_dir, SENTENCES, source, target, beams)
        got = translator.translate(SENTENCES, source_lang=source, target_lang=target, beams=beams, batch_size=16)
        assert [t.token_ids for t in got] == expected, target
        lengths |= {len(t.token_ids) for t in got}
        one = translator.translate(SENTENCES[3:4], source_lang=source, target_lang=target, beams=beams)
        assert one[0].token_ids == _hf_generate(tiny_mbart50_hf_dir, SENTENCES[3:4], source, target, beams)[0]
    assert len(lengths) >= 4 and min(lengths) <= 5 and max(lengths) >= 20  # short and long outputs alike


@pytest.mark.parametrize("beams", [1, 4])
def test_a_batch_may_mix_target_languages(tiny_mbart50_onnx_dir: Path, tiny_mbart50_hf_dir: Path, beams: int) -> None:
    source, (first, second) = MBART50_PAIRS
    texts = SENTENCES[:8]
    targets = [first, second] * 4
    translator = Translator(tiny_mbart50_onnx_dir)
    got = translator.translate(texts, source_lang=source, target_lang=targets, beams=beams, batch_size=8)
    for i, target in enumerate(targets):  # transformers cannot mix them in one batch: one sentence at a time
        assert got[i].token_ids == _hf_generate(tiny_mbart50_hf_dir, [texts[i]], source, target, beams)[0], (i, target)
    tokenizer, _ = hf_m2m100(tiny_mbart50_hf_dir)
    assert {t.token_ids[0] for t in got} == {hf_language_id(tokenizer, first), hf_language_id(tokenizer, second)}


def test_iso_codes_reach_the_model_s_codes(tiny_mbart50_onnx_dir: Path) -> None:
    translator = Translator(tiny_mbart50_onnx_dir)
    by_iso = translator.translate(SENTENCES[:3], source_lang="en", target_lang="zh-Hans", beams=1)
    own = translator.translate(SENTENCES[:3], source_lang="en_XX", target_lang="zh_CN", beams=1)
    assert [t.token_ids for t in by_iso] == [t.token_ids for t in own]
    assert translator.translate(SENTENCES[:1], target_lang="fr", beams=1)[0].token_ids[
        0
    ] == translator.tokenizer.token_id("fr_XX")  # no source: the tokenizer's default, en_XX
    with pytest.raises(ValueError, match="unknown target language 'xx'; valid: .*zh"):
        translator.translate(["Hello."], target_lang="xx")
    with pytest.raises(ValueError, match="this model needs a target language"):
        translator.translate(["Hello."])


def test_export_writes_the_tokenizer_and_the_language_scheme(
    tiny_mbart50_onnx_dir: Path, tiny_mbart50_hf_dir: Path
) -> None:
    manifest = read_manifest(tiny_mbart50_onnx_dir)
    assert manifest.architecture == "mbart"
    expected = hf_special_tokens(*hf_m2m100(tiny_mbart50_hf_dir))
    assert {name: manifest.tokens[name] for name in expected} == expected
    langs = manifest.languages
    assert langs["scheme"] == "language_tokens" and len(langs["target_tokens"]) == 52
    assert langs["default_source"] == "en_XX" and "tokenizer.json" in manifest.files
    assert manifest.generation["forced_eos_token_id"] == 2 and manifest.generation["early_stopping"] is True
    assert max(manifest.provenance["check"].values()) < 1e-4  # encoder, first-step and cached-step logits


def test_export_refuses_a_directory_without_a_tokenizer(tiny_mbart50_hf_dir: Path, tmp_path: Path) -> None:
    from onnxmt.export.exporter import ExportError, ExportOptions, export

    broken = Path(shutil.copytree(tiny_mbart50_hf_dir, tmp_path / "broken"))
    (broken / "sentencepiece.bpe.model").unlink()
    with pytest.raises(ExportError, match="needs tokenizer.json or sentencepiece.bpe.model"):
        export(str(broken), tmp_path / "out", ExportOptions(check=False), progress=lambda _: None)
    assert not (tmp_path / "out").exists()


def test_export_refuses_mbart_cc25(tiny_mbart50_hf_dir: Path, tmp_path: Path) -> None:
    """mBART-cc25 and its fine-tunes (MBartTokenizer: `X </s> [src]`, other codes) are not mBART-50."""
    from onnxmt.export.exporter import ExportError, ExportOptions, export

    other = Path(shutil.copytree(tiny_mbart50_hf_dir, tmp_path / "cc25"))
    config = json.loads((other / "config.json").read_text())
    (other / "config.json").write_text(json.dumps({**config, "tokenizer_class": "MBartTokenizer"}))
    (other / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "MBartTokenizer"}))
    with pytest.raises(ExportError, match="only mBART-50 models are supported"):
        export(str(other), tmp_path / "out", ExportOptions(check=False), progress=lambda _: None)


def test_validate_quantize_and_inspect_work_on_mbart50(
    tiny_mbart50_onnx_dir: Path, tiny_mbart50_hf_dir: Path, tmp_path: Path
) -> None:
    from typer.testing import CliRunner

    from onnxmt.cli import app
    from onnxmt.export.quantize import QuantizeOptions, quantize
    from onnxmt.export.validate import ValidateOptions, validate

    texts = SENTENCES[:6]
    options = ValidateOptions(
        DecodeOptions(beams=5), RuntimeOptions(threads=1), source_lang="en_XX", target_lang="zh_CN"
    )
    report = validate(tiny_mbart50_onnx_dir, str(tiny_mbart50_hf_dir), texts, options)
    assert report.tokenizer_identical == report.greedy_identical == report.beam_identical == len(texts)
    assert report.max_abs_logit_diff < 1e-4

    forms = (
        ("int8", QuantizeOptions()),
        ("rows", QuantizeOptions(per_row_scales=True)),
        ("int4", QuantizeOptions(int4=True)),
    )
    for name, quantize_options in forms:
        out = tmp_path / name
        quantize(tiny_mbart50_onnx_dir, out, quantize_options, progress=lambda _: None)
        translator = Translator(out)
        translated = translator.translate(texts, source_lang="en_XX", target_lang="zh_CN")
        # Not the source echoed (optimum #1656): the target's code first, then the model's own tokens.
        assert all(t.token_ids[0] == translator.tokenizer.token_id("zh_CN") for t in translated)

    result = CliRunner().invoke(app, ["inspect", str(tmp_path / "int8")])
    assert result.exit_code == 0, result.output
    assert "mbart" in result.stdout and "language_tokens" in result.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--target-lang", "xx"], "unknown target language 'xx'; valid: "),
        (["--source-lang", "xx", "--target-lang", "zh"], "unknown source language 'xx'; valid: auto, "),
        (["--target-lang", "zt"], "unknown target language 'zt'"),  # mBART-50 has no Traditional Chinese
    ],
)
def test_cli_bad_languages_exit_2_with_one_line(tiny_mbart50_onnx_dir: Path, args: list[str], message: str) -> None:
    from typer.testing import CliRunner

    from onnxmt.cli import app

    result = CliRunner().invoke(app, ["translate", "-m", str(tiny_mbart50_onnx_dir), *args, "Hello."])
    assert result.exit_code == 2 and message in " ".join(result.output.split())
    assert "Traceback" not in result.output


def test_cli_export_without_a_tokenizer_exits_2_and_writes_nothing(tiny_mbart50_hf_dir: Path, tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from onnxmt.cli import app

    broken = Path(shutil.copytree(tiny_mbart50_hf_dir, tmp_path / "broken"))
    (broken / "sentencepiece.bpe.model").unlink()
    result = CliRunner().invoke(app, ["export", str(broken), str(tmp_path / "out"), "--no-check"])
    output = " ".join(result.output.split())
    assert result.exit_code == 2 and "needs tokenizer.json or sentencepiece.bpe.model" in output
    assert "Loading weights" not in result.output  # refused before the model is loaded
    assert "Traceback" not in result.output and not (tmp_path / "out").exists()


def test_eval_and_tune_on_mbart50(tiny_mbart50_onnx_dir: Path, tiny_mbart50_hf_dir: Path, tmp_path: Path) -> None:
    """eval against the PyTorch reference (same hypotheses), and tune into a target language sent as an ISO code."""
    from typer.testing import CliRunner

    from onnxmt.cli import app
    from onnxmt.eval import EvalOptions, evaluate

    texts = SENTENCES[:6]
    src, ref = tmp_path / "test.en", tmp_path / "test.zh"
    src.write_text("\n".join(texts) + "\n", encoding="utf-8")
    ref.write_text("\n".join(texts) + "\n", encoding="utf-8")
    decoding, runtime = DecodeOptions(max_new_tokens=6), RuntimeOptions(threads=1)
    options = EvalOptions(
        decoding=decoding,
        batching=BatchLimits(2),
        latency_sentences=1,
        runtime=runtime,
        source_lang="en",
        target_lang="zh",
    )
    rows = evaluate([tiny_mbart50_onnx_dir], src, ref, options, reference=str(tiny_mbart50_hf_dir)).rows
    assert [r.kind for r in rows] == ["onnx", "pytorch"] and rows[0].hypotheses == rows[1].hypotheses

    args = ["tune", "-m", str(tiny_mbart50_onnx_dir), "--max-threads", "1", "--tokens", "2", "--batch-size", "2"]
    result = CliRunner().invoke(app, [*args, "--rounds", "1", "--target-lang", "de"], env={"COLUMNS": "160"})
    assert result.exit_code == 0, result.output
    assert "lowest latency: RuntimeOptions(threads=1" in result.output
