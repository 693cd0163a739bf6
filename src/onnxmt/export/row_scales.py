"""Per-row activation scales for dynamic int8, so that a sentence's output no longer depends on its batch-mates.

ONNX Runtime's dynamic int8 quantizes the input of every integer MatMul with `DynamicQuantizeLinear` (also inside
`DynamicQuantizeMatMul`, and inside the `MatMulIntegerToFloat` its fusions make): one uint8 scale and zero point
computed over the whole tensor, every row of the batch and the padding included. A sentence's activations are then
rounded on a grid that its batch-mates chose, and at a near-tie its tokens change with them (docs/serve.md has the
measured rates). Here each row of such an input (one token's vector, the last axis) gets a scale of its own:

    s = max(max(|x|) over the row / 127, tiny)                           # (..., 1)
    q = uint8(round(x / s) + 128)                                        # symmetric, offset into uint8
    y = MatMulIntegerToFloat(q, W8, 1, w_scale, 128, w_zero) * s [+ bias]

which is exact arithmetic on the same int8 weights: (q - 128) · W8 is an integer product, scaled by s per row and
by w_scale per column afterwards. Why this form and not the obvious ones (onnxruntime 1.32, CPU):

- MatMulInteger's `a_zero_point` may be one per row in the ONNX spec, but ONNX Runtime's kernel accepts only a
  scalar ("input1 zero point must be a scalar or 1D tensor of size 1"): so one zero point, 128, for every row, and
  a symmetric range per row.
- MatMulIntegerToFloat accepts an `a_scale` of shape (rows, 1) and computes something else with it: the row scale
  multiplies the output instead.
- int8 activations without the offset would run the s8s8 kernels, measured 5-10x slower than u8s8 on AVX2.

What is left batch-dependent is what fp32 has too: padding changes the summation order of some float kernels
(attention over a padded source), which moves some logits by ~1e-6 (benchmarks/int8_batch.py measures both).
"""

from __future__ import annotations

from typing import Any

PREFIX = "row_scales"  # names of the nodes and tensors written here start with it


def per_row_activations(model: Any, centered: bool = False) -> int:
    """Rewrite `model` (an ONNX ModelProto from `quantize_dynamic` and onnxmt's int8 tables) in place so that every
    integer MatMul quantizes its input per row; returns how many MatMuls were rewritten. Raises ValueError on a
    dynamic quantization it does not recognise, rather than leave a per-tensor scale behind."""
    graph = model.graph
    readers: dict[str, list[Any]] = {}
    for node in graph.node:
        for name in node.input:
            readers.setdefault(name, []).append(node)
    constants = _Constants(graph, _opset(model))
    constants.centered = centered
    constants.inits = {init.name: init for init in graph.initializer}
    constants.producers = {o: n for n in graph.node for o in n.output}
    position = {id(node): i for i, node in enumerate(graph.node)}
    rows: dict[str, tuple[str, str, str]] = {}  # float input -> (its uint8 rows, its row scales)
    replaced: dict[int, list[Any]] = {}  # id(node) -> the nodes that take its place
    count = 0
    for node in graph.node:
        if node.op_type == "DynamicQuantizeLinear":
            replaced[id(node)] = _quantize_rows(node.input[0], rows, constants)
            for reader in readers.get(node.output[0], []):
                nodes, dropped = _rewrite_matmul_integer(reader, node, readers, rows[node.input[0]], constants)
                last = max(dropped, key=lambda n: position[id(n)])  # where every input of the new nodes exists
                replaced.update({id(n): nodes if n is last else [] for n in dropped})
                count += 1
        elif node.op_type == "DynamicQuantizeMatMul" and node.domain == "com.microsoft":
            new = [] if node.input[0] in rows else _quantize_rows(node.input[0], rows, constants)
            replaced[id(node)] = new + _quantized_head(node, rows[node.input[0]], constants)
            count += 1
    nodes = [n for node in graph.node for n in replaced.get(id(node), [node])]
    del graph.node[:]
    graph.node.extend(nodes)
    graph.initializer.extend(constants.made)
    if count and not any(o.domain == "com.microsoft" for o in model.opset_import):
        from onnx import helper

        model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    return count


def _opset(model: Any) -> int:
    return next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))


