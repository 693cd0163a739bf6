"""How weights are stored (export/weights.py): one memory-mappable file, the tied LM head cut into chunks that point
into the embedding's bytes, and computing exactly what the whole head computed."""

from __future__ import annotations

import shutil
import subprocess
import sys
from itertools import pairwise
from pathlib import Path

import numpy as np
import pytest

from tests.helpers.skips import importorskip

onnx = importorskip("onnx")
ort = importorskip("onnxruntime")

from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from onnxmt.export import weights  # noqa: E402
from onnxmt.export.weights import WEIGHTS_ALIGN, chunk_heads, join_heads, store_weights  # noqa: E402

VOCAB, DIM = 2500, 64  # 640 kB of float rows, 256 bytes each: aligned chunks are multiples of 256 rows


def _tied_model(int8: bool) -> onnx.ModelProto:
    """x -> Gemm(x, E, transB=1) + bias (QGemm on int8 rows with a scale per row when `int8`), and a lookup of E."""
    rng = np.random.default_rng(0)
    table = rng.standard_normal((VOCAB, DIM)).astype(np.float32)
    bias = rng.standard_normal(VOCAB).astype(np.float32)
    nodes = [helper.make_node("Constant", [], ["bias"], value=numpy_helper.from_array(bias))]
    if int8:
        scale = (np.abs(table).max(axis=1) / 127).astype(np.float32)
        rows = np.round(table / scale[:, None]).astype(np.int8)
        inits = [
            numpy_helper.from_array(rows, "E"),
            numpy_helper.from_array(scale, "E_scale"),
            numpy_helper.from_array(np.zeros(VOCAB, np.int8), "E_zero"),
        ]
        nodes += [
            helper.make_node("DynamicQuantizeLinear", ["x"], ["xq", "xs", "xz"]),
            helper.make_node(
                "QGemm", ["xq", "xs", "xz", "E", "E_scale", "E_zero"], ["y"], "head", domain="com.microsoft", transB=1
            ),
        ]
        lookup_type = TensorProto.INT8
    else:
        inits = [numpy_helper.from_array(table, "E")]
        nodes.append(helper.make_node("Gemm", ["x", "E"], ["y"], "head", transB=1))
        lookup_type = TensorProto.FLOAT
    nodes += [helper.make_node("Add", ["y", "bias"], ["logits"]), helper.make_node("Gather", ["E", "ids"], ["rows"])]
    graph = helper.make_graph(
        nodes,
        "tied",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", DIM]),
            helper.make_tensor_value_info("ids", 7, ["k"]),
        ],
        [
            helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["n", VOCAB]),
            helper.make_tensor_value_info("rows", lookup_type, ["k", DIM]),
        ],
        inits,
    )
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    return helper.make_model(graph, opset_imports=opsets)


def _run(path: Path) -> list[np.ndarray]:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    x = np.random.default_rng(1).standard_normal((5, DIM)).astype(np.float32)
    return session.run(None, {"x": x, "ids": np.array([0, 7, VOCAB - 1], np.int64)})


def _where(graph) -> dict[str, tuple[int, int]]:
    out = {}
    for init in graph.initializer:
        if init.data_location == TensorProto.EXTERNAL:
            info = {e.key: e.value for e in init.external_data}
            out[init.name] = (int(info["offset"]), int(info["length"]))
    return out


def _stored(tmp_path: Path, model: onnx.ModelProto) -> tuple[Path, Path]:
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    whole.mkdir()
    onnx.save(model, str(whole / "g.onnx"))
    shutil.copytree(whole, cut)
    assert store_weights([cut / "g.onnx"], "weights.bin")
    return whole / "g.onnx", cut / "g.onnx"


