"""What an ONNX graph file holds: its operators and the element types of its weights, and so its quantization.

`onnxmt inspect` reports the quantization of every graph from the graph itself, not from a file name or a manifest
field: an Optimum int8 directory keeps the fp32 file names, a Transformers.js `_quantized` file may hold int8 or
uint8 weights. The run side has no `onnx` package (ONNX Runtime does not expose a session's nodes), so this module
reads the protobuf wire format directly: an ONNX file is a `ModelProto`, whose field numbers are fixed by the ONNX
spec (onnx/onnx.proto). Only the few fields needed are decoded; weight bytes are skipped, never copied, and the file
is memory-mapped, so a 300 MB graph costs a walk over its nodes. External data files are not read at all: a tensor
stored outside still has its element type and shape in the graph, and the place of its data (`external`), which
runtime/dircheck.py checks before ONNX Runtime opens anything.
"""

from __future__ import annotations

import math
import mmap
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# ModelProto.graph; GraphProto.node, .initializer; NodeProto.op_type, .attribute; AttributeProto.name, .i, .t, .g,
# .graphs (subgraphs: If branches of merged decoders, Loop bodies); TensorProto.dims, .data_type.
_MODEL_GRAPH = 7
_GRAPH_NODE, _GRAPH_INITIALIZER, _GRAPH_INPUT, _GRAPH_OUTPUT = 1, 5, 11, 12
_NODE_INPUT, _NODE_OP_TYPE, _NODE_ATTRIBUTE = 1, 4, 5
_ATTR_NAME, _ATTR_I, _ATTR_T, _ATTR_G, _ATTR_GRAPHS = 1, 3, 5, 6, 11
_TENSOR_DIMS, _TENSOR_DATA_TYPE, _TENSOR_NAME, _TENSOR_EXTERNAL_DATA, _TENSOR_DATA_LOCATION = 1, 2, 8, 13, 14
_ENTRY_KEY, _ENTRY_VALUE = 1, 2  # StringStringEntryProto
# ValueInfoProto.name, .type; TypeProto.tensor_type; TypeProto.Tensor.shape; TensorShapeProto.dim; its
# Dimension.dim_value, .dim_param.
_VALUE_NAME, _VALUE_TYPE, _TYPE_TENSOR, _TENSOR_TYPE_SHAPE, _SHAPE_DIM, _DIM_VALUE, _DIM_PARAM = 1, 2, 1, 2, 1, 1, 2
_EXTERNAL = 1  # TensorProto.DataLocation.EXTERNAL
# TensorProto.DataType values of weights.
DTYPES = {1: "fp32", 2: "uint8", 3: "int8", 10: "fp16", 11: "fp64", 16: "bf16", 21: "uint4", 22: "int4"}
FLOATS = ("fp32", "fp16", "bf16", "fp64")
# Operators that dynamic 8-bit quantization (ONNX Runtime's quantize_dynamic, onnxmt quantize) puts in a graph.
DYNAMIC_INT8_OPS = (
    "DynamicQuantizeLinear",
    "MatMulInteger",
    "DynamicQuantizeMatMul",
    "MatMulIntegerToFloat",  # onnxmt quantize --per-row-scales (export/row_scales.py)
    "ConvInteger",
    "DynamicQuantizeLSTM",
    "QAttention",
    "QGemm",
)
# Of those, the ones whose second input is the (quantized) weight matrix.
_INTEGER_MATMULS = ("MatMulInteger", "DynamicQuantizeMatMul", "MatMulIntegerToFloat", "ConvInteger", "QGemm")
# Static (calibrated) 8-bit quantization: quantize/dequantize pairs or QLinear operators.
STATIC_INT8_OPS = ("QuantizeLinear", "QLinearMatMul", "QLinearConv", "QLinearAdd", "QLinearMul")
# Attributes kept, for the 4-bit operators' summaries.
_KEPT_ATTRIBUTES = {"bits", "block_size", "quant_type"}
_BNB4_TYPES = {0: "fp4", 1: "nf4"}


