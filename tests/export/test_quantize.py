"""`onnxmt quantize`: smaller graphs in a new directory that loads, translates and says what was done."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from onnxmt import Translator
from onnxmt.cli import app
from onnxmt.manifest import (
    DECODER_FILE,
    ENCODER_FILE,
    MANIFEST_NAME,
    WEIGHTS_FILE,
    read_manifest,
    sha256_file,
    verify_files,
)
from tests.helpers.skips import importorskip

onnx = importorskip("onnx")

from onnxmt.export.quantize import QuantizeError, QuantizeOptions, quantize  # noqa: E402

LM_HEAD = "/MatMul_20_tied"  # the export's name for the tied LM head Gemm
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


def _where(path: Path) -> dict[str, tuple[str, int, int]]:
    """Tensor name -> (file, offset, length), for tensors kept outside the graph file."""
    out = {}
    for init in _graph(path).initializer:
        if init.external_data:
            info = {e.key: e.value for e in init.external_data}
            out[init.name] = (info["location"], int(info.get("offset", 0)), int(info["length"]))
    return out


def _joined(path: Path):
    """The graph as the quantizer sees it: weights read in, the LM head's chunks joined into one node."""
    from onnxmt.export.weights import join_heads

    model = onnx.load(str(path))
    join_heads(model)
    return model.graph


def _contents(path: Path) -> tuple[list, dict]:
    """What a graph computes, whatever file its weights are in: its nodes, and each tensor's type, shape, bytes."""
    graph = onnx.load(str(path)).graph
    nodes = [(n.op_type, n.name, list(n.input), list(n.output), n.SerializeToString()) for n in graph.node]
    return nodes, {i.name: (i.data_type, list(i.dims), i.raw_data) for i in graph.initializer}


def _rows_of(path: Path, whole: str) -> list[str]:
    """The external tensors of `path` that lie inside `whole`'s bytes, checking that they cover them in order."""
    where = _where(path)
    location, start, length = where[whole]
    parts = sorted((v[1], v[2], k) for k, v in where.items() if k != whole and k.startswith(whole + ".rows"))
    assert all(where[k][0] == location for _, _, k in parts)
    assert [p[0] for p in parts] == list(np.cumsum([start] + [p[1] for p in parts[:-1]]))
    assert sum(p[1] for p in parts) == length
    return [k for _, _, k in parts]


def _weights_bytes(directory: Path) -> int:
    return sum((directory / n).stat().st_size for n in (ENCODER_FILE, DECODER_FILE, WEIGHTS_FILE))


def test_int8_shrinks_the_weights_and_keeps_other_files(tiny_onnx_dir: Path, int8_dir: Path) -> None:
    # d_model 32: the graphs' structure weighs as much as their weights, so the files shrink less than 4x.
    for name in (ENCODER_FILE, DECODER_FILE):
        assert (int8_dir / name).stat().st_size < (tiny_onnx_dir / name).stat().st_size, name
    shared_before, shared_after = ((d / WEIGHTS_FILE).stat().st_size for d in (tiny_onnx_dir, int8_dir))
    assert shared_after < shared_before / 3  # the embedding and positions, int8 instead of float
    assert _weights_bytes(int8_dir) < 0.8 * _weights_bytes(tiny_onnx_dir)
    source = read_manifest(tiny_onnx_dir)
    for name, info in source.files.items():
        if name not in (ENCODER_FILE, DECODER_FILE, WEIGHTS_FILE):
            assert sha256_file(int8_dir / name) == info["sha256"]


