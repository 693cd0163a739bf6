"""`onnxmt quantize`: smaller graphs in a new directory that loads, translates and says what was done."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from typer.testing import CliRunner

from onnxmt import Translator
from onnxmt.cli import app
from onnxmt.manifest import (
    DECODER_FILE,
    ENCODER_FILE,
    MANIFEST_NAME,
    SHARED_WEIGHTS_FILE,
    read_manifest,
    sha256_file,
    verify_files,
)

onnx = pytest.importorskip("onnx")

from onnxmt.export.quantize import QuantizeError, QuantizeOptions, quantize  # noqa: E402

LM_HEAD = "/MatMul_8_tied"  # the export's name for the tied LM head Gemm
TEXTS = ["Hello world.", "The river is long and the mountain is high"]
runner = CliRunner()


def _quantize(source: Path, out: Path, **options) -> Path:
    quantize(source, out, QuantizeOptions(**options), progress=lambda _: None)
    return out


@pytest.fixture(scope="module")
def int8_dir(tiny_onnx_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _quantize(tiny_onnx_dir, tmp_path_factory.mktemp("int8") / "model")


def _graph(path: Path):
    return onnx.load(str(path), load_external_data=False).graph


def _ops(path: Path) -> Counter:
    return Counter(node.op_type for node in _graph(path).node)


def _float_matrices(path: Path) -> dict[str, list[int]]:
    return {i.name: list(i.dims) for i in _graph(path).initializer if i.data_type == 1 and len(i.dims) == 2}


def _external(path: Path) -> dict[str, str]:
    """Tensor name -> the file its data is in, for tensors kept outside the graph file."""
    return {i.name: i.external_data[0].value for i in _graph(path).initializer if i.external_data}


def _weights_bytes(directory: Path) -> int:
    return sum((directory / n).stat().st_size for n in (ENCODER_FILE, DECODER_FILE, SHARED_WEIGHTS_FILE))


def test_int8_shrinks_the_weights_and_keeps_other_files(tiny_onnx_dir: Path, int8_dir: Path) -> None:
    # d_model 32: the graphs' structure weighs as much as their weights, so the files shrink less than 4x.
    for name in (ENCODER_FILE, DECODER_FILE):
        assert (int8_dir / name).stat().st_size < (tiny_onnx_dir / name).stat().st_size, name
    shared_before, shared_after = ((d / SHARED_WEIGHTS_FILE).stat().st_size for d in (tiny_onnx_dir, int8_dir))
    assert shared_after < shared_before / 3  # the embedding and positions, int8 instead of float
    assert _weights_bytes(int8_dir) < 0.8 * _weights_bytes(tiny_onnx_dir)
    source = read_manifest(tiny_onnx_dir)
    for name, info in source.files.items():
        if name not in (ENCODER_FILE, DECODER_FILE, SHARED_WEIGHTS_FILE):
            assert sha256_file(int8_dir / name) == info["sha256"]


def test_every_weight_matrix_is_quantized_and_the_lm_head_reads_the_int8_embedding(int8_dir: Path) -> None:
    for name in (ENCODER_FILE, DECODER_FILE):
        assert _float_matrices(int8_dir / name) == {}, name  # embeddings and all MatMul weights are int8
    decoder = _ops(int8_dir / DECODER_FILE)
    assert decoder["Gemm"] == 0 and decoder["MatMulInteger"] == 16 and decoder["QGemm"] == 1  # 8 per layer + head
    graph = _graph(int8_dir / DECODER_FILE)
    head = next(n for n in graph.node if n.op_type == "QGemm")
    attrs = {a.name: a.i for a in head.attribute}
    assert head.name == LM_HEAD and attrs["transB"] == 1
    # One int8 vocabulary matrix, row-major (vocab, d_model): the head's B and the token lookup's table.
    lookups = [n.name for n in graph.node if n.op_type == "Gather" and n.input[0] == head.input[3]]
    assert head.input[3] == "embed_tokens.weight_int8" and lookups == ["/embed_tokens/Gather"]
    matrix = next(i for i in graph.initializer if i.name == head.input[3])
    assert matrix.data_type == onnx.TensorProto.INT8 and list(matrix.dims) == [354, 32]
    scales = next(i for i in graph.initializer if i.name == head.input[4])
    assert list(scales.dims) == [354]  # one per vocabulary entry: per output channel of the head


def test_int8_lookup_is_the_row_times_its_scale(int8_dir: Path, tiny_onnx_dir: Path, tmp_path: Path) -> None:
    import numpy as np
    import onnxruntime as ort
    from onnx import numpy_helper

    # The token lookup alone (it keeps its output name), cut out of each decoder graph and run on every id.
    def lookup(directory: Path) -> np.ndarray:
        cut = tmp_path / f"{directory.parent.name}-lookup.onnx"
        onnx.utils.extract_model(
            str(directory / DECODER_FILE), str(cut), ["input_ids"], ["/embed_tokens/Gather_output_0"]
        )
        session = ort.InferenceSession(str(cut), providers=["CPUExecutionProvider"])
        return session.run(None, {"input_ids": np.arange(354, dtype=np.int64)[:, None]})[0][:, 0]

    graph = onnx.load(str(tiny_onnx_dir / DECODER_FILE)).graph
    table = numpy_helper.to_array(next(i for i in graph.initializer if i.name == "embed_tokens.weight"))
    np.testing.assert_array_equal(lookup(tiny_onnx_dir), table)
    quantized = lookup(int8_dir)
    # Symmetric int8 per row: every entry within half a step (max |row| / 127, over 2) of the float value.
    step = np.abs(table).max(axis=1, keepdims=True) / 127
    assert (np.abs(quantized - table) <= step / 2 + 1e-6).all()
    assert not np.array_equal(quantized, table)


def test_int8_embedding_is_stored_once_for_both_graphs(int8_dir: Path) -> None:
    encoder, decoder = _external(int8_dir / ENCODER_FILE), _external(int8_dir / DECODER_FILE)
    assert encoder["encoder.embed_tokens.weight_int8"] == SHARED_WEIGHTS_FILE
    assert decoder["embed_tokens.weight_int8"] == SHARED_WEIGHTS_FILE
    assert SHARED_WEIGHTS_FILE in read_manifest(int8_dir).files


def test_manifest_records_the_quantization_with_new_hashes(tiny_onnx_dir: Path, int8_dir: Path) -> None:
    manifest = read_manifest(int8_dir)
    verify_files(int8_dir, manifest)  # every sha256 and size is the new file's
    q = manifest.quantization
    assert q is not None
    assert q["method"] == "dynamic int8" and q["weights"] == "QInt8" and q["per_channel"] is True
    assert q["parts"] == "all" and q["op_types"] == ["MatMul", "Gemm", "Gather"] and q["excluded_nodes"] == []
    assert q["tool"].startswith("onnxruntime ")
    files = q["files"]
    assert set(files) == {ENCODER_FILE, DECODER_FILE, SHARED_WEIGHTS_FILE}
    assert files[DECODER_FILE]["quantized_nodes"] == 19  # 17 MatMul + token and position embeddings
    assert files[DECODER_FILE]["bytes_after"] == (int8_dir / DECODER_FILE).stat().st_size
    assert q["source_sha256"][DECODER_FILE] == read_manifest(tiny_onnx_dir).files[DECODER_FILE]["sha256"]
    assert manifest.provenance["quantized_from"] == str(tiny_onnx_dir.resolve())
    assert manifest.graphs == read_manifest(tiny_onnx_dir).graphs  # same inputs and outputs


def test_result_loads_and_translates(int8_dir: Path, tiny_onnx_dir: Path) -> None:
    translator = Translator(int8_dir)
    for beams in (1, 4):
        results = translator.translate(TEXTS, beams=beams, max_new_tokens=10)
        assert all(r.token_ids and r.text for r in results)
    # Quantization changes numbers, not the interface: the first step's logits stay close to fp32's.
    import numpy as np

    fp32 = Translator(tiny_onnx_dir)
    ids = np.array([fp32.tokenizer.encode(TEXTS[1])], dtype=np.int64)
    start = np.array([[fp32.manifest.tokens["decoder_start"]]], dtype=np.int64)
    a, _ = fp32.graphs.step(start, fp32.graphs.encode(ids, np.ones_like(ids)))
    b, _ = translator.graphs.step(start, translator.graphs.encode(ids, np.ones_like(ids)))
    assert np.corrcoef(a[0], b[0])[0, 1] > 0.9


def test_source_directory_is_not_modified(tiny_onnx_dir: Path, tmp_path: Path) -> None:
    before = {p.name: sha256_file(p) for p in tiny_onnx_dir.iterdir()}
    _quantize(tiny_onnx_dir, tmp_path / "q")
    assert {p.name: sha256_file(p) for p in tiny_onnx_dir.iterdir()} == before


def test_parts_encoder_leaves_the_decoder_bytes_unchanged(tiny_onnx_dir: Path, tmp_path: Path) -> None:
    out = _quantize(tiny_onnx_dir, tmp_path / "enc", parts="encoder")
    assert (out / DECODER_FILE).read_bytes() == (tiny_onnx_dir / DECODER_FILE).read_bytes()
    assert (out / ENCODER_FILE).stat().st_size < (tiny_onnx_dir / ENCODER_FILE).stat().st_size
    assert list(read_manifest(out).quantization["files"]) == [ENCODER_FILE, SHARED_WEIGHTS_FILE]
    # The decoder still reads the source's shared file, which is copied as it was.
    assert (out / SHARED_WEIGHTS_FILE).read_bytes() == (tiny_onnx_dir / SHARED_WEIGHTS_FILE).read_bytes()
    assert Translator(out).translate(TEXTS, max_new_tokens=5)[0].token_ids


def test_parts_decoder_leaves_the_encoder_bytes_unchanged(tiny_onnx_dir: Path, tmp_path: Path) -> None:
    out = _quantize(tiny_onnx_dir, tmp_path / "dec", parts="decoder")
    assert (out / ENCODER_FILE).read_bytes() == (tiny_onnx_dir / ENCODER_FILE).read_bytes()
    assert (out / SHARED_WEIGHTS_FILE).read_bytes() == (tiny_onnx_dir / SHARED_WEIGHTS_FILE).read_bytes()
    # The decoder's weights are all int8 now, its embedding in the graph file (the shared one is the encoder's
    # float copy). With d_model 32 that makes decoder.onnx no smaller: the int8 embedding comes back inline.
    assert _float_matrices(out / DECODER_FILE) == {} and _external(out / DECODER_FILE) == {}
    assert Translator(out).translate(TEXTS, max_new_tokens=5)[0].token_ids


def test_partial_quantization_keeps_sharing_unchanged_float_weights(tiny_onnx_dir: Path, tmp_path: Path) -> None:
    # Decoder only, LM head in float: the decoder's float embedding is the encoder's, so it stays in the shared file.
    out = _quantize(tiny_onnx_dir, tmp_path / "dec", parts="decoder", exclude=(LM_HEAD,))
    assert _external(out / DECODER_FILE) == {"embed_tokens.weight": SHARED_WEIGHTS_FILE}
    assert _ops(out / DECODER_FILE)["Gemm"] == 1
    assert Translator(out).translate(TEXTS, max_new_tokens=5)[0].token_ids


def test_excluded_lm_head_stays_a_gemm_sharing_the_float_embedding(tiny_onnx_dir: Path, tmp_path: Path) -> None:
    out = _quantize(tiny_onnx_dir, tmp_path / "head", exclude=(LM_HEAD,))
    graph = _graph(out / DECODER_FILE)
    gemm = next(n for n in graph.node if n.op_type == "Gemm")
    assert gemm.name == LM_HEAD and gemm.input[1] == "embed_tokens.weight"
    # One float copy of the embedding, read by the head and by the (then unquantized) token Gather. The encoder's
    # embedding is int8, so nothing is shared any more.
    assert _float_matrices(out / DECODER_FILE) == {"embed_tokens.weight": [354, 32]}
    assert not (out / SHARED_WEIGHTS_FILE).exists() and SHARED_WEIGHTS_FILE not in read_manifest(out).files
    assert sum("embed_tokens.weight" in n.input for n in graph.node) == 2
    assert read_manifest(out).quantization["excluded_nodes"] == [LM_HEAD]
    assert Translator(out).translate(TEXTS, max_new_tokens=5)[0].token_ids


@pytest.mark.parametrize("int4", [False, True])
def test_lm_head_alias_excludes_the_tied_head(tiny_onnx_dir: Path, tmp_path: Path, int4: bool) -> None:
    out = _quantize(tiny_onnx_dir, tmp_path / "alias", exclude=("lm_head",), int4=int4)
    graph = _graph(out / DECODER_FILE)
    assert [(n.name, n.input[1]) for n in graph.node if n.op_type == "Gemm"] == [(LM_HEAD, "embed_tokens.weight")]
    assert [n.op_type for n in graph.node if "embed_tokens.weight" in n.input] == ["Gather", "Gemm"]
    assert Translator(out).translate(TEXTS, max_new_tokens=5)[0].token_ids


def test_op_types_matmul_only_keeps_embeddings_float(tiny_onnx_dir: Path, tmp_path: Path) -> None:
    out = _quantize(tiny_onnx_dir, tmp_path / "mm", op_types=("MatMul",))
    floats = _float_matrices(out / DECODER_FILE)
    assert set(floats) == {"embed_tokens.weight", "embed_positions.weight"}
    assert _ops(out / DECODER_FILE)["Gemm"] == 1
    assert Translator(out).translate(TEXTS, max_new_tokens=5)[0].token_ids


def test_per_tensor_option(tiny_onnx_dir: Path, tmp_path: Path) -> None:
    out = _quantize(tiny_onnx_dir, tmp_path / "pt", per_channel=False)
    assert read_manifest(out).quantization["per_channel"] is False
    scales = [i for i in _graph(out / DECODER_FILE).initializer if i.name.endswith("_scale")]
    assert scales and all(len(s.dims) == 0 for s in scales)


def test_int4_weight_only(tiny_onnx_dir: Path, int8_dir: Path, tmp_path: Path) -> None:
    out = _quantize(tiny_onnx_dir, tmp_path / "int4", int4=True)
    decoder = _ops(out / DECODER_FILE)
    assert decoder["MatMulNBits"] == 17 and decoder["GatherBlockQuantized"] == 2 and decoder["Gemm"] == 0
    for name in (ENCODER_FILE, DECODER_FILE, SHARED_WEIGHTS_FILE):
        assert (out / name).stat().st_size < (int8_dir / name).stat().st_size, name
    q = read_manifest(out).quantization
    assert q["method"] == "weight-only int4" and "blocks of 32" in q["weights"]
    results = Translator(out).translate(TEXTS, beams=4, max_new_tokens=8)
    assert all(r.token_ids for r in results)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"parts": "middle"}, "parts must be one of encoder, decoder, all"),
        ({"op_types": ("Conv",)}, r"valid: MatMul, Gemm, Gather"),
        ({"exclude": ("/MatMul_8_tie",)}, "did you mean /MatMul_8_tied"),
        ({"int4": True, "block_size": 24}, "power of two"),
    ],
)
def test_bad_options_raise(tiny_onnx_dir: Path, tmp_path: Path, options: dict, message: str) -> None:
    with pytest.raises(QuantizeError, match=message):
        _quantize(tiny_onnx_dir, tmp_path / "out", **options)
    assert not (tmp_path / "out").exists()


def test_refuses_to_overwrite_the_source_or_a_non_empty_dir_or_requantize(
    tiny_onnx_dir: Path, int8_dir: Path, tmp_path: Path
) -> None:
    with pytest.raises(QuantizeError, match="is the source directory"):
        _quantize(tiny_onnx_dir, tiny_onnx_dir, force=True)
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    with pytest.raises(QuantizeError, match="--force"):
        _quantize(tiny_onnx_dir, tmp_path / "full")
    _quantize(tiny_onnx_dir, tmp_path / "full", force=True)
    assert (tmp_path / "full" / MANIFEST_NAME).is_file() and not (tmp_path / "full" / "x").exists()
    with pytest.raises(QuantizeError, match="already quantized"):
        _quantize(int8_dir, tmp_path / "twice")


def test_needs_neither_torch_nor_transformers(tiny_onnx_dir: Path, tmp_path: Path) -> None:
    code = (
        "import sys\n"
        "sys.modules['torch'] = None; sys.modules['transformers'] = None\n"
        "from onnxmt.export.quantize import quantize\n"
        f"quantize({str(tiny_onnx_dir)!r}, {str(tmp_path / 'q')!r}, progress=lambda _: None)\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
    assert json.loads((tmp_path / "q" / MANIFEST_NAME).read_text())["quantization"]["method"] == "dynamic int8"


def test_cli_prints_sizes_before_and_after(tiny_onnx_dir: Path, tmp_path: Path) -> None:
    result = runner.invoke(
        app, ["quantize", str(tiny_onnx_dir), str(tmp_path / "q"), "--parts", "decoder", "--exclude", LM_HEAD]
    )
    assert result.exit_code == 0, result.output
    for word in ("decoder.onnx", "before", "after", "total", "kB"):
        assert word in result.output
    assert read_manifest(tmp_path / "q").quantization["excluded_nodes"] == [LM_HEAD]
    again = runner.invoke(app, ["quantize", str(tiny_onnx_dir), str(tmp_path / "q")])
    assert again.exit_code == 2 and "--force" in again.output
