"""Giving a graph traced without its weights the module's weights, one tensor at a time.

The exporter traces each module with `export_params=False` and no constant folding: the graph reads every weight
as a graph input named as the module names it, and whatever is computed from weights alone (the transposed
weights of MatMuls, tied embeddings, position tables) is still nodes. Traced with its weights, torch would fold
those nodes all at once in memory and serialise every tensor into the protobuf: three copies of the model at the
peak (NLLB-200-3.3B: 13 GB of weights). Here the weights become initializers whose bytes go to a side file as they
are produced, and the weight-only nodes are folded one by one (ONNX's reference implementation of each operator),
each result written and dropped before the next: the model plus one tensor at a time.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from .meter import Meter
from .weights import MAP_MIN_BYTES, WEIGHTS_ALIGN, Reader, is_external, nbytes, point_to, replace_node

# Smaller tensors stay inside the graph file (store_weights decides again where each tensor lives).
_INLINE_BYTES = MAP_MIN_BYTES


@dataclass
class _Constant:
    array: np.ndarray  # its value: a torch tensor's memory, a small result, or a view of where it was written
    source: Hashable = None  # where a torch weight lies in memory: a weight two graphs read is written once
    written: tuple[int, int] | None = None  # offset and length in the TensorFile


class TensorFile:
    """A side file the bound graphs' large tensors are appended to, aligned (store_weights reads them back)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._file: BinaryIO = open(path, "wb")  # noqa: SIM115 - closed by close()
        self._by_source: dict[Hashable, tuple[int, int]] = {}
        self.on_write: Callable[[int], None] | None = None  # told the bytes of each tensor written

    def write(self, array: np.ndarray, source: Hashable = None) -> tuple[int, int]:
        """Append `array`; returns its offset and length. A `source` written before is not written again."""
        if source is not None and source in self._by_source:
            return self._by_source[source]
        offset = self._file.seek(-(-self._file.tell() // WEIGHTS_ALIGN) * WEIGHTS_ALIGN)
        _contiguous(array).tofile(self._file)
        where = (offset, self._file.tell() - offset)
        if self.on_write is not None:
            self.on_write(where[1])
        if source is not None:
            self._by_source[source] = where
        return where

    def write_parts(self, parts: Iterable[np.ndarray]) -> tuple[int, int]:
        """Append the arrays `parts` back to back (one tensor, written a part at a time); its offset and length."""
        offset = self._file.seek(-(-self._file.tell() // WEIGHTS_ALIGN) * WEIGHTS_ALIGN)
        for part in parts:
            _contiguous(part).tofile(self._file)
            if self.on_write is not None:
                self.on_write(part.nbytes)
        return offset, self._file.tell() - offset

    def view(self, offset: int, array: np.ndarray) -> np.ndarray:
        """What was written at `offset` for `array`, read from the file when used (not held in memory)."""
        self._file.flush()
        return np.memmap(self.path, dtype=array.dtype, mode="r", offset=offset, shape=array.shape)

    def read(self, offset: int, view: np.ndarray) -> np.ndarray:
        """A copy of what was written at `offset` (`view`: its `view`), read with file I/O: a fold reading a result
        through its memory map would leave the pages it touched resident for as long as the map lives, which is
        until the graph is saved (NLLB-600M's decoder: 12 joined q/k/v weights, 151 MB)."""
        self._file.flush()
        return np.fromfile(self.path, dtype=view.dtype, count=view.size, offset=offset).reshape(view.shape)

    def close(self) -> None:
        self._file.close()


def bind_weights(
    path: Path, weights: Mapping[str, Any], out: TensorFile, progress: Callable[[str], None] = lambda _: None
) -> None:
    """Turn the graph file `path`'s inputs named in `weights` (name -> torch tensor) into initializers, fold the
    nodes that read only constants, and save it; its large tensors go to `out`. `progress` is told the bytes
    written so far and the time left."""
    total = sum(int(t.numel()) * t.element_size() for t in weights.values())
    meter = Meter(progress, f"binding the weights of {path.name}", total)
    out.on_write = meter.advance
    try:
        _bind(path, weights, out)
    finally:
        out.on_write = None
    meter.finish()


def _bind(path: Path, weights: Mapping[str, Any], out: TensorFile) -> None:
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(path))
    graph = model.graph
    constants: dict[str, _Constant] = {}
    for value in [i for i in graph.input if i.name in weights]:
        tensor = weights[value.name].detach()
        constants[value.name] = _Constant(tensor.numpy(), _memory_of(tensor))
        graph.input.remove(value)
    for init in graph.initializer:
        constants[init.name] = _Constant(numpy_helper.to_array(init))
    kept = {init.name for init in graph.initializer}
    tie_heads(graph, constants)
    _fold(graph, constants, out)
    used = {name for node in graph.node for name in node.input} | {o.name for o in graph.output}
    for name, constant in constants.items():
        if name in used and name not in kept:
            graph.initializer.append(_initializer(name, constant, out))
    onnx.save(model, str(path))


def _memory_of(tensor: Any) -> Hashable:
    """Where a torch tensor's values lie: the same for a weight the encoder and decoder modules both hold (the
    shared embedding), whatever they call it."""
    storage = tensor.untyped_storage().data_ptr()
    return storage, tensor.storage_offset(), tuple(tensor.shape), tuple(tensor.stride()), str(tensor.dtype)


def tie_heads(graph: Any, constants: Mapping[str, _Constant]) -> None:
    """`MatMul(x, Transpose(W))` on a matrix W that another node also reads (the LM head tied to the embedding)
    becomes `Gemm(x, W, transB=1)`: folded, the Transpose would store the embedding a second time (133 MB for
    opus-mt), and Gemm reads it as it is."""
    from onnx import helper

    producers = {out: node for node in graph.node for out in node.output}
    for node in list(graph.node):
        flip = producers.get(node.input[1]) if node.op_type == "MatMul" else None
        if flip is None or flip.op_type != "Transpose" or flip.input[0] not in constants:
            continue
        weight = flip.input[0]
        perm = next((list(a.ints) for a in flip.attribute if a.name == "perm"), [1, 0])
        if constants[weight].array.ndim != 2 or perm != [1, 0]:
            continue
        if not any(weight in other.input for other in graph.node if other is not flip):
            continue
        gemm = helper.make_node("Gemm", [node.input[0], weight], list(node.output), name=node.name + "_tied", transB=1)
        replace_node(graph, node, [gemm])
        if not any(flip.output[0] in other.input for other in graph.node):
            graph.node.remove(flip)


def _fold(graph: Any, constants: dict[str, _Constant], out: TensorFile) -> None:
    """Evaluate, in graph order, every node whose inputs are all constants, and drop it: its outputs become
    constants, the large ones written to `out` at once. `Constant` nodes are read, and dropped where nothing else
    reads them."""
    from onnx import numpy_helper

    known = dict(constants)
    for node in graph.node:
        if node.op_type == "Constant" and [a.name for a in node.attribute] == ["value"]:
            known[node.output[0]] = _Constant(numpy_helper.to_array(node.attribute[0].t))
    outputs = {o.name for o in graph.output}
    for node in list(graph.node):
        if node.op_type == "Constant" or not node.input or not all(i in known or i == "" for i in node.input):
            continue
        if node.op_type == "Identity" and node.output[0] not in outputs and node.input[0] in constants:
            # A weight read under a second name (tied, or equal to another: torch's exporter joins those): its
            # readers read the first name, one initializer as torch's folding leaves it.
            for reader in graph.node:
                reader.input[:] = [node.input[0] if i == node.output[0] else i for i in reader.input]
        elif node.op_type == "Identity":
            constants[node.output[0]] = known[node.output[0]] = known[node.input[0]]
        else:
            results = _run(node, [_value(known[i], out) if i else None for i in node.input])
            for name, result in zip(node.output, results, strict=True):
                constants[name] = known[name] = _written(result, out)
        graph.node.remove(node)
    used = {name for node in graph.node for name in node.input}
    for node in [n for n in graph.node if n.op_type == "Constant" and n.output[0] not in used]:
        graph.node.remove(node)


def _value(constant: _Constant, out: TensorFile) -> np.ndarray:
    """A constant's values for a fold: a result written to `out` is read back as a copy, dropped after the fold."""
    return out.read(constant.written[0], constant.array) if constant.written is not None else constant.array


def _written(array: np.ndarray, out: TensorFile) -> _Constant:
    """A folded result: kept if small, else written at once and read back only if another fold needs it."""
    if array.nbytes < _INLINE_BYTES:
        return _Constant(array)
    where = out.write(array)
    return _Constant(out.view(where[0], array), written=where)


def _run(node: Any, inputs: list[np.ndarray | None]) -> list[np.ndarray]:
    """`node` evaluated on `inputs` by ONNX's reference implementation."""
    from onnx import helper
    from onnx.reference import ReferenceEvaluator

    names = [f"in{i}" if value is not None else "" for i, value in enumerate(inputs)]
    single = helper.make_node(node.op_type, names, list(node.output), domain=node.domain)
    single.attribute.extend(node.attribute)
    feeds = {name: value for name, value in zip(names, inputs, strict=True) if name}
    return [np.asarray(r) for r in ReferenceEvaluator(single).run(None, feeds)]


def _initializer(name: str, constant: _Constant, out: TensorFile) -> Any:
    from onnx import TensorProto, helper, numpy_helper

    array = constant.array
    if array.nbytes < _INLINE_BYTES:
        return numpy_helper.from_array(_contiguous(array), name)
    data_type = helper.np_dtype_to_tensor_dtype(array.dtype)
    init = TensorProto(name=name, dims=list(array.shape), data_type=data_type)
    if data_type in (TensorProto.INT4, TensorProto.UINT4) and constant.written is None:
        # numpy holds a 4-bit element a byte, ONNX two a byte (GatherBlockQuantized's int4 vocabulary table).
        array = np.frombuffer(numpy_helper.from_array(_contiguous(array), name).raw_data, dtype=np.uint8)
    offset, length = constant.written or out.write(array, constant.source)
    point_to(init, out.path.name, offset, length)
    return init


def _contiguous(array: np.ndarray) -> np.ndarray:
    # Not np.ascontiguousarray, which makes a scalar a 1-element vector.
    return array if array.flags.c_contiguous else array.copy(order="C")


class Tensors:
    """The tensors of graphs loaded without their external data: values read where they lie, when needed, and new
    large tensors appended to `out` instead of held in memory (the quantizer's view of a model of any size)."""

    def __init__(self, reader: Reader, out: TensorFile) -> None:
        self.reader = reader
        self.out = out

    def array(self, tensor: Any) -> np.ndarray:
        return self.reader.array(tensor)

    def make(self, array: np.ndarray, name: str) -> Any:
        """An initializer holding `array`: in the graph if small, else pointing at where it was written."""
        return _initializer(name, _Constant(array), self.out)

    def transposed(self, tensor: Any, name: str) -> Any:
        """An initializer `name` holding the transpose of the 2-D `tensor`, written a block of its rows at a time
        (each block is columns of `tensor`, read through all of it): never the whole matrix in memory."""
        from onnx import TensorProto

        rows, cols = (int(d) for d in tensor.dims)
        if not is_external(tensor) or nbytes(tensor) <= self.reader.BLOCK:
            return self.make(self.array(tensor).T.copy(), name)
        step = max(1, self.reader.BLOCK // (nbytes(tensor) // cols))
        parts = (self.reader.columns(tensor, c, c + step).T for c in range(0, cols, step))
        offset, length = self.out.write_parts(parts)
        init = TensorProto(name=name, dims=[cols, rows], data_type=tensor.data_type)
        point_to(init, self.out.path.name, offset, length)
        return init
