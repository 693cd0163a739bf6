"""The export traces without weights and binds them one tensor at a time (export/binding.py). What it writes must be
what tracing with the weights (torch folding them in memory, as exports were made before) gives: the same bytes in
weights.bin, the same translations, fp32 and int8."""

from __future__ import annotations

import contextlib
import json
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from onnxmt.architectures import get_architecture
from onnxmt.export import graphs
from onnxmt.export.binding import TensorFile, bind_weights
from onnxmt.export.quantize import quantize
from onnxmt.export.weights import store_weights
from onnxmt.manifest import DECODER_FILE, ENCODER_FILE, WEIGHTS_FILE, describe_files, read_manifest
from onnxmt.runtime.translator import Translator

TEXTS = ["The river is long and the mountain is high", "Where is the doctor?", "Tom is reading a letter."]


def _traced_with_weights(module: object, path: Path) -> None:
    """graphs._export as it was: the weights in the trace, folded by torch."""
    import torch

    real = torch.onnx.export

    def folding(*args: object, **kwargs: object) -> object:
        return real(*args, **{**kwargs, "export_params": True, "do_constant_folding": True})  # type: ignore[arg-type]

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(torch.onnx, "export", folding)
        patch.setattr(graphs, "bind_weights", lambda path, weights, out, progress: _tie_by_value(path))
        patch.setattr(graphs, "shape_inference_without_weight_values", contextlib.nullcontext)
        if path.name == ENCODER_FILE:
            graphs.export_encoder(module, graphs.Target(path, _FACTS, 17, None))  # type: ignore[arg-type]
        else:
            graphs.export_decoder(module, graphs.Target(path, _FACTS, 17, None))  # type: ignore[arg-type]


def _tie_by_value(path: Path) -> None:
    """The tied head as exports were made before: `MatMul(x, W)` where W is another initializer E transposed
    becomes `Gemm(x, E, transB=1)`."""
    model = onnx.load(str(path))
    graph = model.graph
    inits = {i.name: numpy_helper.to_array(i) for i in graph.initializer}
    for index, node in enumerate(list(graph.node)):
        weight = inits.get(node.input[1]) if node.op_type == "MatMul" else None
        if weight is None or weight.ndim != 2:
            continue
        twin = next((n for n, a in inits.items() if a.shape == weight.T.shape and np.array_equal(a, weight.T)), None)
        if twin is None:
            continue
        graph.node.remove(node)
        graph.node.insert(index, helper.make_node("Gemm", [node.input[0], twin], list(node.output), transB=1))
        if not any(node.input[1] in n.input for n in graph.node):
            graph.initializer.remove(next(i for i in graph.initializer if i.name == node.input[1]))
    onnx.save(model, str(path))


_FACTS: dict[str, object] = {}


@pytest.mark.parametrize("family", ["marian", "t5"])
def test_bound_weights_are_the_bytes_torch_folds_and_translate_the_same(
    family: str, tiny_hf_dir: Path, tiny_onnx_dir: Path, tiny_t5_hf_dir: Path, tiny_t5_onnx_dir: Path, tmp_path: Path
) -> None:
    source, exported = (tiny_hf_dir, tiny_onnx_dir) if family == "marian" else (tiny_t5_hf_dir, tiny_t5_onnx_dir)
    config = json.loads((source / "config.json").read_text(encoding="utf-8"))
    arch = get_architecture(config["model_type"]).for_source(source)
    model = arch.load(str(source))
    _FACTS.clear()
    _FACTS.update(arch.facts(config))
    before = tmp_path / "traced-with-weights"
    shutil.copytree(exported, before)
    (before / WEIGHTS_FILE).unlink()
    _traced_with_weights(arch.encoder(model), before / ENCODER_FILE)
    _traced_with_weights(arch.decoder(model, True), before / DECODER_FILE)
    assert store_weights([before / ENCODER_FILE, before / DECODER_FILE], WEIGHTS_FILE)
    manifest = read_manifest(before)
    manifest.files.update(describe_files(before, [ENCODER_FILE, DECODER_FILE, WEIGHTS_FILE]))
    manifest.save(before)

    assert (before / WEIGHTS_FILE).read_bytes() == (exported / WEIGHTS_FILE).read_bytes()
    target = {} if family == "marian" else {"target_lang": "de"}  # T5: the task prefix
    expected = [t.token_ids for t in Translator(before).translate(TEXTS, **target)]
    assert [t.token_ids for t in Translator(exported).translate(TEXTS, **target)] == expected
    assert len({len(ids) for ids in expected}) > 1 or family == "t5"  # the tiny T5 runs to its length limit
    int8_before, int8_now = tmp_path / "int8-before", tmp_path / "int8-now"
    quantize(before, int8_before, progress=lambda _: None)
    quantize(exported, int8_now, progress=lambda _: None)
    assert (int8_before / WEIGHTS_FILE).read_bytes() == (int8_now / WEIGHTS_FILE).read_bytes()
    expected = [t.token_ids for t in Translator(int8_before).translate(TEXTS, **target)]
    assert [t.token_ids for t in Translator(int8_now).translate(TEXTS, **target)] == expected


