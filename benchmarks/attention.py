"""One decoder self-attention block at one new token: the separate ops onnxmt's export produces vs ORT's fused
attention ops (com.microsoft), side by side in one process.

    python benchmarks/attention.py [--out results/attention.md]

8 heads of 64 (opus-mt), 15 cached positions, 2 threads, spinning off. Prints the median time of each at 1, 8 and
128 rows and the largest difference between its outputs and the separate ops'. Used to size the attention-fusion
lever (docs/performance.md):

- `MultiHeadAttention` takes the cache and returns it grown, as the separate ops do (a copy per step);
- `GroupQueryAttention` and `DecoderMaskedMultiHeadAttention` can write the new position into the cache in place:
  the past and present K/V are one preallocated buffer (64 positions here), bound as input and output through I/O
  binding, so no step copies the cache.
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from probes import emit, interleaved

HEADS, HEAD_DIM, PAST, CAPACITY = 8, 64, 15, 64
D = HEADS * HEAD_DIM
MS = "com.microsoft"


def session(model) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.intra_op_num_threads = 2
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def value(name: str, shape: list) -> object:
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)


def _model(nodes: list, extra_inputs: list, cache_len: str, consts: list | None = None) -> object:
    inputs = [value(n, ["B", 1, D]) for n in "qkv"] + [
        value(n, ["B", HEADS, cache_len, HEAD_DIM]) for n in ("pk", "pv")
    ]
    out_len = "T" if cache_len == "P" else cache_len
    outputs = [value("o", ["B", 1, D])] + [value(n, ["B", HEADS, out_len, HEAD_DIM]) for n in ("nk", "nv")]
    graph = helper.make_graph(nodes, "attention", inputs + extra_inputs, outputs, consts or [])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(MS, 1)])


def separate_model() -> object:
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
    return _model(nodes, [], "P", consts)


def mha_model() -> object:
    node = helper.make_node(
        "MultiHeadAttention", ["q", "k", "v", "", "", "", "pk", "pv"], ["o", "nk", "nv"], domain=MS, num_heads=HEADS
    )
    return _model([node], [], "P")


def gqa_model() -> object:
    extra = [
        helper.make_tensor_value_info("seqlens_k", TensorProto.INT32, ["B"]),
        helper.make_tensor_value_info("total_len", TensorProto.INT32, []),
    ]
    node = helper.make_node(
        "GroupQueryAttention",
        ["q", "k", "v", "pk", "pv", "seqlens_k", "total_len"],
        ["o", "nk", "nv"],
        domain=MS,
        num_heads=HEADS,
        kv_num_heads=HEADS,
    )
    return _model([node], extra, "M")


def dmmha_model() -> object:
    extra = [helper.make_tensor_value_info("past_len", TensorProto.INT32, [1])]
    node = helper.make_node(
        "DecoderMaskedMultiHeadAttention",
        ["q", "k", "v", "", "", "pk", "pv", "past_len"],
        ["o", "nk", "nv"],
        domain=MS,
        num_heads=HEADS,
        past_present_share_buffer=1,
    )
    return _model([node], extra, "M")


def in_place(sess: ort.InferenceSession, feed: dict, extra: dict) -> Callable[[], np.ndarray]:
    """A call of `sess` with the cache in one (rows, heads, CAPACITY, head_dim) buffer per K and V, bound as both
    the past input and the present output; returns the attention output."""
    rows = len(feed["q"])
    buffers = {}
    for name in ("pk", "pv"):
        buffers[name] = np.zeros((rows, HEADS, CAPACITY, HEAD_DIM), np.float32)
        buffers[name][:, :, :PAST] = feed[name]

    def call() -> np.ndarray:
        io = sess.io_binding()
        for name in "qkv":
            io.bind_cpu_input(name, feed[name])
        for name, array in extra.items():
            io.bind_cpu_input(name, array)
        io.bind_output("o")
        for name, out in (("pk", "nk"), ("pv", "nv")):
            buf = buffers[name]
            io.bind_cpu_input(name, buf)
            io.bind_output(out, "cpu", 0, np.float32, list(buf.shape), buf.ctypes.data)
        sess.run_with_iobinding(io)
        return io.copy_outputs_to_cpu()[0]

    return call


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, help="also write the table here")
    args = p.parse_args()
    separate, mha, gqa, dmmha = (session(m) for m in (separate_model(), mha_model(), gqa_model(), dmmha_model()))
    rng = np.random.default_rng(0)
    lines = [
        f"One self-attention block, {HEADS} heads of {HEAD_DIM}, {PAST} cached positions, 2 threads: median time "
        "(and the largest difference from the separate ops' output).",
        "",
        "| rows | separate ops | MultiHeadAttention | GroupQueryAttention, cache in place | "
        "DecoderMaskedMultiHeadAttention, cache in place |",
        "| --- | --- | --- | --- | --- |",
    ]
    for rows in (1, 8, 128):
        feed = {n: rng.standard_normal((rows, 1, D), np.float32) for n in "qkv"}
        feed |= {n: rng.standard_normal((rows, HEADS, PAST, HEAD_DIM), np.float32) for n in ("pk", "pv")}
        reference = separate.run(None, feed)[0]
        calls = {
            "separate": lambda feed=feed: separate.run(None, feed)[0],
            "mha": lambda feed=feed: mha.run(None, feed)[0],
            "gqa": in_place(
                gqa,
                feed,
                {"seqlens_k": np.full(rows, PAST, np.int32), "total_len": np.array(PAST + 1, np.int32)},
            ),
            "dmmha": in_place(dmmha, feed, {"past_len": np.array([PAST], np.int32)}),
        }
        # Each in-place call writes position PAST again, so every timed call does the same work.
        diffs = {name: float(np.abs(call() - reference).max()) for name, call in calls.items()}
        times = interleaved(calls, 200 if rows < 128 else 50)
        cells = [
            f"{1e6 * statistics.median(times[n]):.0f} µs" + (f" ({diffs[n]:.0e})" if n != "separate" else "")
            for n in calls
        ]
        lines.append(f"| {rows} | " + " | ".join(cells) + " |")
    emit(lines, args.out)


if __name__ == "__main__":
    main()