def test_every_weight_matrix_is_quantized_and_the_lm_head_reads_the_int8_embedding(int8_dir: Path) -> None:
    for name in (ENCODER_FILE, DECODER_FILE):
        assert _float_matrices(int8_dir / name) == {}, name  # embeddings and all MatMul weights are int8
    decoder = _ops(int8_dir / DECODER_FILE)
    assert decoder["Gemm"] == 0 and decoder["MatMulInteger"] == 12  # 6 per layer (query, key and value in one)
    graph = _graph(int8_dir / DECODER_FILE)
    (head,) = [n for n in graph.node if n.op_type == "DynamicQuantizeMatMul" and "tied" in n.name]
    assert head.name == LM_HEAD
    # One int8 vocabulary matrix, row-major (vocab, d_model), read by the token lookup and by the head. The head reads
    # it through a Transpose of a second initializer on the same bytes: ONNX Runtime folds the Transpose at load
    # and packs the head from it, with no scratch copy kept (export/weights.py). Nothing is stored twice.
    flip = next(n for n in graph.node if n.output[0] == head.input[1])
    assert flip.op_type == "Transpose"
    lookups = [n.name for n in graph.node if n.op_type == "Gather" and n.input[0] == "embed_tokens.weight_int8"]
    assert lookups == ["/embed_tokens/Gather"]
    where = _where(int8_dir / DECODER_FILE)
    assert where[flip.input[0]] == where["embed_tokens.weight_int8"]
    matrix = next(i for i in graph.initializer if i.name == "embed_tokens.weight_int8")
    assert matrix.data_type == onnx.TensorProto.INT8 and list(matrix.dims) == [353, 32]
    scales = next(i for i in graph.initializer if i.name == head.input[2])
    assert list(scales.dims) == [353]  # one per vocabulary entry: per output channel of the head
    # The logits' bias goes into the head's own epilogue (its fifth input), not a pass over the logits after it.
    assert len(head.input) == 5 and head.input[3] == "" and head.output[0] == "logits"
    bias = next(i for i in graph.initializer if i.name == head.input[4])
    assert list(bias.dims) == [353]


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
        return session.run(None, {"input_ids": np.arange(353, dtype=np.int64)[:, None]})[0][:, 0]

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
    assert encoder["encoder.embed_tokens.weight_int8"] == WEIGHTS_FILE
    assert decoder["embed_tokens.weight_int8"] == WEIGHTS_FILE
    assert WEIGHTS_FILE in read_manifest(int8_dir).files


def test_manifest_records_the_quantization_with_new_hashes(tiny_onnx_dir: Path, int8_dir: Path) -> None:
    manifest = read_manifest(int8_dir)
    verify_files(int8_dir, manifest)  # every sha256 and size is the new file's
    q = manifest.quantization
    assert q is not None
    assert q["method"] == "dynamic int8" and q["weights"] == "QInt8" and q["per_channel"] is True
    assert q["parts"] == "all" and q["op_types"] == ["MatMul", "Gemm", "Gather"] and q["excluded_nodes"] == []
    assert q["tool"].startswith("onnxruntime ")
    files = q["files"]
    assert set(files) == {ENCODER_FILE, DECODER_FILE, WEIGHTS_FILE}
    assert files[DECODER_FILE]["quantized_nodes"] == 15  # 13 MatMul + token and position embeddings
    assert files[DECODER_FILE]["bytes_after"] == (int8_dir / DECODER_FILE).stat().st_size
    assert q["source_sha256"][DECODER_FILE] == read_manifest(tiny_onnx_dir).files[DECODER_FILE]["sha256"]
    assert manifest.provenance["quantized_from"] == str(tiny_onnx_dir.resolve())
    assert manifest.graphs == read_manifest(tiny_onnx_dir).graphs  # same inputs and outputs


def test_result_loads_and_translates(int8_dir: Path, tiny_onnx_dir: Path) -> None:
    translator = Translator(int8_dir)
    for beams in (1, 4):
        results = translator.translate(TEXTS, beams=beams, max_new_tokens=10)
        assert all(r.token_ids and r.text for r in results)
    assert_damage_bounded(tiny_onnx_dir, int8_dir, max_error=0.04, top1=0.85, top5=0.9)


# Sentences of many lengths: in one batch, the short ones are padded and every row shares the activation scales.
MIXED = [
    "Hello world.",
    "The river is long and the mountain is high",
    "a small quiet garden",
    "The doctor came to the school in the morning and the children were happy to see her there",
    "music",
    "Where is the market, and how far is it from the city by train?",
    "Every evening my friend reads a letter from her family",
    "green yellow bright heavy",
    "It was the first time that the people of the city had seen so much water in the river",
    "one two three",
]


