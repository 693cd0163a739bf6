"""The quantization `onnxmt inspect` reports for each graph, read from the graph's operators and weight types (a
protobuf walk that needs no `onnx` package), for every kind of directory: onnxmt's fp32, int8 and int4, Optimum's
int8 (ORTQuantizer), and the Transformers.js variants."""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import pytest
from typer.testing import CliRunner

from onnxmt.cli import app
from onnxmt.runtime.graphinfo import read_graph
from tests.helpers.skips import importorskip

onnx = importorskip("onnx")


@pytest.fixture(scope="module")
def onnxmt_quantized(tiny_onnx_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """`onnxmt quantize` of the tiny export: dynamic int8 and int4."""
    from onnxmt.export.quantize import QuantizeOptions, quantize

    out = tmp_path_factory.mktemp("graphinfo")
    quantize(tiny_onnx_dir, out / "int8", progress=lambda _: None)
    quantize(tiny_onnx_dir, out / "int4", QuantizeOptions(int4=True), progress=lambda _: None)
    return {"int8": out / "int8", "int4": out / "int4"}


INT8 = r"dynamic int8 \(int8 weights; DynamicQuantizeLinear x\d+, MatMulInteger x\d+"
# Optimum's avx2 recipe quantizes weights to uint8 (its ort_config.json says so: checked below).
UINT8 = INT8.replace("int8", "uint8")
# file (relative to its directory's fixture) -> the summary it must match, from the start.
EXPECTED = {
    ("onnxmt", "encoder.onnx"): "fp32$",
    ("onnxmt", "decoder.onnx"): "fp32$",
    ("onnxmt-int8", "encoder.onnx"): INT8 + r"\)$",
    ("onnxmt-int8", "decoder.onnx"): INT8 + r", DynamicQuantizeMatMul x1\)$",  # the tied LM head
    ("onnxmt-int4", "decoder.onnx"): r"int4 weight-only \(MatMulNBits x\d+, GatherBlockQuantized x2; block size 32\)$",
    ("optimum-int8", "encoder_model_quantized.onnx"): UINT8,
    ("optimum-int8", "decoder_model_quantized.onnx"): UINT8,
    ("optimum-int8", "decoder_with_past_model_quantized.onnx"): UINT8,
    ("transformersjs", "onnx/encoder_model.onnx"): "fp32$",
    ("transformersjs", "onnx/decoder_model_merged.onnx"): "fp32$",
    ("transformersjs", "onnx/decoder_model_merged_quantized.onnx"): INT8,
    ("transformersjs", "onnx/decoder_model_merged_uint8.onnx"): r"dynamic uint8 \(uint8 weights; ",
    ("transformersjs", "onnx/decoder_model_merged_q4.onnx"): r"int4 weight-only \(MatMulNBits x\d+; block size 32\)$",
    ("transformersjs", "onnx/encoder_model_q4.onnx"): r"int4 weight-only \(MatMulNBits x\d+; block size 32\)$",
    ("transformersjs", "onnx/decoder_model_merged_fp16.onnx"): "fp16$",
}


@pytest.fixture(scope="module")
def directories(
    tiny_onnx_dir: Path,
    onnxmt_quantized: dict[str, Path],
    tiny_optimum_int8_dir: Path,
    tiny_transformersjs_dir: Path,
) -> dict[str, Path]:
    return {
        "onnxmt": tiny_onnx_dir,
        "onnxmt-int8": onnxmt_quantized["int8"],
        "onnxmt-int4": onnxmt_quantized["int4"],
        "optimum-int8": tiny_optimum_int8_dir,
        "transformersjs": tiny_transformersjs_dir,
    }


def _onnx_ops(path: Path) -> Counter[str]:
    ops: Counter[str] = Counter()

    def walk(graph: onnx.GraphProto) -> None:
        for node in graph.node:
            ops[node.op_type] += 1
            for attribute in node.attribute:
                for sub in [attribute.g] if attribute.type == onnx.AttributeProto.GRAPH else attribute.graphs:
                    walk(sub)

    walk(onnx.load(str(path), load_external_data=False).graph)
    return ops


@pytest.mark.parametrize("case", EXPECTED, ids=lambda c: f"{c[0]}:{c[1]}")
def test_each_graph_reports_its_quantization(directories: dict[str, Path], case: tuple[str, str]) -> None:
    path = directories[case[0]] / case[1]
    contents = read_graph(path)
    assert re.match(EXPECTED[case], contents.quantization()), contents.quantization()
    # The protobuf walk sees what onnx sees, If branches (merged decoders) included.
    assert contents.ops == _onnx_ops(path)


def test_optimums_record_agrees(directories: dict[str, Path]) -> None:
    config = json.loads((directories["optimum-int8"] / "ort_config.json").read_text())["quantization"]
    assert (config["weights_dtype"], config["is_static"]) == ("QUInt8", False)


def test_weight_types_are_counted(directories: dict[str, Path]) -> None:
    fp32 = read_graph(directories["transformersjs"] / "onnx/decoder_model_merged.onnx")
    fp16 = read_graph(directories["transformersjs"] / "onnx/decoder_model_merged_fp16.onnx")
    assert set(fp32.weights) == {"fp32"} and set(fp16.weights) == {"fp16"}
    assert fp32.weights["fp32"] == fp16.weights["fp16"]
    # onnxmt's weights are external data (weights.bin): their types and shapes are still in the graph.
    assert read_graph(directories["onnxmt-int8"] / "decoder.onnx").weights["int8"] > 0


def test_a_file_that_is_not_onnx_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "x.onnx").write_bytes(b"")
    with pytest.raises(ValueError, match="empty file"):
        read_graph(tmp_path / "x.onnx")
    (tmp_path / "y.onnx").write_bytes(b"\x0f\x00\x00")
    with pytest.raises(ValueError):
        read_graph(tmp_path / "y.onnx")


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("onnxmt", "the same as alone, in any batch"),  # fp32
        ("onnxmt-int8", "can differ from alone: int8 with per-tensor activation scales"),
        ("onnxmt-int8-per-row", "the same as alone, in any batch"),
        ("onnxmt-int4", "the same as alone, in any batch"),  # weight-only: activations stay fp32
    ],
)
def test_inspect_says_whether_batching_changes_a_translation(
    tiny_onnx_dir: Path, onnxmt_quantized: dict[str, Path], tmp_path: Path, name: str, expected: str
) -> None:
    """The row reads the directory's capabilities, as the service's /info and start log do."""
    from onnxmt.export.quantize import QuantizeOptions, quantize

    if name == "onnxmt-int8-per-row":
        quantize(tiny_onnx_dir, tmp_path / "int8", QuantizeOptions(per_row_scales=True), progress=lambda _: None)
        directory = tmp_path / "int8"
    else:
        directory = tiny_onnx_dir if name == "onnxmt" else onnxmt_quantized[name.removeprefix("onnxmt-")]
    result = CliRunner().invoke(app, ["inspect", str(directory)], env={"COLUMNS": "400"})
    assert result.exit_code == 0, result.output
    assert re.search(rf"│ batched translations +│ {re.escape(expected)}", result.stdout), result.stdout


