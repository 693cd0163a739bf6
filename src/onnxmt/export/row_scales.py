"""Per-row activation scales for dynamic int8, so that a sentence's output no longer depends on its batch-mates.

ONNX Runtime's dynamic int8 quantizes the input of every integer MatMul with `DynamicQuantizeLinear` (also inside
`DynamicQuantizeMatMul`, and inside the `MatMulIntegerToFloat` its fusions make): one uint8 scale and zero point
over the whole tensor, every row of the batch and the padding included. A sentence's activations are then rounded
on a grid its batch-mates chose, and at a near-tie its tokens change with them (docs/serve.md has the rates). Here
each row of such an input (one token's vector: the last axis) gets a range of its own, [m - h, m + h]:

    s = max(h / 127, tiny)                                                    # (..., 1)
    q = uint8(round((x - m) / s) + 128)                                       # |x - m| / s <= 127: no clip
    y = MatMulIntegerToFloat(q, W8, 1, w_scale, 128, w_zero) * s + m * c      # c = w_scale * column sums of W8

which is exact arithmetic on the same int8 weights: x = s (q - 128) + m up to rounding, and (q - 128) · W8 is an
integer product. The centre m costs the `m * c` pass over the output, so it is used only where it buys precision:

- inputs made by a LayerNormalization (through reshapes and row gathers) are nearly symmetric about zero: m = 0
  and h = max |x| (the query/key/value, fc1 and LM-head inputs: the MatMuls with the widest outputs);
- the others (the FFN activation's output, one-sided: swish >= -0.28; attention outputs; the first layer's
  embeddings) get m = (max + min) / 2, h = (max - min) / 2: a symmetric range there would waste up to one bit.

Measured on opus-mt-en-zh's architecture (random weights, benchmarks/int8_batch.py): symmetric everywhere moved the
first-step logits from fp32's by 0.26 (median of the max difference) against the per-tensor graph's 0.22, and
centred everywhere by 0.22 at up to 36% more CPU per token; this mix is in docs/performance.md.

Why not the obvious forms (onnxruntime 1.32, CPU):

- MatMulInteger's `a_zero_point` may be one per row in the ONNX spec, but ONNX Runtime's kernel accepts only a
  scalar ("input1 zero point must be a scalar or 1D tensor of size 1"): one zero point, 128, for every row.
- MatMulIntegerToFloat accepts an `a_scale` of shape (rows, 1) and computes something else with it: the row scale
  multiplies the output instead.
- int8 activations without the offset would run the s8s8 kernels, measured 5-10x slower than u8s8 on AVX2.

What stays batch-dependent is what fp32 has too: padding changes the summation order of some float kernels, which
moves some logits by ~1e-6.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

PREFIX = "row_scales"  # names of the nodes and tensors written here start with it
# Ops that move or select rows without computing: a LayerNormalization's output through them is still symmetric.
_PASS_THROUGH = {"Reshape", "Squeeze", "Unsqueeze", "Flatten", "Identity", "Transpose", "Gather"}
_NORMS = {
    "LayerNormalization",
    "SkipLayerNormalization",
    "SimplifiedLayerNormalization",
    "SkipSimplifiedLayerNormalization",
}


@dataclass
class _Rows:
    """An input quantized per row: its uint8 tensor, its row scales and, when centred, its row centres."""

    q: str
    scale: str
    centre: str | None


@dataclass
class _Graph:
    """What the rewrite reads and adds."""

    opset: int
    inits: dict[str, Any]
    producers: dict[str, Any]
    read: Callable[[Any], Any]  # an initializer's value
    made: list[Any] = field(default_factory=list)  # new initializers
    names: dict[str, str] = field(default_factory=dict)  # shared constant -> its initializer

    def constant(self, key: str) -> str:
        """A scalar the rewritten nodes share, added once."""
        import numpy as np

        values = {
            "one": np.array(1.0, np.float32),
            "two": np.array(2.0, np.float32),
            "levels": np.array(127.0, np.float32),  # -127..127 around the centre
            "tiny": np.array(np.finfo(np.float32).tiny, np.float32),  # a constant row: scale > 0, q = 128
            "offset": np.array(128.0, np.float32),
            "zero_point": np.array(128, np.uint8),
            "last_axis": np.array([-1], np.int64),
        }
        if key not in self.names:
            self.names[key] = self.add(values[key], f"{PREFIX}.{key}")
        return self.names[key]

    def add(self, value: Any, name: str) -> str:
        from onnx import numpy_helper

        taken = set(self.inits) | {i.name for i in self.made}
        while name in taken:
            name += "_"
        self.made.append(numpy_helper.from_array(value, name))
        return name

    def array(self, name: str) -> Any:
        """The value of an initializer, or of a Transpose of one (the int8 LM head reads its rows that way)."""
        if name in self.inits:
            return self.read(self.inits[name])
        producer = self.producers[name]
        if producer.op_type != "Transpose" or producer.input[0] not in self.inits:
            raise ValueError(f"per-row scales: the weight {name} is neither an initializer nor its transpose")
        return self.read(self.inits[producer.input[0]]).T

    def symmetric(self, x: str) -> bool:
        """Whether `x` comes from a LayerNormalization through ops that only move or select its rows."""
        while x in self.producers and self.producers[x].op_type in _PASS_THROUGH:
            x = self.producers[x].input[0]
        return x in self.producers and self.producers[x].op_type in _NORMS


def per_row_activations(model: Any, read: Callable[[Any], Any] | None = None) -> int:
    """Rewrite `model` (an ONNX ModelProto from `quantize_dynamic` and onnxmt's int8 tables) in place so that every
    integer MatMul quantizes its input per row; returns how many MatMuls were rewritten. Raises ValueError on a
    dynamic quantization it does not recognise, rather than leave a per-tensor scale behind. `read` gives an
    initializer's value (default: from the graph; the quantizer's graphs are loaded without their weights)."""
    from onnx import numpy_helper

    graph = model.graph
    readers: dict[str, list[Any]] = {}
    for node in graph.node:
        for name in node.input:
            readers.setdefault(name, []).append(node)
    g = _Graph(
        opset=next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx")),
        inits={init.name: init for init in graph.initializer},
        producers={o: n for n in graph.node for o in n.output},
        read=read or numpy_helper.to_array,
    )
    position = {id(node): i for i, node in enumerate(graph.node)}
    rows: dict[str, _Rows] = {}  # float input -> how it is quantized
    replaced: dict[int, list[Any]] = {}  # id(node) -> the nodes that take its place
    count = 0
    for node in graph.node:
        if node.op_type == "DynamicQuantizeLinear":
            replaced[id(node)] = _quantize_rows(node.input[0], rows, g)
            for reader in readers.get(node.output[0], []):
                nodes, dropped = _rewrite_matmul_integer(reader, node, readers, rows[node.input[0]], g)
                last = max(dropped, key=lambda n: position[id(n)])  # where every input of the new nodes exists
                replaced.update({id(n): nodes if n is last else [] for n in dropped})
                count += 1
        elif node.op_type == "DynamicQuantizeMatMul" and node.domain == "com.microsoft":
            quantized = _quantize_rows(node.input[0], rows, g)
            replaced[id(node)] = quantized + _rewrite_head(node, rows[node.input[0]], g)
            count += 1
    nodes = [n for node in graph.node for n in replaced.get(id(node), [node])]
    del graph.node[:]
    graph.node.extend(nodes)
    graph.initializer.extend(g.made)
    if count and not any(o.domain == "com.microsoft" for o in model.opset_import):
        from onnx import helper

        model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    return count


def _reduce(op: str, x: str, out: str, g: _Graph) -> Any:
    from onnx import helper

    if g.opset >= 18:  # axes became an input
        return helper.make_node(op, [x, g.constant("last_axis")], [out], keepdims=1)
    return helper.make_node(op, [x], [out], axes=[-1], keepdims=1)


def _quantize_rows(x: str, rows: dict[str, _Rows], g: _Graph) -> list[Any]:
    """Nodes that quantize `x` per row (module docstring), recorded in `rows`; none when `x` already is."""
    from onnx import TensorProto, helper

    if x in rows:
        return []
    base = f"{PREFIX}/{x}"
    n = {k: f"{base}.{k}" for k in ("abs", "max", "min", "sum", "centre", "half", "s", "scale", "shifted", "scaled")}
    if g.symmetric(x):
        nodes = [helper.make_node("Abs", [x], [n["abs"]]), _reduce("ReduceMax", n["abs"], n["half"], g)]
        shifted, centre = x, None
    else:
        nodes = [
            _reduce("ReduceMax", x, n["max"], g),
            _reduce("ReduceMin", x, n["min"], g),
            helper.make_node("Add", [n["max"], n["min"]], [n["sum"]]),
            helper.make_node("Div", [n["sum"], g.constant("two")], [n["centre"]]),
            helper.make_node("Sub", [n["max"], n["centre"]], [n["half"]]),
            helper.make_node("Sub", [x, n["centre"]], [n["shifted"]]),
        ]
        shifted, centre = n["shifted"], n["centre"]
    nodes += [
        helper.make_node("Div", [n["half"], g.constant("levels")], [n["s"]]),
        helper.make_node("Max", [n["s"], g.constant("tiny")], [n["scale"]]),
        helper.make_node("Div", [shifted, n["scale"]], [n["scaled"]]),
        helper.make_node("Round", [n["scaled"]], [f"{base}.rounded"]),
        helper.make_node("Add", [f"{base}.rounded", g.constant("offset")], [f"{base}.offset"]),
        helper.make_node("Cast", [f"{base}.offset"], [f"{base}.q"], to=TensorProto.UINT8),
    ]
    for i, node in enumerate(nodes):
        node.name = f"{base}.{i}"
    rows[x] = _Rows(f"{base}.q", n["scale"], centre)
    return nodes


def _matmul(name: str, rows: _Rows, weight: str, weight_scale: str, weight_zero: str, out: str, g: _Graph) -> list:
    """y = MatMulIntegerToFloat(q, W8, 1, w_scale, 128, w_zero) * s [+ m * c], written to `out`."""
    import numpy as np
    from onnx import helper

    unscaled, scaled = f"{PREFIX}/{name}.unscaled", f"{PREFIX}/{name}.scaled"
    inputs = [rows.q, weight, g.constant("one"), weight_scale, g.constant("zero_point"), weight_zero]
    nodes = [
        helper.make_node("MatMulIntegerToFloat", inputs, [unscaled], name=name, domain="com.microsoft"),
        helper.make_node("Mul", [unscaled, rows.scale], [scaled if rows.centre else out], name=f"{name}.row_scales"),
    ]
    if rows.centre:
        # x = s (q - 128) + m: the centre's share of the product is m times the dequantized weights' column sums.
        w8 = g.array(weight).astype(np.float64)
        sums = (w8.sum(axis=0) * g.array(weight_scale).astype(np.float64)).astype(np.float32)
        column_sums = g.add(sums, f"{PREFIX}/{name}.column_sums")
        nodes += [
            helper.make_node("Mul", [rows.centre, column_sums], [f"{PREFIX}/{name}.centred"], name=f"{name}.centre"),
            helper.make_node("Add", [scaled, f"{PREFIX}/{name}.centred"], [out], name=f"{name}.centre_add"),
        ]
    return nodes


def _rewrite_matmul_integer(
    matmul: Any, quantize: Any, readers: dict[str, list[Any]], rows: _Rows, g: _Graph
) -> tuple[list[Any], list[Any]]:
    """`quantize_dynamic`'s `MatMulInteger(xq, W8, xz, wz)` -> `Cast` -> `Mul(., Mul(xs, w_scale))` on the
    row-quantized input. Returns the new nodes and the nodes they replace."""

    def only_reader(name: str, op_type: str) -> Any:
        found = readers.get(name, [])
        if len(found) != 1 or found[0].op_type != op_type:
            raise ValueError(f"per-row scales: {name} is read by {[n.op_type for n in found]}, expected one {op_type}")
        return found[0]

    q, scale_out, zero_out = quantize.output
    if matmul.op_type != "MatMulInteger" or matmul.input[0] != q or matmul.input[2] != zero_out:
        raise ValueError(f"per-row scales: unexpected reader {matmul.op_type} {matmul.name} of {q}")
    cast = only_reader(matmul.output[0], "Cast")
    product = only_reader(cast.output[0], "Mul")
    scales = next(iter(set(product.input) - {cast.output[0]}))
    combine = next((n for n in readers.get(scale_out, []) if n.op_type == "Mul" and n.output[0] == scales), None)
    if combine is None:
        raise ValueError(f"per-row scales: no Mul of {scale_out} feeds {product.name}")
    weight_scale = next(iter(set(combine.input) - {scale_out}))
    weight_zero = matmul.input[3] if len(matmul.input) > 3 else ""
    nodes = _matmul(matmul.name, rows, matmul.input[1], weight_scale, weight_zero, product.output[0], g)
    return nodes, [matmul, cast, combine, product]


def _rewrite_head(node: Any, rows: _Rows, g: _Graph) -> list[Any]:
    """onnxmt's int8 LM head `DynamicQuantizeMatMul(x, W8, w_scale[, w_zero, bias])` on the row-quantized input;
    the bias is added after the row scale."""
    from onnx import helper

    _, weight, weight_scale, weight_zero, bias = list(node.input) + [""] * (5 - len(node.input))
    out = node.output[0]
    unbiased = f"{PREFIX}/{node.name}.unbiased" if bias else out
    nodes = _matmul(node.name, rows, weight, weight_scale, weight_zero, unbiased, g)
    if bias:
        nodes.append(helper.make_node("Add", [unbiased, bias], [out], name=f"{node.name}.bias"))
    return nodes