def _forced_logits(translator: Translator, text: str, path: np.ndarray | None, steps: int = 12) -> np.ndarray:
    """(steps, vocab) logits of `text`'s first decoder steps, each step fed `path`'s token (None: its own argmax)."""
    ids = np.array([translator.tokenizer.encode(text)], dtype=np.int64)
    cache = translator.graphs.encode(ids, np.ones_like(ids))
    token = np.array([[translator.manifest.tokens["decoder_start"]]], dtype=np.int64)
    out = []
    for i in range(steps):
        logits, cache = translator.graphs.step(token, cache)
        out.append(logits[0].copy())
        token = np.array([[logits[0].argmax() if path is None else path[i]]], dtype=np.int64)
    return np.array(out)


def assert_damage_bounded(fp32_dir: Path, quantized_dir: Path, *, max_error: float, top1: float, top5: float) -> None:
    """What quantization does to the logits, along fp32's greedy path (both models fed the same tokens) over MIXED:
    the largest error at any step, as a share of that step's logit range; how often the best token is fp32's; how
    much of fp32's five best tokens it keeps. The bounds are about twice what these tiny models lose (their 32-wide
    layers lose more than real models do): a broken scale or rounding is many times worse."""
    fp32, quantized = Translator(fp32_dir), Translator(quantized_dir)
    errors, best, five = [], [], []
    for text in MIXED:
        a = _forced_logits(fp32, text, None)
        b = _forced_logits(quantized, text, a.argmax(-1))
        errors.append(np.abs(a - b).max(-1) / (a.max(-1) - a.min(-1)))
        best.append(a.argmax(-1) == b.argmax(-1))
        top_a, top_b = np.argsort(-a, -1)[:, :5], np.argsort(-b, -1)[:, :5]
        five.append([len(set(x) & set(y)) / 5 for x, y in zip(top_a, top_b, strict=True)])
    assert np.max(errors) <= max_error, np.max(errors)
    assert np.mean(best) >= top1, np.mean(best)
    assert np.mean(five) >= top5, np.mean(five)


def _weight_scales(graph) -> list[tuple[str, str, str]]:  # type: ignore[no-untyped-def]
    """(node, its int8 weight, its weight scale) for every quantized MatMul on a weight (not the head, whose int8
    rows the vocabulary tables' test checks), found by the graph's structure: MatMulIntegerToFloat takes the scale
    as an input; MatMulInteger's integer product is cast and multiplied by (activation scale x weight scale)."""
    inits = {i.name for i in graph.initializer}
    producer = {o: n for n in graph.node for o in n.output}
    readers: dict[str, list] = {}
    for node in graph.node:
        for name in node.input:
            readers.setdefault(name, []).append(node)
    out = []
    for node in graph.node:
        if node.op_type in ("MatMulIntegerToFloat", "MatMulInteger") and node.input[1] not in inits:
            continue  # the head: it reads the vocabulary table's int8 rows through a Transpose
        if node.op_type == "MatMulIntegerToFloat":
            scale = node.input[3]
        elif node.op_type == "MatMulInteger":
            (cast,) = readers[node.output[0]]
            (mul,) = readers[cast.output[0]]
            product = producer[next(i for i in mul.input if i != cast.output[0])]
            scale = next(i for i in product.input if i in inits)
        else:
            continue
        out.append((node.name, node.input[1], scale))
    return out


@pytest.mark.parametrize("activations", ["tensor", "row"], ids=["per-tensor-activations", "per-row-activations"])
def test_every_matmul_weight_has_a_scale_per_output_channel_within_half_a_step(
    activations: str, int8_dir: Path, per_row_dir: Path, tiny_onnx_dir: Path
) -> None:
    from onnx import numpy_helper

    directory = int8_dir if activations == "tensor" else per_row_dir
    for name in (ENCODER_FILE, DECODER_FILE):
        source = onnx.load(str(tiny_onnx_dir / name)).graph
        floats = {i.name: numpy_helper.to_array(i) for i in source.initializer}
        matmuls = {n.name: floats[n.input[1]] for n in source.node if n.op_type == "MatMul" and n.input[1] in floats}
        graph = onnx.load(str(directory / name)).graph
        inits = {i.name: numpy_helper.to_array(i) for i in graph.initializer}
        found = _weight_scales(graph)
        assert len(found) == len(matmuls), name  # every MatMul on a weight, each once
        for node, weight, scale in found:
            w8, s = inits[weight].astype(np.float64), inits[scale].astype(np.float64)
            assert s.shape == (w8.shape[1],), (node, w8.shape, s.shape)  # 1-D: one per output channel
            original = matmuls[node.removesuffix("_quant")]
            assert (np.abs(w8 * s - original) <= s / 2 + 1e-7).all(), node  # each within half its channel's step
            assert np.allclose(s, np.abs(original).max(0) / 127, rtol=1e-5), node  # symmetric, over the channel


