"""`onnxmt validate`: the fp32 export is token-identical to PyTorch; a broken export is caught and explained."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from onnxmt.cli import app
from onnxmt.manifest import DECODER_FILE, describe_files, read_manifest
from onnxmt.runtime.options import DecodeOptions, RuntimeOptions
from tests.helpers.skips import importorskip

importorskip("torch")
importorskip("transformers")

from onnxmt.export.validate import (  # noqa: E402
    DEFAULT_CORPUS,
    LONG_SENTENCES,
    SHORT_SENTENCES,
    ValidateOptions,
    read_corpus,
    validate,
)

# Two short and two long sentences; one thread, so that the shared CI cores are not oversubscribed.
TEXTS = [*SHORT_SENTENCES[:2], *LONG_SENTENCES[:2]]
OPTIONS = ValidateOptions(DecodeOptions(max_new_tokens=24), RuntimeOptions(threads=1))
runner = CliRunner()
pytestmark = pytest.mark.filterwarnings("ignore:input of .* truncated")


@pytest.fixture(scope="module")
def broken_dir(tiny_onnx_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny export with one decoder weight perturbed, its manifest updated so it still loads."""
    import onnx
    from onnx import numpy_helper

    directory = tmp_path_factory.mktemp("broken") / "model"
    shutil.copytree(tiny_onnx_dir, directory)
    model = onnx.load(str(directory / DECODER_FILE))
    matmul_weights = {n.input[1] for n in model.graph.node if n.op_type == "MatMul"}
    weight = next(i for i in model.graph.initializer if i.name in matmul_weights and len(i.dims) == 2)
    values = numpy_helper.to_array(weight)
    noisy = values + np.random.default_rng(0).normal(0, 0.5, values.shape).astype(np.float32)
    weight.CopyFrom(numpy_helper.from_array(noisy, weight.name))
    onnx.save(model, str(directory / DECODER_FILE))
    manifest = read_manifest(directory)
    manifest.files.update(describe_files(directory, [DECODER_FILE]))
    manifest.save(directory)
    return directory


def test_default_corpus_has_short_and_long_sentences() -> None:
    assert read_corpus(None) == list(DEFAULT_CORPUS)
    assert sum(len(t) >= 100 for t in DEFAULT_CORPUS) >= 5
    assert sum(len(t) < 40 for t in DEFAULT_CORPUS) >= 5


def test_fp32_export_is_token_identical(tiny_onnx_dir: Path, tiny_hf_dir: Path) -> None:
    report = validate(tiny_onnx_dir, str(tiny_hf_dir), TEXTS, OPTIONS)
    assert report.sentences == len(TEXTS)
    assert report.beams == 4  # the model's num_beams
    assert report.greedy_rate == report.beam_rate == report.identical_rate == 1.0
    assert report.tokenizer_identical == len(TEXTS)
    assert report.divergences == []
    assert 0.0 < report.mean_abs_logit_diff <= report.max_abs_logit_diff < 1e-4
    data = json.loads(report.to_json())
    assert data["identical_rate"] == 1.0
    assert [s["greedy_reference"] for s in data["per_sentence"]] == [s["greedy_onnx"] for s in data["per_sentence"]]
    markdown = report.to_markdown()
    assert "| greedy token-identical | 4/4 (100.0%) |" in markdown
    assert "| beam (4) token-identical | 4/4 (100.0%) |" in markdown
    assert report.batch_invariance is None  # fp32: only on request


def test_int8_reports_how_often_batches_change_tokens(tiny_onnx_dir: Path, tiny_hf_dir: Path, tmp_path: Path) -> None:
    importorskip("onnx")
    from onnxmt.export.quantize import quantize

    int8 = tmp_path / "int8"
    quantize(tiny_onnx_dir, int8, progress=lambda _: None)
    report = validate(int8, str(tiny_hf_dir), TEXTS, OPTIONS)
    assert report.batch_invariance is not None and set(report.batch_invariance) == {"greedy", "beam"}
    for search, check in report.batch_invariance.items():
        assert check["sentences"] == len(TEXTS) and 0 <= check["identical"] <= len(TEXTS)
        assert check["beams"] == (1 if search == "greedy" else 4) and check["scales"] == "per tensor"
        assert f"| batch-invariant, {search} | {check['description']} |" in report.to_markdown()
    assert "int8 per-tensor scales" in report.batch_invariance["greedy"]["description"]
    assert json.loads(report.to_json())["batch_invariance"]["beam"]["batch_size"] == 8


def test_broken_export_is_caught_with_its_first_difference(broken_dir: Path, tiny_hf_dir: Path) -> None:
    report = validate(broken_dir, str(tiny_hf_dir), TEXTS, OPTIONS)
    assert report.greedy_rate < 1.0
    assert report.max_abs_logit_diff > 1e-2
    greedy = [d for d in report.divergences if d.search == "greedy"]
    assert len(greedy) == len(TEXTS) - report.greedy_identical
    for d in greedy:
        sentence = report.per_sentence[d.index]
        ours, theirs = sentence["greedy_onnx"], sentence["greedy_reference"]
        # The reported step is the first where the outputs differ, and the tokens are those at that step.
        assert ours[: d.step] == theirs[: d.step]
        assert d.reference_token == (theirs[d.step] if d.step < len(theirs) else None)
        assert d.onnx_token == (ours[d.step] if d.step < len(ours) else None)
        if d.reference_token is not None and d.onnx_token is not None:
            # Greedy takes the argmax: the reference prefers its token, the broken graph prefers the other.
            assert d.reference_margin is not None and d.reference_margin > 0
            assert d.onnx_margin is not None and d.onnx_margin < 0
            assert d.verdict in ("logits differ", "floating-point tie")
    assert "## First differences" in report.to_markdown()