class _Constants:
    """The scalars the rewritten nodes share, each added to the graph once."""

    def __init__(self, graph: Any, opset: int) -> None:
        self.opset = opset
        self.centered = False
        self.inits: dict[str, Any] = {}
        self.producers: dict[str, Any] = {}
        self.made: list[Any] = []
        self._names: dict[str, str] = {}
        self._taken = {init.name for init in graph.initializer}

    def get(self, key: str) -> str:
        import numpy as np
        from onnx import numpy_helper

        values = {
            "one": np.array(1.0, np.float32),
            "levels": np.array(127.0, np.float32),  # symmetric int8 range: -127..127
            "tiny": np.array(np.finfo(np.float32).tiny, np.float32),  # an all-zero row: scale > 0, q = 128
            "offset": np.array(128.0, np.float32),
            "two": np.array(2.0, np.float32),
            "zero_point": np.array(128, np.uint8),
            "last_axis": np.array([-1], np.int64),
        }
        if key not in self._names:
            name = f"{PREFIX}.{key}"
            while name in self._taken:
                name += "_"
            self._taken.add(name)
            self._names[key] = name
            self.made.append(numpy_helper.from_array(values[key], name))
        return self._names[key]


def _quantize_rows(x: str, rows: dict[str, tuple[str, str, str]], c: _Constants) -> list[Any]:
    """Nodes that quantize `x` per row, recorded in `rows`; none when `x` is already quantized."""
    from onnx import TensorProto, helper

    if x in rows:
        return []
    base = f"{PREFIX}/{x}"
    names = {k: f"{base}.{k}" for k in ("abs", "max", "scale0", "scale", "scaled", "rounded", "offset", "q")}
    if c.opset >= 18:
        reduce = helper.make_node("ReduceMax", [names["abs"], c.get("last_axis")], [names["max"]], keepdims=1)
    else:
        reduce = helper.make_node("ReduceMax", [names["abs"]], [names["max"]], axes=[-1], keepdims=1)
    nodes = [
        helper.make_node("Abs", [x], [names["abs"]]),
        reduce,
        helper.make_node("Div", [names["max"], c.get("levels")], [names["scale0"]]),
        helper.make_node("Max", [names["scale0"], c.get("tiny")], [names["scale"]]),
        helper.make_node("Div", [x, names["scale"]], [names["scaled"]]),
        helper.make_node("Round", [names["scaled"]], [names["rounded"]]),  # |x| / s <= 127: no clip needed
        helper.make_node("Add", [names["rounded"], c.get("offset")], [names["offset"]]),
        helper.make_node("Cast", [names["offset"]], [names["q"]], to=TensorProto.UINT8),
    ]
    for i, node in enumerate(nodes):
        node.name = f"{base}.{i}"
    if c.centered:
        from onnx import TensorProto as _T  # noqa: F401

        names.update({k: f"{base}.{k}" for k in ("min", "sum", "mid", "half", "shifted")})
        reduce_min = helper.make_node("ReduceMin", [x], [names["min"]], axes=[-1], keepdims=1)
        reduce_max = helper.make_node("ReduceMax", [x], [names["max"]], axes=[-1], keepdims=1)
        nodes = [
            reduce_min,
            reduce_max,
            helper.make_node("Add", [names["max"], names["min"]], [names["sum"]]),
            helper.make_node("Div", [names["sum"], c.get("two")], [names["mid"]]),
            helper.make_node("Sub", [names["max"], names["mid"]], [names["half"]]),
            helper.make_node("Div", [names["half"], c.get("levels")], [names["scale0"]]),
            helper.make_node("Max", [names["scale0"], c.get("tiny")], [names["scale"]]),
            helper.make_node("Sub", [x, names["mid"]], [names["shifted"]]),
            helper.make_node("Div", [names["shifted"], names["scale"]], [names["scaled"]]),
            helper.make_node("Round", [names["scaled"]], [names["rounded"]]),
            helper.make_node("Add", [names["rounded"], c.get("offset")], [names["offset"]]),
            helper.make_node("Cast", [names["offset"]], [names["q"]], to=TensorProto.UINT8),
        ]
        for i, node in enumerate(nodes):
            node.name = f"{base}.{i}"
        rows[x] = (names["q"], names["scale"], names["mid"])
        return nodes
    rows[x] = (names["q"], names["scale"], "")
    return nodes


def _column_sums(c: _Constants, weight: str, weight_scale: str, out: str) -> list[Any]:
    """Constant s_w * colsum(W8) of the (K, N) int8 weight `weight` (an initializer or a Transpose of one)."""
    import numpy as np
    from onnx import numpy_helper

    if weight in c.inits:
        w = numpy_helper.to_array(c.inits[weight]).astype(np.float64)
    else:
        flip = c.producers[weight]
        w = numpy_helper.to_array(c.inits[flip.input[0]]).astype(np.float64).T
    scale = numpy_helper.to_array(c.inits[weight_scale]).astype(np.float64)
    c.made.append(numpy_helper.from_array((w.sum(axis=0) * scale).astype(np.float32), out))
    return []


