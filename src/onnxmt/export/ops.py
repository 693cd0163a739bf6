"""Small ONNX graphs the decoding loop runs between decoder steps, built here and shipped as package data.

Beam search needs, at every step, the log-softmax of every row of logits and each row's best few candidates:
over a 65k vocabulary and 128 rows that is 8 million floats, which single-threaded numpy walks several times.
ONNX Runtime's LogSoftmax and TopK kernels do the same work on every core. The run side must not import `onnx`,
so the graphs are built here once and committed under `runtime/ops/`; a test checks the files match.
"""

from __future__ import annotations

from pathlib import Path

OPS_DIR = Path(__file__).resolve().parents[1] / "runtime" / "ops"


def build_ops() -> dict[str, bytes]:
    """`log_softmax.onnx`: logits -> log_probs; `topk.onnx`: scores, k -> values, indices (largest first)."""
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
    return {"log_softmax.onnx": log_softmax, "topk.onnx": topk}


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