def test_binding_folds_weight_only_nodes_ties_heads_and_keeps_scalars_scalar(tmp_path: Path) -> None:
    """`v` read through a Transpose only: folded, its transpose written. `w` read through a Transpose by a MatMul
    and through an Identity by a Gather (a tied head and embedding): the MatMul becomes a Gemm on `w` itself, the
    Gather reads `w`, and `w` is written once. A scalar Cast of a Constant stays a scalar."""
    import onnxruntime as ort
    import torch

    w = torch.from_numpy(np.random.default_rng(0).standard_normal((128, 256), dtype=np.float32))
    v = -w * 2
    nodes = [
        helper.make_node("Transpose", ["w"], ["wt"], perm=[1, 0]),
        helper.make_node("MatMul", ["x", "wt"], ["y"]),
        helper.make_node("Identity", ["w"], ["w2"]),
        helper.make_node("Gather", ["w2", "ids"], ["rows"]),
        helper.make_node("Transpose", ["v"], ["vt"], perm=[1, 0]),
        helper.make_node("MatMul", ["x", "vt"], ["z"]),
        helper.make_node("Constant", [], ["zero"], value=numpy_helper.from_array(np.array(0, np.int64))),
        helper.make_node("Cast", ["zero"], ["start"], to=onnx.TensorProto.INT64),
        helper.make_node("Add", ["ids", "start"], ["shifted"]),
    ]
    f32, i64 = onnx.TensorProto.FLOAT, onnx.TensorProto.INT64
    inputs = [("x", f32, [1, 256]), ("ids", i64, [2]), ("w", f32, [128, 256]), ("v", f32, [128, 256])]
    outputs = [("y", f32), ("rows", f32), ("z", f32), ("shifted", i64)]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info(*i) for i in inputs],
        [helper.make_tensor_value_info(n, t, None) for n, t in outputs],
    )
    path = tmp_path / "g.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    out = TensorFile(tmp_path / "t.bin")
    bind_weights(path, {"w": w, "v": v}, out)
    out.close()

    bound = onnx.load(str(path), load_external_data=False)
    assert [i.name for i in bound.graph.input] == ["x", "ids"]
    assert [n.op_type for n in bound.graph.node] == ["Gemm", "Gather", "MatMul", "Add"]
    inits = {i.name: i for i in bound.graph.initializer}
    assert sorted(inits) == ["start", "vt", "w"]  # the Gather reads `w` itself
    assert list(inits["start"].dims) == [] and list(inits["vt"].dims) == [256, 128]
    assert (tmp_path / "t.bin").stat().st_size == 2 * w.numel() * 4  # w and v's transpose, at aligned offsets
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    x = np.linspace(-1, 1, 256, dtype=np.float32)[None]
    y, rows, z, shifted = session.run(None, {"x": x, "ids": np.array([3, 5], np.int64)})
    np.testing.assert_allclose(y, x @ w.numpy().T, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(z, x @ v.numpy().T, rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(rows, w.numpy()[[3, 5]])
    assert shifted.tolist() == [3, 5]


def test_shape_inference_without_weight_values_traces_the_same_graphs(tiny_hf_dir: Path, tmp_path: Path) -> None:
    """What lets the export trace in bounded memory (graphs.py) changes nothing in the traced graphs."""
    config = json.loads((tiny_hf_dir / "config.json").read_text(encoding="utf-8"))
    arch = get_architecture(config["model_type"]).for_source(tiny_hf_dir)
    model = arch.load(str(tiny_hf_dir))
    facts = arch.facts(config)
    traced: dict[str, onnx.ModelProto] = {}
    for kind in ("without values", "with values"):
        with pytest.MonkeyPatch.context() as patch:
            if kind == "with values":
                patch.setattr(graphs, "shape_inference_without_weight_values", contextlib.nullcontext)
            patch.setattr(graphs, "bind_weights", lambda path, weights, out, progress: None)
            patch.setattr(graphs, "fix_static_dims", lambda path, facts: None)
            target = graphs.Target(tmp_path / f"{kind}.onnx", facts, 17, None)  # type: ignore[arg-type]
            graphs.export_decoder(arch.decoder(model, True), target)
        traced[kind] = onnx.load(str(tmp_path / f"{kind}.onnx"))
    a, b = traced["without values"].graph, traced["with values"].graph
    assert len(a.node) > 100 and a.output[0].type.tensor_type.shape.dim  # inferred: the logits' shape
    assert (a.node, a.input, a.output, a.value_info) == (b.node, b.input, b.output, b.value_info)


def test_a_weight_two_graphs_read_under_other_names_is_written_once(tmp_path: Path) -> None:
    """The encoder and decoder modules hold the shared embedding under different names (and detach() gives a new
    tensor object each time): the traced weights file holds it once."""
    import torch

    embedding = torch.nn.Parameter(torch.ones(64, 512))
    out = TensorFile(tmp_path / "t.bin")
    for name in ("encoder.embed_tokens.weight", "embed_tokens.weight"):
        node = helper.make_node("Gather", [name, "ids"], ["rows"])
        graph = helper.make_graph(
            [node],
            "g",
            [
                helper.make_tensor_value_info("ids", onnx.TensorProto.INT64, [2]),
                helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, [64, 512]),
            ],
            [helper.make_tensor_value_info("rows", onnx.TensorProto.FLOAT, None)],
        )
        path = tmp_path / f"{name}.onnx"
        onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
        bind_weights(path, {name: embedding}, out)
    out.close()
    assert (tmp_path / "t.bin").stat().st_size == embedding.numel() * 4