@dataclass
class GraphContents:
    """Operators (with their count, subgraphs included), weight elements by type, the attributes of the 4-bit
    operators (one dict per node), and the element types of the weight matrices integer MatMuls read."""

    ops: Counter[str] = field(default_factory=Counter)
    weights: Counter[str] = field(default_factory=Counter)
    attributes: dict[str, list[dict[str, int]]] = field(default_factory=dict)
    initializer_types: dict[str, str] = field(default_factory=dict)
    integer_matmul_weights: list[str] = field(default_factory=list)
    # The main graph's inputs and outputs: name -> dims (an int, or the name of a dynamic axis; "?" for neither).
    inputs: dict[str, list[int | str]] = field(default_factory=dict)
    outputs: dict[str, list[int | str]] = field(default_factory=dict)
    # Every tensor stored outside the file (subgraphs' included): its external_data entries (location, offset,
    # length), as the file gives them.
    external: list[dict[str, str]] = field(default_factory=list)

    @property
    def float_type(self) -> str:
        """The float type most weight elements are stored in ("fp32" for a graph without float weights)."""
        floats = {t: n for t, n in self.weights.items() if t in FLOATS}
        return max(floats, key=lambda t: floats[t]) if floats else "fp32"

    def quantization(self) -> str:
        """One line: "fp32", "fp16", "dynamic int8 (int8 weights; ...)", "int4 weight-only (MatMulNBits ...)"."""
        found = [*self._four_bit(), *self._eight_bit()]
        floats = self.float_type
        if not found:
            return floats
        return "; ".join(found) + ("" if floats == "fp32" else f"; other weights {floats}")

    def _four_bit(self) -> list[str]:
        out = []
        nbits = [op for op in ("MatMulNBits", "GatherBlockQuantized") if self.ops[op]]
        if nbits:
            nodes = [a for op in nbits for a in self.attributes.get(op, [])]
            ops = ", ".join(f"{op} x{self.ops[op]}" for op in nbits)
            out.append(f"int{_values(nodes, 'bits', 4)} weight-only ({ops}; block size {_values(nodes, 'block_size')})")
        if self.ops["MatMulBnb4"]:
            nodes = self.attributes.get("MatMulBnb4", [])
            kinds = "/".join(sorted({_BNB4_TYPES.get(n.get("quant_type", -1), "?") for n in nodes}))
            ops = f"MatMulBnb4 x{self.ops['MatMulBnb4']}"
            out.append(f"4-bit {kinds} weight-only ({ops}; block size {_values(nodes, 'block_size')})")
        return out

    def _eight_bit(self) -> list[str]:
        dynamic = {op: self.ops[op] for op in DYNAMIC_INT8_OPS if self.ops[op]}
        static = {op: self.ops[op] for op in STATIC_INT8_OPS if self.ops[op]}
        if not dynamic and not static:
            return []
        # The weights' type is that of the matrices the integer MatMuls read: quantize_dynamic stores quantized
        # embedding tables (Gather) as uint8 even when the MatMul weights are int8, so counting elements misleads.
        types = {self.initializer_types.get(name) for name in self.integer_matmul_weights} - {None}
        kind = "/".join(sorted(t for t in types if t is not None)) or "8-bit"
        ops = ", ".join(f"{op} x{n}" for op, n in (dynamic or static).items())
        return [f"{'dynamic' if dynamic else 'static'} {kind} ({kind} weights; {ops})"]


def _values(nodes: list[dict[str, int]], name: str, default: int | None = None) -> str:
    """The values an attribute takes over `nodes`, "32" or "32/64"; "?" when no node has it."""
    values = {n.get(name, default) for n in nodes}
    return "/".join(str(v) for v in sorted(v for v in values if v is not None)) or "?"


def read_graph(path: str | Path) -> GraphContents:
    """Operators and weight element types of the ONNX file at `path` (its external data is not read)."""
    contents = GraphContents()
    with open(path, "rb") as f:
        if Path(path).stat().st_size == 0:
            raise ValueError(f"{path}: empty file, not an ONNX graph")
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            graphs = [value for number, value in _fields(buf, 0, len(buf)) if number == _MODEL_GRAPH]
            if not graphs:
                raise ValueError(f"{path}: no graph in this file; is it an ONNX model?")
            for span in graphs:
                _read_graph(buf, span, contents, main=True)
    return contents


Span = tuple[int, int]


def _read_graph(buf: mmap.mmap, span: Span, contents: GraphContents, main: bool = False) -> None:
    for number, value in _fields(buf, *span):
        if number == _GRAPH_NODE:
            _read_node(buf, value, contents)
        elif number == _GRAPH_INITIALIZER:
            name, dtype = _count_tensor(buf, value, contents)
            contents.initializer_types[name] = dtype
        elif main and number in (_GRAPH_INPUT, _GRAPH_OUTPUT):
            name, dims = _value_info(buf, value)
            (contents.inputs if number == _GRAPH_INPUT else contents.outputs)[name] = dims


def _value_info(buf: mmap.mmap, span: Span) -> tuple[str, list[int | str]]:
    """A graph input's or output's name and dims (a tensor's; empty for other types or an unknown rank)."""
    name, dims = "", []
    for number, value in _fields(buf, *span):
        if number == _VALUE_NAME:
            name = buf[value[0] : value[1]].decode("utf-8", "replace")
        elif number == _VALUE_TYPE:
            for shape in _nested(buf, value, (_TYPE_TENSOR, _TENSOR_TYPE_SHAPE)):
                dims = [_dimension(buf, dim) for n, dim in _fields(buf, *shape) if n == _SHAPE_DIM]
    return name, dims