def test_excluded_matmuls_stay_float(tiny_onnx_dir: Path, tmp_path: Path) -> None:
    from onnx import numpy_helper

    excluded = ("/encoder/layers.0/fc1/MatMul", "/MatMul_4")
    out = _quantize(tiny_onnx_dir, tmp_path / "excluded", exclude=excluded)
    for name, kept in ((ENCODER_FILE, excluded[0]), (DECODER_FILE, excluded[1])):
        source = onnx.load(str(tiny_onnx_dir / name)).graph
        graph = onnx.load(str(out / name)).graph
        floats = {i.name: i for i in graph.initializer}
        before = next(n for n in source.node if n.name == kept)
        after = [n for n in graph.node if n.name == kept]
        assert [n.op_type for n in after] == ["MatMul"], name
        weight = floats[after[0].input[1]]
        assert weight.data_type == onnx.TensorProto.FLOAT
        original = next(i for i in source.initializer if i.name == before.input[1])
        np.testing.assert_array_equal(numpy_helper.to_array(weight), numpy_helper.to_array(original))
        others = [n.name for n in source.node if n.op_type == "MatMul" and n.input[1] in floats and n.name != kept]
        quantized = {n.name.removesuffix("_quant") for n in graph.node if n.op_type == "MatMulInteger"}
        assert set(others) <= quantized and kept not in quantized, name
    assert read_manifest(out).quantization["excluded_nodes"] == list(excluded)
    assert Translator(out).translate(TEXTS, max_new_tokens=5)[0].token_ids


def test_cache_buffer_export_quantizes_and_translates_like_the_concat_one(
    tiny_concat_onnx_dir: Path, int8_dir: Path, tmp_path: Path
) -> None:
    # The same weights in the other decoder form: quantized the same way, it gives the same translations.
    buffered = Translator(int8_dir)
    assert buffered.graphs.buffered
    concat = Translator(_quantize(tiny_concat_onnx_dir, tmp_path / "q"))
    assert not concat.graphs.buffered
    for beams in (1, 4):
        got = buffered.translate(TEXTS, beams=beams, max_new_tokens=10)
        assert [t.token_ids for t in got] == [
            t.token_ids for t in concat.translate(TEXTS, beams=beams, max_new_tokens=10)
        ]


def test_source_directory_is_not_modified(tiny_onnx_dir: Path, tmp_path: Path) -> None:
    before = {p.name: sha256_file(p) for p in tiny_onnx_dir.iterdir()}
    _quantize(tiny_onnx_dir, tmp_path / "q")
    assert {p.name: sha256_file(p) for p in tiny_onnx_dir.iterdir()} == before


def test_parts_encoder_leaves_the_decoder_unchanged(tiny_onnx_dir: Path, tmp_path: Path) -> None:
    out = _quantize(tiny_onnx_dir, tmp_path / "enc", parts="encoder")
    # Same nodes, same tensors; only where the weights file keeps them may differ (it no longer holds float
    # encoder weights).
    assert _contents(out / DECODER_FILE) == _contents(tiny_onnx_dir / DECODER_FILE)
    assert _float_matrices(out / ENCODER_FILE) == {} and _ops(out / ENCODER_FILE)["MatMulInteger"] > 0
    assert list(read_manifest(out).quantization["files"]) == [ENCODER_FILE, WEIGHTS_FILE]
    assert Translator(out).translate(TEXTS, max_new_tokens=5)[0].token_ids


