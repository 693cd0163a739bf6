"""Small ONNX graphs the decoding loop runs between decoder steps, built here and shipped as package data.

Beam search needs, at every step, the log-softmax of every row of logits and each row's best few candidates:
over a 65k vocabulary and 128 rows that is 8 million floats, which single-threaded numpy walks several times.
ONNX Runtime's LogSoftmax and TopK kernels do the same work on every core. The run side must not import `onnx`,
so the graphs are built here once and committed under `runtime/ops/`; a test checks the files match.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

OPS_DIR = Path(__file__).resolve().parents[1] / "runtime" / "ops"


def build_ops() -> dict[str, bytes]:
    """`log_softmax.onnx`: logits -> log_probs; `topk.onnx`: scores, k -> values, indices (largest first);
    `topk_chunked.onnx`: the same by way of chunk maxima (`chunked_topk`)."""
    from onnx import TensorProto, helper

    def model(nodes: list, inputs: list, outputs: list, name: str) -> bytes:
        graph = helper.make_graph(nodes, name, inputs, outputs)
        proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="onnxmt")
        proto.ir_version = 8
        return proto.SerializeToString(deterministic=True)

    matrix = ["rows", "vocab"]
    log_softmax = model(
        [helper.make_node("LogSoftmax", ["logits"], ["log_probs"], axis=-1)],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, matrix)],
        [helper.make_tensor_value_info("log_probs", TensorProto.FLOAT, matrix)],
        "onnxmt_log_softmax",
    )
    topk = model(
        [helper.make_node("TopK", ["scores", "k"], ["values", "indices"], axis=-1, largest=1, sorted=1)],
        [
            helper.make_tensor_value_info("scores", TensorProto.FLOAT, matrix),
            helper.make_tensor_value_info("k", TensorProto.INT64, [1]),
        ],
        [
            helper.make_tensor_value_info("values", TensorProto.FLOAT, ["rows", "k"]),
            helper.make_tensor_value_info("indices", TensorProto.INT64, ["rows", "k"]),
        ],
        "onnxmt_topk",
    )
    return {"log_softmax.onnx": log_softmax, "topk.onnx": topk, "topk_chunked.onnx": chunked_topk()}


def chunked_topk() -> bytes:
    """Top k of each row of a (rows, vocab) matrix, the same as `topk.onnx`, by way of chunk maxima.

    The row is cut into chunks of `chunk` entries; one vectorised ReduceMax pass finds each chunk's maximum, TopK
    picks the k chunks with the largest maxima, and a TopK over those k chunks' entries (k * chunk, in vocabulary
    order) gives the answer. Exact, ties included, because TopK puts the lower index first among equals: an entry e
    in a chunk that was not picked has k picked chunks before it whose maxima are >= e, and each of those maxima
    is larger than e or equal to it at a lower index, so e is not among the k largest. (The plain TopK over
    65k-entry rows does its comparisons one at a time: about twice as slow at 128 rows.)

    Rows with NaN are the exception: ReduceMax skips a NaN that is not first in its chunk, where the plain TopK ranks
    NaN largest (log-probabilities are NaN only if a logit was infinite).

    Inputs: scores (rows, vocab), k (int64[1]), chunk (int64[1]; vocab must be a multiple of it, with at least k
    chunks: `runtime.vocab.chunk_length` picks one with 4k or more).
    Outputs: values (rows, k), indices (rows, k), largest first.
    """
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    def const(name: str, value: list[int]) -> TensorProto:
        return numpy_helper.from_array(np.array(value, dtype=np.int64), name)

    graph = helper.make_graph(
        _chunked_topk_nodes(),
        "onnxmt_topk_chunked",
        [
            helper.make_tensor_value_info("scores", TensorProto.FLOAT, ["rows", "vocab"]),
            helper.make_tensor_value_info("k", TensorProto.INT64, [1]),
            helper.make_tensor_value_info("chunk", TensorProto.INT64, [1]),
        ],
        [
            helper.make_tensor_value_info("values", TensorProto.FLOAT, ["rows", "k"]),
            helper.make_tensor_value_info("indices", TensorProto.INT64, ["rows", "k"]),
        ],
        [const("zero", [0]), const("minus_one", [-1]), const("last", [-1])],
    )
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], producer_name="onnxmt")
    proto.ir_version = 8
    return proto.SerializeToString(deterministic=True)


def _chunked_topk_nodes() -> list[Any]:
    """The nodes of `chunked_topk`: chunk maxima, the top k chunks in vocabulary order, the top k of their entries,
    and those entries' positions in the row."""
    from onnx import helper

    n = helper.make_node
    return [
        n("Concat", ["zero", "minus_one", "chunk"], ["chunked_shape"], axis=0),
        n("Reshape", ["scores", "chunked_shape"], ["chunked"]),  # (rows, m, chunk): a view, no copy
        n("ReduceMax", ["chunked", "last"], ["maxima"], keepdims=0),  # (rows, m)
        n("TopK", ["maxima", "k"], ["_maxima", "top_chunks"], axis=-1, largest=1, sorted=1),  # (rows, k)
        # In vocabulary order: ascending chunk ids.
        n("TopK", ["top_chunks", "k"], ["chunk_ids", "_order"], axis=-1, largest=0, sorted=1),
        n("Unsqueeze", ["chunk_ids", "last"], ["chunk_ids3"]),  # (rows, k, 1)
        n("Shape", ["chunk_ids"], ["ids_shape"]),
        n("Concat", ["ids_shape", "chunk"], ["gather_shape"], axis=0),
        n("Expand", ["chunk_ids3", "gather_shape"], ["gather_index"]),  # (rows, k, chunk)
        n("GatherElements", ["chunked", "gather_index"], ["candidates3"], axis=1),
        n("Concat", ["zero", "minus_one"], ["flat_shape"], axis=0),
        n("Reshape", ["candidates3", "flat_shape"], ["candidates"]),  # (rows, k * chunk)
        n("TopK", ["candidates", "k"], ["values", "positions"], axis=-1, largest=1, sorted=1),
        n("Div", ["positions", "chunk"], ["slot"]),
        n("Mod", ["positions", "chunk"], ["offset"]),
        n("GatherElements", ["chunk_ids", "slot"], ["chosen_chunks"], axis=1),
        n("Mul", ["chosen_chunks", "chunk"], ["starts"]),
        n("Add", ["starts", "offset"], ["indices"]),
    ]


def write_ops(directory: Path = OPS_DIR) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, data in build_ops().items():
        (directory / name).write_bytes(data)
        paths.append(directory / name)
    return paths


if __name__ == "__main__":
    for path in write_ops():
        print(path)