def test_cli_writes_reports_and_exits_by_threshold(
    tiny_onnx_dir: Path, broken_dir: Path, tiny_hf_dir: Path, tmp_path: Path
) -> None:
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("Hello world.\n\n" + LONG_SENTENCES[0] + "\n", encoding="utf-8")
    common = ["--reference", str(tiny_hf_dir), "--input", str(corpus), "--max-new-tokens", "12", "--threads", "1"]
    ok = runner.invoke(app, ["validate", str(tiny_onnx_dir), *common, "--report", str(tmp_path / "ok")])
    assert ok.exit_code == 0, ok.output
    assert json.loads((tmp_path / "ok.json").read_text())["sentences"] == 2  # the blank line is skipped
    assert "token-identical" in (tmp_path / "ok.md").read_text()
    bad = runner.invoke(app, ["validate", str(broken_dir), *common, "--report", str(tmp_path / "bad")])
    assert bad.exit_code == 1
    assert "below --min-identical" in bad.output
    lenient = ["--min-identical", "0", "--report", str(tmp_path / "lenient")]
    assert runner.invoke(app, ["validate", str(broken_dir), *common, *lenient]).exit_code == 0
    # On request for fp32 too: a sentence alone and batched with the other gets the same tokens.
    checked = runner.invoke(
        app, ["validate", str(tiny_onnx_dir), *common, "--batch-check", "--report", str(tmp_path / "c")]
    )
    assert checked.exit_code == 0, checked.output
    data = json.loads((tmp_path / "c.json").read_text())["batch_invariance"]
    assert data["greedy"]["rate"] == data["beam"]["rate"] == 1.0 and data["greedy"]["scales"] is None
    assert (
        "| batch-invariant, greedy | 100.0% of sentences (2/2; alone vs shuffled batches of 8, not dynamic int8) |"
        in (tmp_path / "c.md").read_text()
    )


def test_cli_errors_exit_2(tiny_onnx_dir: Path, tiny_hf_dir: Path, tmp_path: Path) -> None:
    missing = runner.invoke(app, ["validate", str(tiny_onnx_dir), "-r", str(tiny_hf_dir), "-i", str(tmp_path / "x")])
    assert missing.exit_code == 2 and "input file not found" in missing.output
    no_model = runner.invoke(app, ["validate", str(tmp_path), "-r", str(tiny_hf_dir)])
    assert no_model.exit_code == 2 and "onnxmt.json" in no_model.output


def test_a_full_scratch_disk_stops_validate_with_a_clear_error(
    tiny_onnx_dir: Path, tiny_hf_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The reference's logits are stored on disk (steps x vocabulary per sentence and search): validate stops with
    one clear error before they would leave less than 1 GB free there, and leaves no scratch directory behind."""
    import tempfile

    from onnxmt.export import validate as module

    scratch_parent = Path(tempfile.gettempdir())
    before = set(scratch_parent.glob("onnxmt-validate-*"))
    real = shutil.disk_usage

    def nearly_full(path: str | Path) -> tuple[int, int, int]:
        total, used, _ = real(path)
        return type(real(path))(total, used, module.SCRATCH_SPARE_BYTES + 1000)  # room for ~1 KB more

    monkeypatch.setattr(module.shutil, "disk_usage", nearly_full)
    with pytest.raises(ValueError, match=r"keeps 1,024 MB of that disk free, which has 1,024 MB free; validate fewer"):
        validate(tiny_onnx_dir, str(tiny_hf_dir), TEXTS[:1], OPTIONS)
    command = ["validate", str(tiny_onnx_dir), "-r", str(tiny_hf_dir), "--max-new-tokens", "4"]
    result = runner.invoke(app, command, env={"COLUMNS": "500"})
    assert result.exit_code == 2 and "set TMPDIR to a larger disk" in result.output
    assert set(scratch_parent.glob("onnxmt-validate-*")) == before


def test_the_disk_check_counts_the_logits_validate_stores(
    tiny_separate_onnx_dir: Path, tiny_separate_hf_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The check before storing counts exactly what is stored: rows as wide as the LM head, which for Marian's
    separate vocabularies is narrower than config.vocab_size (counting that would refuse runs that fit)."""
    from onnxmt.export import validate as module

    config = json.loads((tiny_separate_hf_dir / "config.json").read_text())
    assert config["decoder_vocab_size"] < config["vocab_size"]  # the case this test is about
    checked: list[int] = []
    real = module._check_room
    monkeypatch.setattr(module, "_check_room", lambda scratch, nbytes: checked.append(nbytes) or real(scratch, nbytes))
    validate(tiny_separate_onnx_dir, str(tiny_separate_hf_dir), TEXTS[:2], OPTIONS)
    total, *files = checked
    assert len(files) == 4 and total == sum(files) > 0  # 2 sentences x (greedy, beam)