def test_parts_decoder_leaves_the_encoder_unchanged(tiny_onnx_dir: Path, tmp_path: Path) -> None:
    out = _quantize(tiny_onnx_dir, tmp_path / "dec", parts="decoder")
    assert _contents(out / ENCODER_FILE) == _contents(tiny_onnx_dir / ENCODER_FILE)
    assert _float_matrices(out / DECODER_FILE) == {}  # the decoder's weights are all int8
    assert Translator(out).translate(TEXTS, max_new_tokens=5)[0].token_ids


def test_partial_quantization_keeps_sharing_unchanged_float_weights(tiny_onnx_dir: Path, tmp_path: Path) -> None:
    # Decoder only, LM head in float: the decoder's float embedding is the encoder's, so both point to one copy.
    out = _quantize(tiny_onnx_dir, tmp_path / "dec", parts="decoder", exclude=(LM_HEAD,))
    encoder, decoder = _where(out / ENCODER_FILE), _where(out / DECODER_FILE)
    assert decoder["embed_tokens.weight"] == encoder["encoder.embed_tokens.weight"]
    biases = {n for n in decoder if n.startswith(f"{LM_HEAD}.bias.rows")}  # the head's bias, cut with its rows
    assert len(biases) >= 2
    assert set(decoder) - biases == {"embed_tokens.weight", *_rows_of(out / DECODER_FILE, "embed_tokens.weight")}
    assert [n.op_type for n in _joined(out / DECODER_FILE).node].count("Gemm") == 1
    assert Translator(out).translate(TEXTS, max_new_tokens=5)[0].token_ids


def test_excluded_lm_head_stays_a_gemm_sharing_the_float_embedding(tiny_onnx_dir: Path, tmp_path: Path) -> None:
    out = _quantize(tiny_onnx_dir, tmp_path / "head", exclude=(LM_HEAD,))
    graph = _joined(out / DECODER_FILE)
    gemm = next(n for n in graph.node if n.op_type == "Gemm")
    assert gemm.name == LM_HEAD and gemm.input[1] == "embed_tokens.weight"
    # One float copy of the embedding, read by the head and by the (then unquantized) token Gather. The encoder's
    # embedding is int8, so nothing else shares it.
    assert {i.name: list(i.dims) for i in graph.initializer if i.data_type == 1 and len(i.dims) == 2} == {
        "embed_tokens.weight": [353, 32]
    }
    assert sum("embed_tokens.weight" in n.input for n in graph.node) == 2
    stored = _rows_of(out / DECODER_FILE, "embed_tokens.weight")  # the head's chunks point into it
    assert set(_float_matrices(out / DECODER_FILE)) == {"embed_tokens.weight", *stored}
    assert read_manifest(out).quantization["excluded_nodes"] == [LM_HEAD]
    assert Translator(out).translate(TEXTS, max_new_tokens=5)[0].token_ids


@pytest.mark.parametrize("int4", [False, True])
def test_lm_head_alias_excludes_the_tied_head(tiny_onnx_dir: Path, tmp_path: Path, int4: bool) -> None:
    out = _quantize(tiny_onnx_dir, tmp_path / "alias", exclude=("lm_head",), int4=int4)
    graph = _joined(out / DECODER_FILE)
    assert [(n.name, n.input[1]) for n in graph.node if n.op_type == "Gemm"] == [(LM_HEAD, "embed_tokens.weight")]
    assert [n.op_type for n in graph.node if "embed_tokens.weight" in n.input] == ["Gather", "Gemm"]
    assert Translator(out).translate(TEXTS, max_new_tokens=5)[0].token_ids


def test_op_types_matmul_only_keeps_embeddings_float(tiny_onnx_dir: Path, tmp_path: Path) -> None:
    out = _quantize(tiny_onnx_dir, tmp_path / "mm", op_types=("MatMul",))
    graph = _joined(out / DECODER_FILE)
    floats = {i.name for i in graph.initializer if i.data_type == 1 and len(i.dims) == 2}
    assert floats == {"embed_tokens.weight", "embed_positions.weight"}
    assert [n.op_type for n in graph.node].count("Gemm") == 1
    assert Translator(out).translate(TEXTS, max_new_tokens=5)[0].token_ids


