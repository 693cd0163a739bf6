"""Running ONNX Runtime's quantizers on one group of nodes at a time, so that no step holds the whole model.

`quantize_dynamic` and `MatMulNBitsQuantizer` take a whole model in memory and copy it twice more (3.2x the fp32
weights at the peak for NLLB-200-1.3B). Each quantizes a node from that node alone, except that the dynamic
quantizer quantizes an activation once for all the MatMuls that read it. So the nodes to quantize are cut into
groups (the MatMuls that read one activation; for int4, one node each); each group becomes a small model of its
nodes with their weights read in, is quantized, and its result takes the group's place in the graph, the new
weights written out at once (binding.Tensors). The peak is one group's weights, not the model's.

A group of one node whose weight is larger than `split` bytes (int4's vocabulary table and LM head: 1-2 GB, which
the quantizer would copy twice more) is quantized a slice at a time: rows of a Gather's table, columns of a MatMul's
weight. Both quantizers work on blocks along the other axis (the table's columns, the weight's rows), so each slice
gives its own rows of every output tensor, which are joined: the same bytes as the whole (tests/export/test_groups.py).
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .binding import Tensors
from .weights import nbytes

# A group's quantized model: the quantizer writes it to `path` from the small model `model`.
Quantizer = Callable[[Any, Path], None]


def groups(graph: Any, nodes: list[str], by_input: bool) -> list[list[Any]]:
    """The nodes named `nodes`, in graph order, in groups: those reading the same first input together
    (`by_input`, for the dynamic quantizer's shared activation), else one each."""
    chosen = set(nodes)
    grouped: dict[str, list[Any]] = {}
    for node in graph.node:
        if node.name in chosen:
            grouped.setdefault(node.input[0] if by_input else node.name, []).append(node)
    return list(grouped.values())


def quantize_in_groups(
    model: Any,
    members: list[list[Any]],
    quantizer: Quantizer,
    tensors: Tensors,
    progress: Callable[[int], None] = lambda n: None,
    split: int | None = None,
) -> None:
    """Quantize each group of `members` (lists of `model`'s nodes) with `quantizer` and splice the result into
    `model` in place of the group. `progress(n)` is told the group's weight bytes when it is done. `split`: the
    weight bytes above which a one-node group is quantized in slices (module docstring); None: never."""
    graph = model.graph
    inits = {init.name: init for init in graph.initializer}
    types = _types(graph)
    with tempfile.TemporaryDirectory(prefix="onnxmt-quantize-") as scratch:
        for group in members:
            where = _sliced(group, inits, split)
            quantized = None
            if where is not None and split is not None:
                quantized = _quantize_slices(model, group[0], *where, split, inits, types, tensors, quantizer, scratch)
            if quantized is None:
                quantized = _quantize(_group_model(model, group, inits, types, tensors), quantizer, scratch)
            _splice(model, group, quantized, inits, tensors)
            progress(sum(nbytes(inits[n]) for node in group for n in node.input if n in inits))
    used = {name for node in graph.node for name in node.input}
    for init in [i for i in graph.initializer if i.name not in used]:
        graph.initializer.remove(init)


def _quantize(small: Any, quantizer: Quantizer, scratch: str) -> Any:
    import onnx

    path = Path(scratch) / "group.onnx"
    quantizer(small, path)
    quantized = onnx.load(str(path))
    path.unlink()
    return quantized


def _sliced(group: list[Any], inits: dict[str, Any], split: int | None) -> tuple[str, int] | None:
    """(weight, axis to slice) of a one-node group to quantize in slices; None to quantize it whole."""
    if split is None or len(group) != 1:
        return None
    node = group[0]
    if node.op_type == "Gather" and node.input[0] in inits:
        weight, axis = node.input[0], 0
    elif node.op_type == "MatMul" and node.input[1] in inits:
        weight, axis = node.input[1], 1
    else:
        return None
    init = inits[weight]
    return (weight, axis) if len(init.dims) == 2 and nbytes(init) > split else None


def _quantize_slices(
    model: Any,
    node: Any,
    weight: str,
    axis: int,
    split: int,
    inits: dict[str, Any],
    types: dict[str, Any],
    tensors: Tensors,
    quantizer: Quantizer,
    scratch: str,
) -> Any | None:
    """`node` quantized a slice of its `weight` along `axis` at a time, the slices' output tensors joined along
    their first axis (MatMulNBits' N attribute set to the whole); None where the quantizer left a slice float."""
    import numpy as np
    from onnx import helper, numpy_helper

    init = inits[weight]
    size = int(init.dims[axis])
    per = max(1, split // (nbytes(init) // size))
    read = tensors.reader.rows if axis == 0 else tensors.reader.columns
    slices: list[Any] = []
    for start in range(0, size, per):
        part = read(init, start, min(start + per, size))
        slices.append(_quantize(_group_model(model, [node], inits, types, tensors, {weight: part}), quantizer, scratch))
        del part
        if any(i.name == weight for i in slices[-1].graph.initializer):
            return None
    first = slices[0]
    parts = [{i.name: i for i in quantized.graph.initializer} for quantized in slices]
    joined = [
        numpy_helper.from_array(np.concatenate([numpy_helper.to_array(p[t.name]) for p in parts]), t.name)
        for t in first.graph.initializer
    ]
    del slices[1:], parts  # their tensors are in `joined` now
    nodes = list(first.graph.node)
    for quantized in nodes:
        for attribute in quantized.attribute:
            if quantized.op_type == "MatMulNBits" and attribute.name == "N":
                attribute.i = size
    graph = helper.make_graph(nodes, "group", first.graph.input, first.graph.output, initializer=joined)
    return helper.make_model(graph, opset_imports=list(first.opset_import), ir_version=first.ir_version)


def _types(graph: Any) -> dict[str, Any]:
    """Each value's type, where the graph records it."""
    return {v.name: v.type for v in [*graph.input, *graph.value_info, *graph.output]}


def _group_model(
    model: Any,
    group: list[Any],
    inits: dict[str, Any],
    types: dict[str, Any],
    tensors: Tensors,
    given: dict[str, Any] | None = None,
) -> Any:
    """A model of the nodes `group` alone: their non-constant inputs as its inputs (float, or int64 indices where
    the graph records no type), their weights read in (or as `given`: a slice), their outputs as its outputs."""
    from onnx import TensorProto, helper, numpy_helper

    given = given or {}
    read_inside = {name for node in group for name in node.input}
    names = list(dict.fromkeys(name for node in group for name in node.input if name))
    weights = [
        numpy_helper.from_array(given[n] if n in given else tensors.array(inits[n]), n) for n in names if n in inits
    ]
    inputs = []
    for name in names:
        if name in inits:
            continue
        if name in types:
            inputs.append(helper.make_value_info(name, types[name]))
        else:
            index = any(node.op_type == "Gather" and node.input[1] == name for node in group)
            inputs.append(helper.make_tensor_value_info(name, TensorProto.INT64 if index else TensorProto.FLOAT, None))
    outputs = [
        helper.make_value_info(out, types[out]) if out in types else helper.make_tensor_value_info(out, 1, None)
        for node in group
        for out in node.output
        if out not in read_inside
    ]
    graph = helper.make_graph(list(group), "group", inputs, outputs, initializer=weights)
    return helper.make_model(graph, opset_imports=list(model.opset_import), ir_version=model.ir_version)


def _splice(model: Any, group: list[Any], quantized: Any, inits: dict[str, Any], tensors: Tensors) -> None:
    """Put `quantized`'s nodes where `group`'s first node is, and its new initializers into `model` (large ones
    written out by `tensors`); merge its operator sets."""
    from onnx import numpy_helper

    graph = model.graph
    index = min(i for i, node in enumerate(graph.node) if any(node is g for g in group))
    for node in group:
        graph.node.remove(node)
    for offset, node in enumerate(quantized.graph.node):
        graph.node.insert(index + offset, node)
    for init in quantized.graph.initializer:
        if init.name in inits:
            if init.data_type == inits[init.name].data_type and list(init.dims) == list(inits[init.name].dims):
                continue  # a weight the quantizer left as it was: the graph still has it
            raise ValueError(f"quantizing {group[0].name}: the quantizer rewrote {init.name!r} in place")
        tensor = tensors.make(numpy_helper.to_array(init), init.name)
        graph.initializer.append(tensor)
        inits[init.name] = tensor
    versions = {o.domain: o for o in model.opset_import}
    for opset in quantized.opset_import:
        if opset.domain not in versions:
            model.opset_import.append(opset)
        elif versions[opset.domain].version < opset.version:
            versions[opset.domain].version = opset.version
