"""Running ONNX Runtime's quantizers on one group of nodes at a time, so that no step holds the whole model.

`quantize_dynamic` and `MatMulNBitsQuantizer` take a whole model in memory and copy it twice more (3.2x the fp32
weights at the peak for NLLB-200-1.3B). Each quantizes a node from that node alone, except that the dynamic
quantizer quantizes an activation once for all the MatMuls that read it. So the nodes to quantize are cut into
groups (the MatMuls that read one activation; for int4, one node each); each group becomes a small model of its
nodes with their weights read in, is quantized, and its result takes the group's place in the graph, the new
weights written out at once (binding.Tensors). The peak is one group's weights, not the model's.
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
) -> None:
    """Quantize each group of `members` (lists of `model`'s nodes) with `quantizer` and splice the result into
    `model` in place of the group. `progress(n)` is told the group's weight bytes when it is done."""
    import onnx

    graph = model.graph
    inits = {init.name: init for init in graph.initializer}
    types = _types(graph)
    with tempfile.TemporaryDirectory(prefix="onnxmt-quantize-") as scratch:
        for i, group in enumerate(members):
            small = _group_model(model, group, inits, types, tensors)
            path = Path(scratch) / f"group{i}.onnx"
            quantizer(small, path)
            _splice(model, group, onnx.load(str(path)), inits, tensors)
            path.unlink()
            progress(sum(nbytes(inits[n]) for node in group for n in node.input if n in inits))
    used = {name for node in graph.node for name in node.input}
    for init in [i for i in graph.initializer if i.name not in used]:
        graph.initializer.remove(init)


def _types(graph: Any) -> dict[str, Any]:
    """Each value's type, where the graph records it."""
    return {v.name: v.type for v in [*graph.input, *graph.value_info, *graph.output]}


def _group_model(model: Any, group: list[Any], inits: dict[str, Any], types: dict[str, Any], tensors: Tensors) -> Any:
    """A model of the nodes `group` alone: their non-constant inputs as its inputs (float, or int64 indices where
    the graph records no type), their weights read in, their outputs as its outputs."""
    from onnx import TensorProto, helper, numpy_helper

    read_inside = {name for node in group for name in node.input}
    names = list(dict.fromkeys(name for node in group for name in node.input if name))
    weights = [numpy_helper.from_array(tensors.array(inits[n]), n) for n in names if n in inits]
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