def test_per_tensor_option(tiny_onnx_dir: Path, tmp_path: Path) -> None:
    out = _quantize(tiny_onnx_dir, tmp_path / "pt", per_channel=False)
    assert read_manifest(out).quantization["per_channel"] is False
    scales = [i for i in _graph(out / DECODER_FILE).initializer if i.name.endswith("_scale")]
    assert scales and all(len(s.dims) == 0 for s in scales)


def _alone_and_batched(directory: Path, beams: int) -> tuple[list[list[int]], list[list[int]]]:
    translator = Translator(directory)
    options = {"beams": beams, "max_new_tokens": 12}
    alone = [translator.translate([t], **options)[0].token_ids for t in MIXED]
    batched = [r.token_ids for r in translator.translate(MIXED, batch_size=len(MIXED), **options)]
    return alone, batched


@pytest.fixture(scope="module")
def per_row_dir(tiny_onnx_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _quantize(tiny_onnx_dir, tmp_path_factory.mktemp("int8-rows") / "model", per_row_scales=True)


@pytest.mark.parametrize("beams", [1, 4])
def test_per_row_scales_make_int8_batch_invariant(int8_dir: Path, per_row_dir: Path, beams: int) -> None:
    # The default int8 graphs quantize each activation tensor with one scale for the whole batch: on this model
    # some sentences change with their batch-mates (the premise), and with a scale per row none does.
    alone, batched = _alone_and_batched(int8_dir, beams)
    assert alone != batched
    alone, batched = _alone_and_batched(per_row_dir, beams)
    assert alone == batched


def test_per_row_scales_graphs_and_manifest(per_row_dir: Path, int8_dir: Path, tiny_onnx_dir: Path) -> None:
    for name in (ENCODER_FILE, DECODER_FILE):
        ops = _ops(per_row_dir / name)
        assert ops["DynamicQuantizeLinear"] == ops["DynamicQuantizeMatMul"] == ops["MatMulInteger"] == 0, name
        assert ops["MatMulIntegerToFloat"] > 0
    # Same int8 weights; only the activations' quantization differs.
    assert (per_row_dir / WEIGHTS_FILE).stat().st_size == (int8_dir / WEIGHTS_FILE).stat().st_size
    q = read_manifest(per_row_dir).quantization
    assert q["activation_scales"] == "per row" and read_manifest(int8_dir).quantization["activation_scales"] == (
        "per tensor"
    )
    # Numbers change, within the same bounds as per-tensor int8.
    assert_damage_bounded(tiny_onnx_dir, per_row_dir, max_error=0.04, top1=0.85, top5=0.9)


@pytest.mark.parametrize("normed", [False, True])
def test_per_row_scales_rewrite_is_exact(tmp_path: Path, normed: bool) -> None:
    # One quantized MatMul, on a LayerNormalization's output (symmetric rows) or not (rows centred on their
    # midrange): the graph computes round((x - m) / s) per row, times the int8 weights, times s, plus m's share.
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper
    from onnxruntime.quantization import QuantType, quantize_dynamic

    from onnxmt.export.row_scales import per_row_activations

    rng = np.random.default_rng(0)
    w = rng.standard_normal((16, 8)).astype(np.float32)
    inits = [numpy_helper.from_array(w, "w"), numpy_helper.from_array(np.ones(16, np.float32), "gamma")]
    nodes = [helper.make_node("MatMul", ["h" if normed else "x", "w"], ["y"], name="mm")]
    if normed:
        nodes.insert(0, helper.make_node("LayerNormalization", ["x", "gamma"], ["h"], axis=-1))
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, None, 16])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    graph = helper.make_graph(nodes, "g", [x], [y], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(tmp_path / "f.onnx"))
    quantize_dynamic(tmp_path / "f.onnx", tmp_path / "q.onnx", per_channel=True, weight_type=QuantType.QInt8)
    quantized = onnx.load(str(tmp_path / "q.onnx"))
    for init in quantized.graph.initializer:
        # Weights within +-63: on CPUs without VNNI, u8s8 kernels add pairs of products in saturating 16 bits,
        # which 255 * 127 * 2 would overflow; this test is about the rewrite, not about that.
        if init.data_type == TensorProto.INT8 and len(init.dims) == 2:
            init.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init) // 2, init.name))
    assert per_row_activations(quantized) == 1
    session = ort.InferenceSession(quantized.SerializeToString(), providers=["CPUExecutionProvider"])
    inputs = rng.standard_normal((2, 3, 16)).astype(np.float32) + 0.5
    inputs[1] *= 100  # another row's range does not move this one's
    got = session.run(None, {"x": inputs})[0]
    weights = {i.name: numpy_helper.to_array(i) for i in quantized.graph.initializer}
    w8 = next(v for v in weights.values() if v.dtype == np.int8 and v.ndim == 2).astype(np.float64)
    w_scale = next(v for k, v in weights.items() if k.endswith("_scale") and v.ndim == 1).astype(np.float64)
    rows = inputs.astype(np.float64)
    if normed:
        rows = (rows - rows.mean(-1, keepdims=True)) / np.sqrt(rows.var(-1, keepdims=True) + 1e-5)
        centre, half = 0.0, np.abs(rows).max(-1, keepdims=True)
    else:
        top, bottom = rows.max(-1, keepdims=True), rows.min(-1, keepdims=True)
        centre, half = (top + bottom) / 2, (top - bottom) / 2
    s = half / 127
    expected = (np.rint((rows - centre) / s) @ w8) * w_scale * s + centre * (w8.sum(0) * w_scale)
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4 * np.abs(expected).max())
    assert np.array_equal(session.run(None, {"x": inputs[:1]})[0], got[:1])


