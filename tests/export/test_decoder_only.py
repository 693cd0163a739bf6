"""export/decoder_only.py through `onnxmt export`, `onnxmt inspect` and `onnxmt quantize`: one decoder graph that
takes a prompt and single steps, its manifest, and its int8 and int4 forms."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from onnxmt.cli import app
from onnxmt.manifest import DECODER_FILE, read_manifest
from onnxmt.runtime.decoder_only import DecoderOnlyGraphs
from onnxmt.runtime.graphinfo import read_graph
from onnxmt.runtime.options import RuntimeOptions
from tests.helpers.skips import importorskip

importorskip("torch")
runner = CliRunner()
PROMPTS = [[2, 105, 400, 401, 402, 403, 404, 405, 406, 407, 408, 409], [2, 105, 500, 501]]


def test_onnxmt_export_writes_one_decoder_graph_and_inspect_shows_the_prompt(hy_mt_hf_dir: Path, tmp_path: Path):
    out = tmp_path / "hy-mt"
    result = runner.invoke(app, ["export", str(hy_mt_hf_dir), str(out)])
    assert result.exit_code == 0, result.output
    manifest = read_manifest(out)
    assert list(manifest.graphs) == ["decoder"] and manifest.model["decoder_only"] is True
    decoder = manifest.graphs["decoder"]
    assert [t.role for t in decoder.inputs[:3]] == ["input_ids", "input_length", "past_length"]
    assert decoder.inputs[0].shape == ["rows", "new_len"] and decoder.inputs[2].shape == ["rows"]
    assert decoder.inputs[3].shape == ["rows", 2, "capacity", 32]  # the key/value heads, not the query heads
    # GroupQueryAttention writes the new keys and values into the buffer: its outputs are the buffers.
    assert decoder.outputs[1].role == "present_key.0" and decoder.outputs[1].shape == ["rows", 2, "capacity", 32]
    assert manifest.provenance["check"]["first_step_logits_max_abs_diff"] < 1e-4
    assert {"tokenizer.json", "chat_template.jinja", "generation_config.json"} <= set(manifest.files)
    generation = json.loads((hy_mt_hf_dir / "generation_config.json").read_text())
    assert manifest.tokens["eos_ids"] == generation["eos_token_id"]
    assert manifest.generation == {"repetition_penalty": 1.05}  # sampling set aside, kept in languages
    assert manifest.languages["vendor_sampling"]["temperature"] == 0.7

    shown = runner.invoke(app, ["inspect", str(out)], env={"COLUMNS": "200"})
    assert shown.exit_code == 0, shown.output
    assert "将以下文本翻译为{target}" in shown.output and "zh-Hant=繁体中文" in shown.output
    assert "<｜hy_User｜>" in shown.output  # the chat template itself
    assert "do_sample=True" in shown.output

    shown = runner.invoke(app, ["inspect", str(out), "--prompt", "Hi.", "--source", "en", "--target", "fr"])
    assert shown.exit_code == 0, shown.output
    english = "Translate the following segment into French, without additional explanation.\n\nHi."
    assert f"<｜hy_begin▁of▁sentence｜><｜hy_User｜>{english}<｜hy_Assistant｜>" in shown.output
    assert " ids: [" in shown.output
    refused = runner.invoke(app, ["inspect", str(out), "--prompt", "Hi.", "--target", "xx"])
    assert refused.exit_code == 2 and "valid: ar, bn" in refused.output


def _logits(directory: Path) -> tuple[np.ndarray, np.ndarray]:
    graphs = DecoderOnlyGraphs(directory, read_manifest(directory), RuntimeOptions(threads=1, verify=False))
    prefill, cache = graphs.prefill(PROMPTS)
    step, _ = graphs.step(np.array([[5], [6]]), cache)
    return prefill, step


@pytest.mark.parametrize("form", ["int8", "int4"])
def test_quantize_works_on_the_decoder_only_graph(translategemma_onnx_dir: Path, tmp_path: Path, form: str) -> None:
    out = tmp_path / form
    args = ["quantize", str(translategemma_onnx_dir), str(out)] + (["--int4"] if form == "int4" else [])
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    ops = read_graph(out / DECODER_FILE).quantization()
    assert ("MatMulNBits" in ops and "GatherBlockQuantized" in ops) if form == "int4" else "MatMulInteger" in ops
    assert (out / DECODER_FILE).stat().st_size < (translategemma_onnx_dir / DECODER_FILE).stat().st_size
    reference = _logits(translategemma_onnx_dir)
    for got, want in zip(_logits(out), reference, strict=True):
        assert got.shape == want.shape and np.isfinite(got).all()
        # Not equal (weights rounded), but the same scores up to that rounding.
        assert np.corrcoef(got.ravel(), want.ravel())[0, 1] > (0.99 if form == "int8" else 0.9)


def test_a_decoder_only_export_needs_the_cache_buffer(hy_mt_onnx_dir: Path, tmp_path: Path) -> None:
    from onnxmt.export.exporter import ExportError, ExportOptions, export

    with pytest.raises(ExportError, match="cache buffer only"):
        export(str(hy_mt_onnx_dir), tmp_path / "x", ExportOptions(buffered_cache=False), progress=lambda _: None)


@pytest.fixture(scope="module")
def large_vocab_onnx_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny HY-MT with HY-MT1.5-1.8B's 120,818 embedding rows (the real checkpoint's, past the tokenizer's),
    exported with its tied head cut into chunks at 8 MiB (the real size, 48 MiB, scaled to its 31 MB head)."""
    from onnxmt.export import weights
    from onnxmt.export.exporter import ExportOptions, export
    from onnxmt.testing.decoder_only import DecoderOnlySpec, build_decoder_only

    hf_dir = build_decoder_only(
        tmp_path_factory.mktemp("large-vocab-hf"), DecoderOnlySpec(family="hy_mt", vocab_size=120818)
    )
    out = tmp_path_factory.mktemp("large-vocab-onnx") / "model"
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(weights, "HEAD_CHUNK_BYTES", 8 << 20)
        export(str(hf_dir), out, ExportOptions(), progress=lambda _: None)
    return out


