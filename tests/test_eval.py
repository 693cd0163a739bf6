"""`onnxmt eval`: sacrebleu's scores, and one row per model with every column, each model in a fresh process."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

import pytest
from typer.testing import CliRunner

from onnxmt import Translator
from onnxmt.cli import app
from onnxmt.eval import COLUMNS, EvalOptions, bleu_tokenizer, evaluate, read_pairs, score
from onnxmt.runtime.options import BatchLimits, DecodeOptions, RuntimeOptions
from tests.helpers.skips import importorskip

sacrebleu = importorskip("sacrebleu")

SOURCES = ["Hello world.", "The river is long and the mountain is high.", "", "What is this?"]
REFERENCES = ["你好，世界。", "河很长，山很高。", "", "这是什么？"]
# Fast settings for the tiny model: few tokens, two timed sentences, one thread (CI shares its cores).
FAST = EvalOptions(
    decoding=DecodeOptions(max_new_tokens=6),
    batching=BatchLimits(2),
    latency_sentences=2,
    runtime=RuntimeOptions(threads=1),
)
runner = CliRunner()


@pytest.fixture()
def pair(tmp_path: Path) -> tuple[Path, Path]:
    src, ref = tmp_path / "test.eng_Latn", tmp_path / "test.zho_Hans"
    src.write_text("\n".join(SOURCES) + "\n", encoding="utf-8")
    ref.write_text("\n".join(REFERENCES) + "\n", encoding="utf-8")
    return src, ref


def test_scores_match_sacrebleu_on_a_known_pair() -> None:
    hypotheses = ["你好，世界！", "河流很长，山很高。", "", "这是什么东西？"]
    bleu, chrf = score(hypotheses, REFERENCES, "zh")
    assert bleu == pytest.approx(sacrebleu.corpus_bleu(hypotheses, [REFERENCES], tokenize="zh").score)
    assert chrf == pytest.approx(sacrebleu.corpus_chrf(hypotheses, [REFERENCES]).score)
    assert 0 < bleu < 100 and 0 < chrf < 100
    # Without Chinese tokenisation a whole sentence is one "word": BLEU collapses, which is why "zh" is chosen.
    assert score(hypotheses, REFERENCES, "13a")[0] < bleu
    assert score(REFERENCES, REFERENCES, "zh") == (pytest.approx(100.0), pytest.approx(100.0))


@pytest.mark.parametrize(
    ("languages", "expected"),
    [
        (("cmn_Hans",), "zh"),
        ((">>cmn_Hans<<",), "zh"),
        (("zho_Hans",), "zh"),
        (("zh",), "zh"),
        ((None, "yue_Hant"), "zh"),
        (("de",), "13a"),
        (("eng_Latn", "zh"), "13a"),  # the first known language decides
        ((None, None), "13a"),
    ],
)
def test_chinese_targets_get_chinese_tokenisation(languages: tuple, expected: str) -> None:
    assert bleu_tokenizer(*languages) == expected


def test_read_pairs_checks_lengths_and_limits(pair: tuple[Path, Path], tmp_path: Path) -> None:
    src, ref = pair
    assert read_pairs(src, ref, 2) == (SOURCES[:2], REFERENCES[:2])
    short = tmp_path / "short.txt"
    short.write_text("one line\n", encoding="utf-8")
    with pytest.raises(ValueError, match="must pair line by line"):
        read_pairs(src, short, None)
    with pytest.raises(ValueError, match="at least 1"):
        read_pairs(src, ref, 0)


def test_rows_side_by_side_with_every_column(tiny_onnx_dir: Path, pair: tuple[Path, Path], tmp_path: Path) -> None:
    from onnxmt.export.quantize import quantize

    int8 = tmp_path / "int8"
    quantize(tiny_onnx_dir, int8, progress=lambda _: None)
    seen: list[tuple[str, int, int]] = []
    report = evaluate([tiny_onnx_dir, int8], *pair, FAST, progress=lambda *p: seen.append(p))
    assert [r.model for r in report.rows] == [str(tiny_onnx_dir), str(int8)]
    assert [r.quantization for r in report.rows] == ["fp32", "dynamic int8"]
    assert report.tokenize == "zh"  # from the reference file's language suffix
    for row in report.rows:
        assert row.kind == "onnx"
        assert row.size_bytes == sum(p.stat().st_size for p in Path(row.model).iterdir())
        assert row.latency_ms > 0 and row.sentences_per_second > 0 and row.load_seconds > 0
        # In bytes (kB would be under 20e6): the test process's peak so far, so every test before this one counts.
        assert 20e6 < row.peak_rss_bytes < 64e9
        assert len(row.cells()) == len(COLUMNS)
    assert report.rows[1].size_bytes < report.rows[0].size_bytes
    # int8's activation scales are the batch's: it gets the batch-composition check, fp32 does not by default.
    fp32_check, int8_check = (row.batch_invariance for row in report.rows)
    assert fp32_check is None and report.rows[0].cells()[-1] == ""
    assert int8_check is not None and int8_check["sentences"] == 3 and int8_check["scales"] == "per tensor"
    assert report.rows[1].cells()[-1] == f"{int8_check['identical']}/3"
    assert "same tokens batched: of the first" in report.to_markdown()
    # The scores are those of the translations the Translator gives.
    expected = [t.text for t in Translator(tiny_onnx_dir).translate(SOURCES, max_new_tokens=6)]
    assert report.rows[0].hypotheses == expected
    assert (report.rows[0].bleu, report.rows[0].chrf) == pytest.approx(score(expected, REFERENCES, "zh"))
    # Progress reaches the total for both models: 2 timed sentences + the whole corpus.
    assert {(name, total) for name, done, total in seen if done == total} == {
        (str(d), 2 + len(SOURCES)) for d in (tiny_onnx_dir, int8)
    }
    markdown = report.to_markdown()
    assert all(c.replace("batch N", "batch 2") in markdown for c in COLUMNS)
    data = json.loads(report.to_json())
    assert set(data["rows"][0]) >= {"model", "bleu", "chrf", "size_bytes", "latency_ms", "peak_rss_bytes"}
    assert data["machine"]["cores"] >= 1 and "cpu_flags" in data["machine"]


def test_onnx_worker_needs_neither_torch_nor_transformers(tiny_onnx_dir: Path, pair: tuple[Path, Path]) -> None:
    job = {"kind": "onnx", "model": str(tiny_onnx_dir), "src_file": str(pair[0]), "options": asdict(FAST)}
    code = (
        "import json, sys\n"
        "sys.modules['torch'] = None; sys.modules['transformers'] = None\n"
        "from onnxmt.eval import run_worker\n"
        f"print(json.dumps(run_worker({job!r})))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True, timeout=120)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert len(result["hypotheses"]) == len(SOURCES) and result["quantization"] == "fp32"


def test_cli_with_a_pytorch_reference_row(
    tiny_onnx_dir: Path, tiny_hf_dir: Path, pair: tuple[Path, Path], tmp_path: Path
) -> None:
    importorskip("torch")
    src, ref = pair
    args = ["eval", str(tiny_onnx_dir), "--src", str(src), "--ref", str(ref), "--reference", str(tiny_hf_dir)]
    fast = ["--max-new-tokens", "6", "--latency-sentences", "1", "--threads", "1", "--limit", "3", "--batch-check"]
    result = runner.invoke(app, [*args, *fast, "--report", str(tmp_path / "eval")])
    assert result.exit_code == 0, result.output
    data = json.loads((tmp_path / "eval.json").read_text())
    assert [r["kind"] for r in data["rows"]] == ["onnx", "pytorch"]
    assert data["sentences"] == 3
    onnx_row, torch_row = data["rows"]
    # Same model, same settings: the fp32 export and PyTorch translate alike.
    assert (onnx_row["bleu"], onnx_row["chrf"]) == pytest.approx((torch_row["bleu"], torch_row["chrf"]))
    assert torch_row["quantization"] == "fp32 (PyTorch)"
    assert torch_row["batch_invariance"] is None
    # Asked for: the fp32 row is checked too, and batches do not change its tokens.
    assert onnx_row["batch_invariance"]["rate"] == 1.0 and onnx_row["batch_invariance"]["sentences"] == 2  # no ""
    table = (tmp_path / "eval.md").read_text()
    assert table.count("\n| ") == 3  # separator + two rows after the header


def test_cli_errors_exit_2(tiny_onnx_dir: Path, pair: tuple[Path, Path], tmp_path: Path) -> None:
    src, ref = pair
    missing = runner.invoke(app, ["eval", str(tiny_onnx_dir), "--src", str(tmp_path / "nope"), "--ref", str(ref)])
    assert missing.exit_code == 2 and "file not found" in missing.output
    not_a_model = runner.invoke(app, ["eval", str(tmp_path), "--src", str(src), "--ref", str(ref)])
    assert not_a_model.exit_code == 2 and "onnxmt.json" in not_a_model.output