def test_int4_weight_only(tiny_onnx_dir: Path, int8_dir: Path, tmp_path: Path) -> None:
    out = _quantize(tiny_onnx_dir, tmp_path / "int4", int4=True)
    decoder = _ops(out / DECODER_FILE)
    assert decoder["MatMulNBits"] == 13 and decoder["GatherBlockQuantized"] == 2 and decoder["Gemm"] == 0
    for name in (ENCODER_FILE, DECODER_FILE, WEIGHTS_FILE):
        assert (out / name).stat().st_size < (int8_dir / name).stat().st_size, name
    q = read_manifest(out).quantization
    assert q["method"] == "weight-only int4" and "blocks of 32" in q["weights"]
    results = Translator(out).translate(TEXTS, beams=4, max_new_tokens=8)
    assert all(r.token_ids for r in results)
    # Four bits lose more than eight: bounds of their own, still far from what a wrong scale or block does.
    assert_damage_bounded(tiny_onnx_dir, out, max_error=0.5, top1=0.8, top5=0.55)


def test_int4_accuracy_level_is_the_matmuls_attribute(tiny_onnx_dir: Path, tmp_path: Path) -> None:
    # 4: activations quantized to int8 per block, integer products (onnxruntime-genai's CPU default).
    out = _quantize(tiny_onnx_dir, tmp_path / "int4", int4=True, accuracy_level=4)
    matmuls = [n for n in _graph(out / DECODER_FILE).node if n.op_type == "MatMulNBits"]
    assert matmuls and all(onnx.helper.get_node_attr_value(n, "accuracy_level") == 4 for n in matmuls)
    assert read_manifest(out).quantization["accuracy_level"] == 4
    results = Translator(out).translate(TEXTS, max_new_tokens=8)
    assert all(r.token_ids for r in results)