@pytest.mark.parametrize(
    ("name", "variant", "rows"),
    [
        ("onnxmt", None, {"variant": "fp32", "encoder graph": "fp32", "decoder graph": "fp32"}),
        ("onnxmt-int8", None, {"variant": "int8", "quantization (manifest)": "dynamic int8"}),
        (
            "optimum-int8",
            None,
            {
                "variant": "quantized",
                "decoder_with_past graph": "dynamic uint8 (uint8 weights",
                "batched translations": "cannot tell: the directory does not record its quantization",
            },
        ),
        ("transformersjs", "q4", {"decoder_merged graph": "int4 weight-only (MatMulNBits"}),
        ("transformersjs", "fp16", {"encoder graph": "fp16", "quantization (manifest)": "fp16"}),
    ],
)
def test_inspect_shows_each_graphs_quantization(
    directories: dict[str, Path], name: str, variant: str | None, rows: dict[str, str]
) -> None:
    args = ["inspect", str(directories[name]), *(["--variant", variant] if variant else [])]
    result = CliRunner().invoke(app, args, env={"COLUMNS": "250"})
    assert result.exit_code == 0, result.output
    for key, value in rows.items():
        assert re.search(rf"│ {re.escape(key)} +│ {re.escape(value)}", result.stdout), (key, value)