@pytest.mark.parametrize(
    ("form", "flags", "ops"),
    [
        ("int8", [], {"DynamicQuantizeMatMul": 1}),  # the head, on the int8 rows the lookup reads too
        # Two layers of four MatMuls (query-key-value, output, gate-up, down: export/decoder_only.py) and the head.
        ("per-row", ["--per-row-scales"], {"MatMulIntegerToFloat": 9}),
        ("int4", ["--int4"], {"GatherBlockQuantized": 1, "MatMulNBits": 9}),
    ],
)
def test_a_120k_row_embedding_and_head_quantize(
    large_vocab_onnx_dir: Path, tmp_path: Path, form: str, flags: list[str], ops: dict[str, int]
) -> None:
    """The chunked float head is taken whole: stored once in int8 (the table's rows, not twice), and the logits over
    all 120,818 rows follow fp32's."""
    import onnx

    fp32 = onnx.load(str(large_vocab_onnx_dir / DECODER_FILE), load_external_data=False)
    assert sum(n.op_type == "Gemm" for n in fp32.graph.node) == 4  # the tied head in 8 MiB chunks
    out = tmp_path / form
    result = runner.invoke(app, ["quantize", str(large_vocab_onnx_dir), str(out), *flags])
    assert result.exit_code == 0, result.output
    graph = onnx.load(str(out / DECODER_FILE), load_external_data=False).graph
    assert {op: sum(n.op_type == op for n in graph.node) for op in ops} == ops
    # int8: the vocabulary's rows stored once, a byte each; int4: the table and the untied head, half a byte each.
    assert (out / "weights.bin").stat().st_size < 1.2 * 120818 * 64
    got, want = _logits(out), _logits(large_vocab_onnx_dir)
    assert got[0].shape == want[0].shape == (2, 120818)
    for a, b in zip(got, want, strict=True):
        assert np.corrcoef(a.ravel(), b.ravel())[0, 1] > (0.9 if form == "int4" else 0.99)