def test_int4_without_onnx_ir_names_the_extra(
    tiny_onnx_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # onnxruntime does not install onnx_ir, which its int4 quantizer imports: the export extra does.
    monkeypatch.setitem(sys.modules, "onnx_ir", None)
    monkeypatch.delitem(sys.modules, "onnxruntime.quantization.matmul_nbits_quantizer", raising=False)
    result = runner.invoke(app, ["quantize", str(tiny_onnx_dir), str(tmp_path / "int4"), "--int4"])
    assert result.exit_code == 2
    message = " ".join(result.output.split())  # rich wraps long lines
    assert "needs the export extra (onnx_ir is not installed)" in message
    assert message.endswith("[export]'") and "pip install " in message  # this install's source, quoted
    assert not (tmp_path / "int4").exists()


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"parts": "middle"}, "parts must be one of encoder, decoder, all"),
        ({"op_types": ("Conv",)}, r"valid: MatMul, Gemm, Gather"),
        ({"exclude": ("/MatMul_20_tie",)}, "did you mean /MatMul_20_tied"),
        ({"int4": True, "block_size": 24}, "power of two"),
        ({"int4": True, "per_row_scales": True}, "per_row_scales is for dynamic int8"),
        ({"int4": True, "accuracy_level": 5}, "accuracy_level must be 0, 1, 2, 3 or 4"),
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


def test_a_directory_with_weights_inside_its_graphs_runs_and_quantizes(tiny_onnx_dir: Path, tmp_path: Path) -> None:
    # Exports made before weights.bin (or by hand) keep their weights elsewhere: here inside the graph files, heads
    # whole. The runtime reads whatever the graphs point to; quantize stores the result the current way.
    from dataclasses import replace

    from onnxmt.export.weights import join_heads
    from onnxmt.manifest import describe_files

    old = tmp_path / "inline"
    shutil.copytree(tiny_onnx_dir, old, ignore=shutil.ignore_patterns(WEIGHTS_FILE))
    for name in (ENCODER_FILE, DECODER_FILE):
        model = onnx.load(str(tiny_onnx_dir / name))
        join_heads(model)
        onnx.save(model, str(old / name))
    manifest = read_manifest(tiny_onnx_dir)
    names = [n for n in manifest.files if n != WEIGHTS_FILE]
    replace(manifest, files=describe_files(old, names)).save(old)
    assert not _where(old / DECODER_FILE) and _ops(old / DECODER_FILE)["Gemm"] == 1
    want = Translator(tiny_onnx_dir).translate(TEXTS, beams=4, max_new_tokens=8)
    assert [r.token_ids for r in Translator(old).translate(TEXTS, beams=4, max_new_tokens=8)] == [
        r.token_ids for r in want
    ]
    out = _quantize(old, tmp_path / "q")
    assert WEIGHTS_FILE in read_manifest(out).files and _where(out / DECODER_FILE)
    assert Translator(out).translate(TEXTS, max_new_tokens=5)[0].token_ids


@pytest.mark.parametrize("per_channel", [True, False])
def test_int8_rows_in_blocks_are_the_whole_tables(
    per_channel: bool, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The vocabulary table is read and quantized a block of rows at a time (bounded memory): the same values and
    scales as the whole table at once, blocks not dividing the rows included."""
    from onnx import TensorProto

    from onnxmt.export import quantize as module
    from onnxmt.export.weights import Reader, point_to

    table = np.random.default_rng(0).standard_normal((1000, 48)).astype(np.float32)
    table[7] = 0  # an all-zero row: scale 1
    (tmp_path / "weights.bin").write_bytes(b"\0" * 16 + table.tobytes())  # at an offset, as in weights.bin
    tensor = TensorProto(name="table", dims=list(table.shape), data_type=TensorProto.FLOAT)
    point_to(tensor, "weights.bin", 16, table.nbytes)
    monkeypatch.setattr(module, "_TABLE_BLOCK_ROWS", 64)
    reader, asked = Reader(tmp_path), []

    def read(start: int, stop: int) -> np.ndarray:
        block = reader.rows(tensor, start, stop)
        asked.append(len(block))
        return block

    values, scale = module._int8_rows(read, 1000, per_channel)
    reader.close()
    assert max(asked) == 64 and sum(asked) == 2 * 1000  # never more than a block; each row read twice
    peak = np.abs(table).max(axis=1) if per_channel else np.abs(table).max()
    whole_scale = np.where(peak > 0, peak / 127, 1).astype(np.float32)
    per_row = whole_scale[:, None] if per_channel else whole_scale
    np.testing.assert_array_equal(scale, whole_scale)
    np.testing.assert_array_equal(values, np.clip(np.rint(table / per_row), -127, 127).astype(np.int8))
    assert values.dtype == np.int8 and np.abs(values).max() == 127