def test_float_head_in_chunks_points_into_the_table_and_computes_the_same(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(weights, "HEAD_CHUNK_BYTES", VOCAB * DIM * 4 // 3 + 1)  # three chunks
    whole, cut = _stored(tmp_path, _tied_model(int8=False))
    graph = onnx.load(str(cut), load_external_data=False).graph
    heads = [n for n in graph.node if n.op_type == "Gemm"]
    assert len(heads) == 3 and [n.op_type for n in graph.node].count("Concat") == 1
    # The bias Add is folded into the chunks (Gemm's C): the logits get no extra pass.
    assert "Add" not in [n.op_type for n in graph.node] and all(len(n.input) == 3 for n in heads)
    where = _where(graph)
    start, length = where["E"]
    chunks = [where[n.input[1]] for n in heads]
    assert chunks[0][0] == start and sum(c[1] for c in chunks) == length
    assert all(a[0] + a[1] == b[0] for a, b in pairwise(chunks))
    assert all(offset % WEIGHTS_ALIGN == 0 for offset, _ in chunks)  # each chunk can be memory-mapped
    # The table is stored once: the file holds it and the bias, nothing more.
    assert (cut.parent / "weights.bin").stat().st_size < length + WEIGHTS_ALIGN + 4 * VOCAB
    for got, want in zip(_run(cut), _run(whole), strict=True):
        np.testing.assert_array_equal(got, want)

    # Joined again (what the quantizer works on): one head reading the table itself, same results.
    model = onnx.load(str(cut))
    assert join_heads(model) == 1
    assert [(n.name, n.input[1]) for n in model.graph.node if n.op_type == "Gemm"] == [("head", "E")]
    onnx.save(model, str(tmp_path / "joined.onnx"))
    for got, want in zip(_run(tmp_path / "joined.onnx"), _run(whole), strict=True):
        np.testing.assert_array_equal(got, want)


def test_int8_head_reads_a_transpose_of_the_same_bytes_and_computes_the_same(tmp_path: Path) -> None:
    whole, cut = _stored(tmp_path, _tied_model(int8=True))
    graph = onnx.load(str(cut), load_external_data=False).graph
    (head,) = [n for n in graph.node if n.op_type == "QGemm"]
    flip = next(n for n in graph.node if n.output[0] == head.input[3])
    assert flip.op_type == "Transpose" and not any(a.name == "transB" and a.i for a in head.attribute)
    where = _where(graph)
    assert flip.input[0] != "E" and where[flip.input[0]] == where["E"]  # a second initializer, the same bytes
    assert (cut.parent / "weights.bin").stat().st_size < VOCAB * DIM + WEIGHTS_ALIGN + 8 * VOCAB
    for got, want in zip(_run(cut), _run(whole), strict=True):
        np.testing.assert_array_equal(got, want)


def test_heads_that_cannot_be_cut_by_rows_stay_whole() -> None:
    model = _tied_model(int8=False)
    # A bias of shape (1, vocab) on the Gemm itself is not one value per row of E: left alone.
    gemm = next(n for n in model.graph.node if n.op_type == "Gemm")
    model.graph.initializer.append(numpy_helper.from_array(np.zeros((1, VOCAB), np.float32), "c"))
    gemm.input.append("c")
    assert chunk_heads(model, chunk_bytes=1 << 16) == {}
    # Below the chunk size, or not transposed: left alone.
    small, plain = _tied_model(int8=False), _tied_model(int8=False)
    assert chunk_heads(small, chunk_bytes=VOCAB * DIM * 4) == {}
    next(n for n in plain.graph.node if n.op_type == "Gemm").ClearField("attribute")
    assert chunk_heads(plain, chunk_bytes=1 << 16) == {}
    assert [n.op_type for n in plain.graph.node].count("Gemm") == 1


def test_large_tensors_are_aligned_and_small_unshared_ones_stay_inline(tmp_path: Path) -> None:
    big = np.arange(3 * WEIGHTS_ALIGN // 4, dtype=np.float32).reshape(-1, 16)  # 192 kB
    small = np.ones((4, 4), np.float32)
    for name in ("a", "b"):
        inits = [numpy_helper.from_array(big + (name == "b"), "big"), numpy_helper.from_array(small, "small")]
        nodes = [helper.make_node("MatMul", ["x", "big"], ["y"]), helper.make_node("Add", ["x4", "small"], ["z"])]
        graph = helper.make_graph(
            nodes,
            name,
            [helper.make_tensor_value_info("x", 1, ["n", 16]), helper.make_tensor_value_info("x4", 1, [4, 4])],
            [helper.make_tensor_value_info("y", 1, None), helper.make_tensor_value_info("z", 1, None)],
            inits,
        )
        onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(tmp_path / f"{name}.onnx"))
    told: list[str] = []
    assert store_weights([tmp_path / "a.onnx", tmp_path / "b.onnx"], "weights.bin", progress=told.append)
    # The status line: bytes read to hash and to write, out of twice the graphs' weight bytes, and the time left.
    total = 2 * 2 * (big.nbytes + small.nbytes)
    assert told and told[-1].startswith(f"writing weights.bin: 100% of {total / 1e6:.0f} MB, ~0 s left"), told
    places = [_where(onnx.load(str(tmp_path / f"{n}.onnx"), load_external_data=False).graph) for n in "ab"]
    assert places[0] == {"big": (0, big.nbytes)} and places[1] == {"big": (WEIGHTS_ALIGN * 3, big.nbytes)}
    back = onnx.load(str(tmp_path / "b.onnx")).graph
    np.testing.assert_array_equal(numpy_helper.to_array(back.initializer[0]), big + 1)


PEAK_PROBE = """
import sys
def hwm():
    return next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM")) * 1024
import onnxruntime as ort
so = ort.SessionOptions()
so.intra_op_num_threads = 1
before = hwm()
ort.InferenceSession(sys.argv[1], so, providers=["CPUExecutionProvider"])
print(hwm() - before)
"""


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads VmHWM from /proc (Linux)")
def test_chunks_lower_the_load_time_peak(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Why the head is cut (module docstring): a whole head is packed while all of its table is mapped in; each chunk
    # has a mapping of its own, which ONNX Runtime drops once the chunk is packed, and the lookup's mapping of the
    # table is not read while loading. A 32 MB table, fresh processes: the peak of loading drops by about 3/4 of it.
    rows, dim = 16384, 512
    table = np.random.default_rng(0).standard_normal((rows, dim)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("Gemm", ["x", "E"], ["y"], transB=1), helper.make_node("Gather", ["E", "ids"], ["r"])],
        "big",
        [helper.make_tensor_value_info("x", 1, ["n", dim]), helper.make_tensor_value_info("ids", 7, ["k"])],
        [helper.make_tensor_value_info("y", 1, None), helper.make_tensor_value_info("r", 1, None)],
        [numpy_helper.from_array(table, "E")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    peaks = {}
    for name, chunk in (("whole", 1 << 40), ("chunks", table.nbytes // 4)):
        (tmp_path / name).mkdir()
        onnx.save(model, str(tmp_path / name / "g.onnx"))
        monkeypatch.setattr(weights, "HEAD_CHUNK_BYTES", chunk)
        store_weights([tmp_path / name / "g.onnx"], "weights.bin")
        run = subprocess.run([sys.executable, "-c", PEAK_PROBE, str(tmp_path / name / "g.onnx")], capture_output=True)
        assert run.returncode == 0, run.stderr.decode()
        peaks[name] = int(run.stdout)
    assert [n.op_type for n in onnx.load(str(tmp_path / "chunks" / "g.onnx")).graph.node].count("Gemm") == 4
    assert peaks["chunks"] < peaks["whole"] - table.nbytes // 2, peaks


def test_a_gemm_that_scales_its_bias_keeps_the_add(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Gemm computes alpha * A @ B' + beta * C: with beta != 1 the bias cannot become C unchanged.
    model = _tied_model(int8=False)
    next(n for n in model.graph.node if n.op_type == "Gemm").attribute.append(helper.make_attribute("beta", 0.5))
    monkeypatch.setattr(weights, "HEAD_CHUNK_BYTES", VOCAB * DIM * 4 // 3 + 1)
    whole, cut = _stored(tmp_path, model)
    ops = [n.op_type for n in onnx.load(str(cut), load_external_data=False).graph.node]
    assert ops.count("Gemm") == 3 and ops.count("Add") == 1
    for got, want in zip(_run(cut), _run(whole), strict=True):
        np.testing.assert_array_equal(got, want)


def test_storing_a_stored_directory_again_changes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(weights, "HEAD_CHUNK_BYTES", VOCAB * DIM * 4 // 3 + 1)
    whole, cut = _stored(tmp_path, _tied_model(int8=False))
    first = (cut.parent / "weights.bin").read_bytes()
    assert store_weights([cut], "weights.bin")
    assert (cut.parent / "weights.bin").read_bytes() == first  # not the chunks stored next to the table
    for got, want in zip(_run(cut), _run(whole), strict=True):
        np.testing.assert_array_equal(got, want)


def test_a_table_only_another_graphs_head_reads_is_still_stored_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Graph b reads E only through its (chunked) head; graph a looks it up. One copy in the file.
    monkeypatch.setattr(weights, "HEAD_CHUNK_BYTES", VOCAB * DIM * 4 // 3 + 1)
    table = numpy_helper.to_array(next(i for i in _tied_model(int8=False).graph.initializer if i.name == "E"))
    for name, node in (
        ("a", helper.make_node("Gather", ["E", "ids"], ["y"])),
        ("b", helper.make_node("Gemm", ["x", "E"], ["y"], transB=1)),
    ):
        graph = helper.make_graph(
            [node],
            name,
            [helper.make_tensor_value_info("x", 1, ["n", DIM]), helper.make_tensor_value_info("ids", 7, ["k"])],
            [helper.make_tensor_value_info("y", 1, None)],
            [numpy_helper.from_array(table, "E")],
        )
        onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(tmp_path / f"{name}.onnx"))
    assert store_weights([tmp_path / "a.onnx", tmp_path / "b.onnx"], "weights.bin")
    assert (tmp_path / "weights.bin").stat().st_size == table.nbytes


def test_biases_that_are_not_one_value_per_logit_keep_their_add() -> None:
    # (1, 1, vocab): folding it into Gemm's C would drop a dimension of the output. Typed float_data is fine.
    for bias, folded in ((np.zeros((1, 1, VOCAB), np.float32), False), (np.ones((1, VOCAB), np.float32), True)):
        model = _tied_model(int8=False)
        constant = next(n for n in model.graph.node if n.op_type == "Constant")
        tensor = helper.make_tensor("bias", TensorProto.FLOAT, bias.shape, bias.ravel().tolist())  # float_data
        constant.attribute[0].t.CopyFrom(tensor)
        assert chunk_heads(model, chunk_bytes=1 << 16)
        assert ("Add" in [n.op_type for n in model.graph.node]) is not folded


def test_int8_head_takes_a_following_bias_add_and_computes_what_qgemm_did(tmp_path: Path) -> None:
    # A head the exporter did not cut keeps its bias as an `Add` after the Gemm (here from a `Constant` node, as
    # torch leaves it): the quantizer moves it into DynamicQuantizeMatMul's bias, and the logits are those of the
    # previous layout, DynamicQuantizeLinear + QGemm on the same int8 rows + Add (bit for bit).
    from onnxmt.export.binding import TensorFile, Tensors
    from onnxmt.export.quantize import QuantizeOptions, _int8_tables

    model = _tied_model(int8=False)
    tensors = Tensors(weights.Reader(tmp_path), TensorFile(tmp_path / "quantized.bin"))
    rewritten = _int8_tables(model, QuantizeOptions(), set(), tensors)
    tensors.out.close()
    assert rewritten[0] == "head" and len(rewritten) == 2  # the head, then the (unnamed) lookup
    nodes = list(model.graph.node)
    (head,) = [n for n in nodes if n.op_type == "DynamicQuantizeMatMul"]
    assert head.output[0] == "logits" and len(head.input) == 5 and head.input[3] == ""
    assert not any(n.op_type == "Add" for n in nodes)
    onnx.save(model, str(tmp_path / "new.onnx"))
    onnx.save(_tied_model(int8=True), str(tmp_path / "old.onnx"))
    new, old = _run(tmp_path / "new.onnx"), _run(tmp_path / "old.onnx")
    np.testing.assert_array_equal(new[0], old[0])


def test_export_and_quantize_never_hold_a_graphs_weights_in_its_protobuf(
    tiny_hf_dir: Path, tiny_onnx_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every graph file the exporter and the quantizer save keeps its large tensors outside (in the traced or
    quantized weights, then weights.bin): no step serialises a model's weights into a protobuf, whose 2 GB limit
    NLLB-200-1.3B's graphs pass and which would hold them all in memory. The directories come out as the usual
    ones: only the manifest's files, and translations identical to the fixture's."""
    from onnxmt.export.exporter import ExportOptions, export
    from onnxmt.export.quantize import quantize
    from onnxmt.runtime.translator import Translator

    inline: dict[str, int] = {}
    save = onnx.save

    def spied(model, path, *args, **kwargs):  # type: ignore[no-untyped-def]
        name = Path(path).name
        if name in ("encoder.onnx", "decoder.onnx"):
            largest = max((len(i.raw_data) for i in model.graph.initializer), default=0)
            inline[name] = max(inline.get(name, 0), largest)
        return save(model, path, *args, **kwargs)

    monkeypatch.setattr(onnx, "save", spied)
    exported = tmp_path / "fp32"
    export(str(tiny_hf_dir), exported, ExportOptions(), progress=lambda _: None)
    int8 = tmp_path / "int8"
    quantize(exported, int8, progress=lambda _: None)
    assert set(inline) == {"encoder.onnx", "decoder.onnx"}
    assert max(inline.values()) < weights.MAP_MIN_BYTES
    for directory in (exported, int8):
        assert sorted(p.name for p in directory.iterdir()) == sorted(p.name for p in tiny_onnx_dir.iterdir())
    texts = ["The river is long and the mountain is high", "Where is the doctor?", "Tom is reading a letter."]
    expected = [t.token_ids for t in Translator(tiny_onnx_dir).translate(texts)]
    assert [t.token_ids for t in Translator(exported).translate(texts)] == expected
    assert len({len(ids) for ids in expected}) > 1
