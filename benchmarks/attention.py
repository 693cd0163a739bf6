"""One decoder self-attention block at one new token: the separate ops onnxmt's export produces vs ORT's fused
`MultiHeadAttention` (com.microsoft), side by side in one process.

    python benchmarks/attention.py

8 heads of 64 (opus-mt), 15 cached positions, 2 threads, spinning off. Prints the median time of each at 1, 8 and
128 rows and the largest difference between their outputs. Used to size the attention-fusion lever
(docs/performance.md).
"""

from __future__ import annotations

import statistics
import time

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

HEADS, HEAD_DIM, PAST = 8, 64, 15
D = HEADS * HEAD_DIM


def session(model) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.intra_op_num_threads = 2
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def value(name: str, shape: list) -> object:
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)


def models() -> tuple[object, object]:
    inputs = [value(n, ["B", 1, D]) for n in "qkv"] + [value(n, ["B", HEADS, "P", HEAD_DIM]) for n in ("pk", "pv")]
    outputs = [value("o", ["B", 1, D])] + [value(n, ["B", HEADS, "T", HEAD_DIM]) for n in ("nk", "nv")]
    consts = [
        numpy_helper.from_array(np.array([0, -1, HEADS, HEAD_DIM], np.int64), "split"),
        numpy_helper.from_array(np.array([0, -1, D], np.int64), "merge"),
        numpy_helper.from_array(np.array(HEAD_DIM**-0.5, np.float32), "scale"),
    ]
    nodes = []
    for t in "qkv":
        nodes.append(helper.make_node("Reshape", [t, "split"], [t + "4"]))
        nodes.append(helper.make_node("Transpose", [t + "4"], [t + "h"], perm=[0, 2, 1, 3]))
    nodes += [
        helper.make_node("Concat", ["pk", "kh"], ["nk"], axis=2),
        helper.make_node("Concat", ["pv", "vh"], ["nv"], axis=2),
        helper.make_node("Mul", ["qh", "scale"], ["qs"]),
        helper.make_node("Transpose", ["nk"], ["kt"], perm=[0, 1, 3, 2]),
        helper.make_node("MatMul", ["qs", "kt"], ["scores"]),
        helper.make_node("Softmax", ["scores"], ["p"], axis=-1),
        helper.make_node("MatMul", ["p", "nv"], ["oh"]),
        helper.make_node("Transpose", ["oh"], ["ot"], perm=[0, 2, 1, 3]),
        helper.make_node("Reshape", ["ot", "merge"], ["o"]),
    ]
    separate = helper.make_model(
        helper.make_graph(nodes, "ops", inputs, outputs, consts), opset_imports=[helper.make_opsetid("", 17)]
    )
    mha = helper.make_node(
        "MultiHeadAttention",
        ["q", "k", "v", "", "", "", "pk", "pv"],
        ["o", "nk", "nv"],
        domain="com.microsoft",
        num_heads=HEADS,
    )
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    fused = helper.make_model(helper.make_graph([mha], "mha", inputs, outputs), opset_imports=opsets)
    return separate, fused


def main() -> None:
    separate, fused = (session(m) for m in models())
    rng = np.random.default_rng(0)
    print("| rows | separate ops | MultiHeadAttention | max abs difference |")
    print("| --- | --- | --- | --- |")
    for rows in (1, 8, 128):
        feed = {n: rng.standard_normal((rows, 1, D), np.float32) for n in "qkv"}
        feed |= {n: rng.standard_normal((rows, HEADS, PAST, HEAD_DIM), np.float32) for n in ("pk", "pv")}
        diff = max(
            float(np.abs(x - y).max()) for x, y in zip(separate.run(None, feed), fused.run(None, feed), strict=True)
        )
        times: tuple[list[float], list[float]] = ([], [])
        for _ in range(200 if rows < 128 else 50):
            for sess, out in zip((separate, fused), times, strict=True):
                start = time.perf_counter()
                sess.run(None, feed)
                out.append(time.perf_counter() - start)
        a, b = (1e6 * statistics.median(t) for t in times)
        print(f"| {rows} | {a:.0f} µs | {b:.0f} µs | {diff:.1e} |")


if __name__ == "__main__":
    main()