def _nested(buf: mmap.mmap, span: Span, path: tuple[int, ...]) -> Iterator[Span]:
    """The spans of the message fields at `path` (field numbers, outermost first) under `span`."""
    if not path:
        yield span
        return
    for number, value in _fields(buf, *span):
        if number == path[0] and isinstance(value, tuple):
            yield from _nested(buf, value, path[1:])


def _dimension(buf: mmap.mmap, span: Span) -> int | str:
    for number, value in _fields(buf, *span):
        if number == _DIM_VALUE:
            return value - (1 << 64) if value >= 1 << 63 else value  # int64, two's complement
        if number == _DIM_PARAM:
            return buf[value[0] : value[1]].decode("utf-8", "replace")
    return "?"


def _read_node(buf: mmap.mmap, span: Span, contents: GraphContents) -> None:
    op_type, attributes, inputs = "", {}, []
    for number, value in _fields(buf, *span):
        if number == _NODE_INPUT:
            inputs.append(buf[value[0] : value[1]].decode("utf-8", "replace"))
        elif number == _NODE_OP_TYPE:
            op_type = buf[value[0] : value[1]].decode("utf-8", "replace")
        elif number == _NODE_ATTRIBUTE:
            name, integer = _read_attribute(buf, value, contents)
            if name in _KEPT_ATTRIBUTES and integer is not None:
                attributes[name] = integer
    contents.ops[op_type] += 1
    if op_type in _INTEGER_MATMULS and len(inputs) > 1:
        contents.integer_matmul_weights.append(inputs[1])
    if op_type in ("MatMulNBits", "GatherBlockQuantized", "MatMulBnb4"):
        contents.attributes.setdefault(op_type, []).append(attributes)


def _read_attribute(buf: mmap.mmap, span: Span, contents: GraphContents) -> tuple[str, int | None]:
    """The attribute's name and integer value; subgraphs and tensor values are walked into `contents`."""
    name, integer = "", None
    for number, value in _fields(buf, *span):
        if number == _ATTR_NAME:
            name = buf[value[0] : value[1]].decode("utf-8", "replace")
        elif number == _ATTR_I:
            integer = value
        elif number == _ATTR_T:
            _count_tensor(buf, value, contents)  # a Constant's value
        elif number in (_ATTR_G, _ATTR_GRAPHS):
            _read_graph(buf, value, contents)
    return name, integer


def _count_tensor(buf: mmap.mmap, span: Span, contents: GraphContents) -> tuple[str, str]:
    """Counts a tensor's elements by type; returns its name and type."""
    dims: list[int] = []
    dtype, name, location = 0, "", 0
    external: dict[str, str] = {}
    for number, value in _fields(buf, *span, packed=(_TENSOR_DIMS,)):
        if number == _TENSOR_DIMS:
            dims.append(value)
        elif number == _TENSOR_DATA_TYPE:
            dtype = value
        elif number == _TENSOR_NAME:
            name = buf[value[0] : value[1]].decode("utf-8", "replace")
        elif number == _TENSOR_DATA_LOCATION:
            location = value
        elif number == _TENSOR_EXTERNAL_DATA:
            entry = {n: buf[v[0] : v[1]].decode("utf-8", "replace") for n, v in _fields(buf, *value)}
            external[entry.get(_ENTRY_KEY, "")] = entry.get(_ENTRY_VALUE, "")
    if location == _EXTERNAL or external:
        contents.external.append(external)
    if dtype in DTYPES:
        contents.weights[DTYPES[dtype]] += math.prod(dims)
    return name, DTYPES.get(dtype, str(dtype))


def _varint(buf: mmap.mmap, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, pos
        shift += 7


def _fields(buf: mmap.mmap, start: int, end: int, packed: tuple[int, ...] = ()) -> Iterator[tuple[int, Any]]:
    """(field number, value) of a message's fields: an int for varints, a (start, end) span for length-delimited
    fields; fixed-width numbers are skipped. Fields in `packed` are repeated varints, packed or not."""
    pos = start
    while pos < end:
        key, pos = _varint(buf, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(buf, pos)
            yield number, value
        elif wire == 2:
            length, pos = _varint(buf, pos)
            if number in packed:
                inner = pos
                while inner < pos + length:
                    value, inner = _varint(buf, inner)
                    yield number, value
            else:
                yield number, (pos, pos + length)
            pos += length
        elif wire == 1:
            pos += 8
        elif wire == 5:
            pos += 4
        else:
            raise ValueError(f"not an ONNX protobuf (wire type {wire} at byte {pos})")