def _offset_terms(
    c: _Constants, rows: tuple[str, str, str], weight: str, weight_scale: str, name: str, scaled: str, out: str
) -> list[Any]:
    from onnx import helper

    mid = rows[2]
    if not mid:
        return []
    sums = f"{PREFIX}/{name}.column_sums"
    _column_sums(c, weight, weight_scale, sums)
    return [
        helper.make_node("Mul", [mid, sums], [f"{PREFIX}/{name}.offset"], name=f"{name}.offset"),
        helper.make_node("Add", [scaled, f"{PREFIX}/{name}.offset"], [out], name=f"{name}.offset_add"),
    ]


def _rewrite_matmul_integer(
    matmul: Any, quantize: Any, readers: dict[str, list[Any]], rows: tuple[str, str, str], c: _Constants
) -> tuple[list[Any], list[Any]]:
    """`quantize_dynamic`'s `MatMulInteger(xq, W8, xz, wz)` -> `Cast` -> `Mul(., Mul(xs, w_scale))` as one
    `MatMulIntegerToFloat` on the row-quantized input times the row scales. Returns the new nodes and the nodes they
    replace."""
    from onnx import helper

    def only_reader(name: str, op_type: str) -> Any:
        found = readers.get(name, [])
        if len(found) != 1 or found[0].op_type != op_type:
            raise ValueError(f"per-row scales: {name} is read by {[n.op_type for n in found]}, expected one {op_type}")
        return found[0]

    q, scale_out, zero_out = quantize.output
    if matmul.op_type != "MatMulInteger" or list(matmul.input[:1]) != [q] or matmul.input[2] != zero_out:
        raise ValueError(f"per-row scales: unexpected reader {matmul.op_type} {matmul.name} of {q}")
    cast = only_reader(matmul.output[0], "Cast")
    product = only_reader(cast.output[0], "Mul")
    scales = next(iter(set(product.input) - {cast.output[0]}))
    combine = next((n for n in readers.get(scale_out, []) if n.op_type == "Mul" and n.output[0] == scales), None)
    if combine is None:
        raise ValueError(f"per-row scales: no Mul of {scale_out} feeds {product.name}")
    weight_scale = next(iter(set(combine.input) - {scale_out}))
    weight_zero = matmul.input[3] if len(matmul.input) > 3 else ""
    row_q, row_scale = rows[0], rows[1]
    unscaled = f"{PREFIX}/{matmul.name}.unscaled"
    extra = _offset_terms(
        c, rows, matmul.input[1], weight_scale, matmul.name, f"{PREFIX}/{matmul.name}.scaled", product.output[0]
    )
    nodes = [
        helper.make_node(
            "MatMulIntegerToFloat",
            [row_q, matmul.input[1], c.get("one"), weight_scale, c.get("zero_point"), weight_zero],
            [unscaled],
            name=matmul.name,
            domain="com.microsoft",
        ),
        helper.make_node(
            "Mul",
            [unscaled, row_scale],
            [f"{PREFIX}/{matmul.name}.scaled" if extra else product.output[0]],
            name=f"{matmul.name}.row_scales",
        ),
    ] + extra
    return nodes, [matmul, cast, combine, product]


def _quantized_head(node: Any, rows: tuple[str, str, str], c: _Constants) -> list[Any]:
    """onnxmt's `DynamicQuantizeMatMul(x, W8, w_scale[, w_zero, bias])` on row-quantized x; the bias is added after
    the row scale."""
    from onnx import helper

    inputs = list(node.input) + [""] * (5 - len(node.input))
    _, weight, weight_scale, weight_zero, bias = inputs
    row_q, row_scale = rows[0], rows[1]
    out = node.output[0]
    unscaled, scaled = f"{PREFIX}/{node.name}.unscaled", f"{PREFIX}/{node.name}.scaled"
    if rows[2]:
        shifted = f"{PREFIX}/{node.name}.shifted"
        extra = _offset_terms(c, rows, weight, weight_scale, node.name, scaled, shifted if bias else out)
        nodes = [
            helper.make_node(
                "MatMulIntegerToFloat",
                [row_q, weight, c.get("one"), weight_scale, c.get("zero_point"), weight_zero],
                [unscaled],
                name=node.name,
                domain="com.microsoft",
            ),
            helper.make_node("Mul", [unscaled, row_scale], [scaled], name=f"{node.name}.row_scales"),
            *extra,
        ]
        if bias:
            nodes.append(helper.make_node("Add", [shifted, bias], [out], name=f"{node.name}.bias"))
        return nodes
    nodes = [
        helper.make_node(
            "MatMulIntegerToFloat",
            [row_q, weight, c.get("one"), weight_scale, c.get("zero_point"), weight_zero],
            [unscaled],
            name=node.name,
            domain="com.microsoft",
        ),
        helper.make_node("Mul", [unscaled, row_scale], [scaled if bias else out], name=f"{node.name}.row_scales"),
    ]
    if bias:
        nodes.append(helper.make_node("Add", [scaled, bias], [out], name=f"{node.name}.bias"))
    return nodes
