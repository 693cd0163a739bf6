"""How an onnxmt directory stores its weights: one file that ONNX Runtime memory-maps, and the tied LM head in chunks.

- Every tensor of 64 KiB or more sits in `weights.bin` at a 64 KiB-aligned offset, once however many graphs or
  nodes read it, so ONNX Runtime maps it instead of reading it into the heap. A weight that a kernel prepacks (the
  MatMuls) is then read once from the page cache to build the packed copy, and its mapping goes as soon as it is
  packed: loading never holds a weight twice in private memory. Smaller tensors that several graphs hold are stored
  once after them; the rest stay inside the graph files.
- The float tied LM head `Gemm(x, E, transB=1)` is cut into Gemms over row ranges of E, joined by a `Concat`.
  ONNX Runtime prepacks each Gemm at load, reading all of its weight while it writes the packed copy, and it
  prepacks the LM head last (it is the last node). Whole, the head would add all of E (133 MB for opus-mt) to the
  load-time peak on top of everything already packed, and E's mapping stays because the lookups read it. In
  chunks, each chunk's initializer points to its rows of the same bytes of `weights.bin` (nothing is stored twice)
  and is released as soon as that chunk is packed: one chunk is resident beyond the packed copy. The bias `Add`
  after the head goes into the chunks (Gemm's C), so the `Concat` is the only pass over the logits, as the `Add`
  was. `join_heads` undoes the cut: the quantizer works on whole heads.
- The int8 head reads the int8 vocabulary rows E8 through a `Transpose` of a second initializer on the same bytes
  (`DynamicQuantizeMatMul(x, Transpose(E8'))`, as the quantizer writes it). ONNX Runtime folds the `Transpose` at
  load and packs the head's B from the folded copy, which it then frees. Older quantized directories have
  `QGemm(x, E8, transB=1)`, which `transpose_quantized_heads` rewrites the same way: given transB=1, ONNX Runtime
  would transpose into a scratch buffer from its memory arena instead, which the arena keeps (33 MB for opus-mt).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from .meter import Meter

WEIGHTS_ALIGN = 1 << 16  # ONNX Runtime maps external data at offsets aligned to 64 KiB (Windows' granularity)
MAP_MIN_BYTES = 1 << 16  # smaller tensors stay in the graph files, unless several graphs hold them
SHARE_MIN_BYTES = 1 << 12
HEAD_CHUNK_BYTES = 48 << 20  # the LM head is cut into chunks of about this many bytes (more where alignment needs)

_ROWS = ".rows"  # a chunk's nodes, outputs and sliced tensors are named f"{whole}.rows{start}-{stop}"
_JOIN = ".chunks"  # the Concat that joins them: f"{head node}.chunks"


def store_weights(
    paths: list[Path],
    file_name: str,
    locations: dict[str, Path] | None = None,
    progress: Callable[[str], None] = lambda _: None,
) -> bool:
    """Rewrite the graph files `paths` (one directory) so that their large and shared tensors live in `file_name`
    next to them, their tied LM heads in chunks (module docstring). Returns whether `file_name` was written. Running
    it again on its own output stores the same bytes the same way.

    Tensors are read where they are (in the graph files, or in external files next to them: an earlier
    `file_name`, side files, the export's traced weights; `locations` names the files that lie elsewhere, such as
    the source directory's weights a quantized graph still reads) a block at a time, when they are hashed and when
    they are written: the call holds no weight in memory, whatever the model's size. `progress` is told how far
    it is (the weights are read twice, to hash them and to write them) and the time left."""
    import onnx

    directory = paths[0].parent
    models = [onnx.load(str(p), load_external_data=False) for p in paths]
    total = sum(nbytes(init) for model in models for init in model.graph.initializer)
    meter = Meter(progress, f"writing {file_name}", 2 * total)
    reader = Reader(directory, locations, meter.advance)
    # Tensors are told apart by digest, not by their bytes (which would be a second copy of every weight).
    # Where a key's bytes are read from when they are written: an initializer holding them or pointing at them.
    data: dict[_Key, Any] = {}
    try:
        slices = [_cut_heads(model, data, reader) for model in models]
        keys, holders = _tensor_keys(models, slices, data, reader)
        mapped, shared = _placement(holders, slices)
        written = directory / (file_name + ".partial")
        pointed: list[set[str]] = [set() for _ in models]
        if mapped or shared:  # into a new file: the old one may be what is read
            offsets = _write_tensors(written, mapped, shared, data, reader)
            for model, rows, names, done in zip(models, slices, keys, pointed, strict=True):
                done |= _point_initializers(model, file_name, offsets, rows, names)
        for model, done in zip(models, pointed, strict=True):  # what stays in the graph files is read in
            _read_in(model, done, reader)
    finally:
        reader.close()
    meter.finish()
    data.clear()
    for model, path in zip(models, paths, strict=True):
        onnx.save(model, str(path))
    if not mapped and not shared:
        return False
    written.replace(directory / file_name)
    return True


class Reader:
    """The bytes of initializers, from the graph (raw_data) or from the external file they point to, in blocks."""

    BLOCK = 64 << 20

    def __init__(
        self, directory: Path, locations: dict[str, Path] | None = None, on_read: Callable[[int], None] | None = None
    ) -> None:
        """`on_read(n)` is told the bytes of each block read."""
        self.directory = directory
        self.locations = locations or {}
        self._on_read = on_read
        self._files: dict[str, Any] = {}

    def path(self, location: str) -> Path:
        return self.locations.get(location, self.directory / location)

    def blocks(self, tensor: Any) -> Iterator[bytes]:
        if not is_external(tensor):
            if self._on_read is not None:
                self._on_read(len(tensor.raw_data))
            yield tensor.raw_data
            return
        location, offset, length = _external(tensor)
        if location not in self._files:
            self._files[location] = open(self.path(location), "rb")  # noqa: SIM115 - closed by close()
        f = self._files[location]
        f.seek(offset)
        while length > 0:
            block = f.read(min(self.BLOCK, length))
            if not block:
                raise ValueError(f"{self.path(location)}: ends before the tensor {tensor.name!r} does")
            length -= len(block)
            if self._on_read is not None:
                self._on_read(len(block))
            yield block

    def key(self, tensor: Any) -> _Key:
        digest, size = hashlib.sha256(), 0
        for block in self.blocks(tensor):
            digest.update(block)
            size += len(block)
        return tensor.data_type, digest.digest(), size

    def raw(self, tensor: Any) -> bytes:
        return b"".join(self.blocks(tensor))

    def array(self, tensor: Any) -> np.ndarray:
        """A tensor's value, read from its file when external."""
        from onnx import numpy_helper

        if not is_external(tensor):
            return numpy_helper.to_array(tensor)
        return self._read_into(np.empty(tuple(tensor.dims), _dtype(tensor)), tensor)

    def rows(self, tensor: Any, start: int, stop: int) -> np.ndarray:
        """Rows `start:stop` of a tensor (along its first axis), read alone: a 2 GB vocabulary table is never
        whole in memory."""
        from onnx import numpy_helper

        if not is_external(tensor):
            return numpy_helper.to_array(tensor)[start:stop]
        dims = tuple(tensor.dims)
        stop = min(stop, dims[0])
        array = np.empty((stop - start, *dims[1:]), _dtype(tensor))
        row_bytes = math.prod(dims[1:]) * array.itemsize
        location, offset, _ = _external(tensor)
        return self._read_into(array, onnx_external_view(tensor, location, offset + start * row_bytes, array.nbytes))

    def columns(self, tensor: Any, start: int, stop: int) -> np.ndarray:
        """Columns `start:stop` of a 2-D tensor, read a block of rows at a time (strided: every row is read)."""
        rows, cols = (int(d) for d in tensor.dims)
        step = max(1, self.BLOCK // (cols * _dtype(tensor).itemsize))
        # Each part copied out of its block (a view would keep the whole block, and so the whole tensor, alive).
        parts = [self.rows(tensor, r, r + step)[:, start:stop].copy() for r in range(0, rows, step)]
        return np.concatenate(parts) if len(parts) > 1 else parts[0]

    def _read_into(self, array: np.ndarray, tensor: Any) -> np.ndarray:
        """`array` filled with the external `tensor`'s bytes, block by block (no second copy)."""
        target, filled = array.reshape(-1).view(np.uint8), 0
        for block in self.blocks(tensor):
            target[filled : filled + len(block)] = np.frombuffer(block, np.uint8)
            filled += len(block)
        if filled != array.nbytes:
            raise ValueError(f"tensor {tensor.name!r}: {filled} bytes stored, {array.nbytes} expected")
        return array

    def close(self) -> None:
        for f in self._files.values():
            f.close()
        self._files.clear()


def _dtype(tensor: Any) -> np.dtype:
    from onnx import helper

    return np.dtype(helper.tensor_dtype_to_np_dtype(tensor.data_type))


def is_external(tensor: Any) -> bool:
    from onnx import TensorProto

    return bool(tensor.data_location == TensorProto.EXTERNAL)


def _external(tensor: Any) -> tuple[str, int, int]:
    """An external tensor's file, offset and length."""
    entries = {e.key: e.value for e in tensor.external_data}
    length = int(entries["length"]) if "length" in entries else math.prod(tensor.dims) * _dtype(tensor).itemsize
    return entries["location"], int(entries.get("offset", 0)), length


def nbytes(tensor: Any) -> int:
    """The bytes of a tensor's data, wherever they are."""
    return _external(tensor)[2] if is_external(tensor) else len(tensor.raw_data)


def _read_in(model: Any, pointed: set[str], reader: Reader) -> None:
    """External initializers not `pointed` at the new weights file (small tensors left in the graph) get their
    bytes, from wherever they were."""
    for init in model.graph.initializer:
        if is_external(init) and init.name not in pointed:
            raw = reader.raw(init)
            init.data_location = 0
            del init.external_data[:]
            init.raw_data = raw


def _cut_heads(model: Any, data: dict[_Key, Any], reader: Reader) -> dict[str, tuple[_Key, int]]:
    """Cut the heads of `model` into chunks again, with today's chunk size (a directory stored before has them cut
    already), and return its chunk tensors: name -> (the whole tensor's key, offset of its rows in it). The chunks
    point into the whole tensor, stored however small, even where no initializer holds it any more: a copy of its
    initializer (a reference, where it is external) is kept in `data`."""
    join_heads(model)
    transpose_quantized_heads(model)
    cut = chunk_heads(model, read=reader.array)
    inits = {init.name: init for init in model.graph.initializer}  # with the biases chunk_heads made
    wholes: dict[str, _Key] = {}
    for whole in sorted({whole for whole, _ in cut.values()}):
        wholes[whole] = reader.key(inits[whole])
        kept = type(inits[whole])()
        kept.CopyFrom(inits[whole])
        data.setdefault(wholes[whole], kept)  # kept: the cut may leave no initializer holding it
    rows = {name: (wholes[whole], start) for name, (whole, start) in cut.items()}
    _drop_unused(model.graph)
    kept = {init.name for init in model.graph.initializer}
    return {name: where for name, where in rows.items() if name in kept}


def _tensor_keys(
    models: list[Any], slices: list[dict[str, tuple[_Key, int]]], data: dict[_Key, Any], reader: Reader
) -> tuple[list[dict[str, _Key]], dict[_Key, int]]:
    """Per graph, each initializer that is not a chunk -> its key; and per key, how many initializers over all
    graphs hold those bytes (0 for a whole tensor only chunks point into). Each key's first holder goes into
    `data`."""
    holders: dict[_Key, int] = {}
    keys: list[dict[str, _Key]] = []
    for model, rows in zip(models, slices, strict=True):
        names: dict[str, _Key] = {}
        for init in model.graph.initializer:
            if init.name in rows:
                continue
            if nbytes(init):
                key = names[init.name] = reader.key(init)
                holders[key] = holders.get(key, 0) + 1
                data.setdefault(key, init)
        keys.append(names)
    for rows in slices:
        for key, _ in rows.values():
            holders.setdefault(key, 0)
    return keys, holders


def _placement(holders: dict[_Key, int], slices: list[dict[str, tuple[_Key, int]]]) -> tuple[list[_Key], list[_Key]]:
    """The tensors the weights file holds: those memory-mapped (MAP_MIN_BYTES or more, aligned), and the smaller
    ones stored once for several holders (SHARE_MIN_BYTES or more) or for chunks to point into."""
    wholes = {key for rows in slices for key, _ in rows.values()}
    mapped = [k for k in holders if k[2] >= MAP_MIN_BYTES]
    shared = [
        k for k, n in holders.items() if k[2] < MAP_MIN_BYTES and (k in wholes or (k[2] >= SHARE_MIN_BYTES and n > 1))
    ]
    return mapped, shared


def _write_tensors(
    path: Path, mapped: list[_Key], shared: list[_Key], data: dict[_Key, Any], reader: Reader
) -> dict[_Key, int]:
    """Write the weights file: the mapped tensors largest first at aligned offsets, then the shared ones packed.
    Returns each tensor's offset. The order depends on the tensors alone (size, then digest), not on their names or
    the order the graphs list them in."""
    offsets: dict[_Key, int] = {}
    with open(path, "wb") as f:
        for key in sorted(mapped, key=lambda k: (-k[2], k[1])):
            offsets[key] = f.seek(-(-f.tell() // WEIGHTS_ALIGN) * WEIGHTS_ALIGN)
            for block in reader.blocks(data[key]):
                f.write(block)
        for key in sorted(shared, key=lambda k: (-k[2], k[1])):  # packed, unaligned: ONNX Runtime reads these
            offsets[key] = f.tell()
            for block in reader.blocks(data[key]):
                f.write(block)
    return offsets


def _point_initializers(
    model: Any,
    file_name: str,
    offsets: dict[_Key, int],
    rows: dict[str, tuple[_Key, int]],
    names: dict[str, _Key],
) -> set[str]:
    """Point the chunks of `model` at their rows of the whole tensor in `file_name`, and its other initializers
    whose bytes were written there at those bytes. Returns their names."""
    pointed = set()
    for init in model.graph.initializer:
        if init.name in rows:
            whole_key, start = rows[init.name]
            point_to(init, file_name, offsets[whole_key] + start, nbytes(init))
            pointed.add(init.name)
        elif init.name in names and names[init.name] in offsets:
            key = names[init.name]
            point_to(init, file_name, offsets[key], key[2])
            pointed.add(init.name)
    return pointed


def chunk_heads(
    model: Any, chunk_bytes: int | None = None, read: Callable[[Any], np.ndarray] | None = None
) -> dict[str, tuple[str, int]]:
    """Cut each `Gemm` with transB=1 on a weight of more than `chunk_bytes` into Gemms over row ranges of
    it, joined by a `Concat` with the original output. Returns the new sliced tensors: name -> (the tensor it is
    rows of, byte offset of its first row in it)."""
    limit = chunk_bytes or HEAD_CHUNK_BYTES
    graph = model.graph
    inits = {init.name: init for init in graph.initializer}
    slices: dict[str, tuple[str, int]] = {}
    fed = {i.name for i in graph.input}  # initializers a caller may override: left alone
    for node in list(graph.node):
        layout = _head_layout(node)
        weight = inits.get(node.input[layout[0]]) if layout else None
        if layout is None or weight is None or len(weight.dims) != 2 or weight.name in fed:
            continue
        _as_raw(node, layout, inits)  # slicing works on raw bytes
        rows = weight.dims[0]
        step = _chunk_rows(rows, nbytes(weight), limit)
        if step is None:
            continue
        if any(not _per_row(inits.get(node.input[i]), rows) for i in layout[1:]):
            continue  # a companion that is neither one value nor one per row could not be cut with the rows
        _cut_head(graph, node, layout, rows, step, inits, slices, read)
    return slices


def _as_raw(node: Any, layout: tuple[int, ...], inits: dict[str, Any]) -> None:
    """The head's weight and companions with their values in raw_data (tensors held as typed fields converted)."""
    from onnx import TensorProto, numpy_helper

    for i in layout:
        tensor = inits.get(node.input[i])
        if tensor is not None and not tensor.raw_data and tensor.data_location != TensorProto.EXTERNAL:
            tensor.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(tensor), tensor.name))


def _chunk_rows(rows: int, size: int, limit: int) -> int | None:
    """Rows per chunk of a head of `rows` rows and `size` bytes cut into chunks of about `limit` bytes, or None
    where it stays whole."""
    count = -(-size // limit)
    if count < 2 or rows < count:
        return None
    step = -(-rows // count)
    align_rows = WEIGHTS_ALIGN // math.gcd(WEIGHTS_ALIGN, size // rows)
    aligned = -(-step // align_rows) * align_rows
    return aligned if aligned < rows else step  # aligned chunks can be memory-mapped; tiny heads cannot


def _cut_head(
    graph: Any,
    node: Any,
    layout: tuple[int, ...],
    rows: int,
    step: int,
    inits: dict[str, Any],
    slices: dict[str, tuple[str, int]],
    read: Callable[[Any], np.ndarray] | None,
) -> None:
    """Replace the head `node` by Gemms over `step` rows at a time of its weight (and per-row companions), joined
    by a `Concat`; the chunk tensors it makes are added to `slices`."""
    from onnx import helper

    whole_inputs, output, absorbed = list(node.input), node.output[0], []
    beta = next((a.f for a in node.attribute if a.name == "beta"), 1.0)  # Gemm scales C by beta
    add = bias_add(graph, node, rows, inits, read) if len(node.input) == 2 and beta == 1.0 else None
    if add is not None:  # Gemm adds the bias in its output pass: the chunks cost no extra pass over the logits
        whole_inputs.append(add[1])
        layout = (*layout, 2)
        output, absorbed = add[0].output[0], [add[0]]
    cut = {i for i in layout if whole_inputs[i] in inits and nbytes(inits[whole_inputs[i]])}
    heads = []
    for start in range(0, rows, step):
        stop = min(rows, start + step)
        inputs = list(whole_inputs)
        for i in layout:
            tensor = inits.get(inputs[i])
            if tensor is not None and i in cut and tensor.dims and tensor.dims[0] == rows:
                # per-row scales, zero points, biases too
                inputs[i] = _rows_of(graph, inits, slices, tensor, start, stop)
        tag = f"{_ROWS}{start}-{stop}"
        head = helper.make_node(node.op_type, inputs, [output + tag], name=node.name + tag)
        head.domain = node.domain
        head.attribute.extend(node.attribute)
        heads.append(head)
    join = helper.make_node("Concat", [h.output[0] for h in heads], [output], name=node.name + _JOIN, axis=1)
    replace_node(graph, node, [*heads, join])
    for extra in absorbed:
        graph.node.remove(extra)


def _rows_of(
    graph: Any,
    inits: dict[str, Any],
    slices: dict[str, tuple[str, int]],
    tensor: Any,
    start: int,
    stop: int,
) -> str:
    """The name of an initializer holding rows start:stop of `tensor` (a reference to them where `tensor` is
    external), made and recorded in `slices` the first time."""
    from onnx import TensorProto

    name = f"{tensor.name}{_ROWS}{start}-{stop}"
    if name not in inits:
        row_bytes = nbytes(tensor) // tensor.dims[0]
        part = TensorProto(name=name, data_type=tensor.data_type, dims=[stop - start, *tensor.dims[1:]])
        if is_external(tensor):
            location, offset, _ = _external(tensor)
            point_to(part, location, offset + start * row_bytes, (stop - start) * row_bytes)
        else:
            part.raw_data = tensor.raw_data[start * row_bytes : stop * row_bytes]
        graph.initializer.append(part)
        inits[name] = part
        slices[name] = (tensor.name, start * row_bytes)
    return name


def join_heads(model: Any) -> int:
    """Undo `chunk_heads`: each chunked head becomes one node again, reading the whole tensors its chunks were rows
    of (the existing initializer where one holds exactly those rows). Returns the number of heads joined."""
    from onnx import TensorProto, helper

    graph = model.graph
    producers = {out: node for node in graph.node for out in node.output}
    inits = {init.name: init for init in graph.initializer}
    joined = 0
    for join in [n for n in graph.node if n.op_type == "Concat" and n.name.endswith(_JOIN)]:
        base = join.name[: -len(_JOIN)]
        heads = [producers[name] for name in join.input if name in producers]
        if not heads or len(heads) != len(join.input) or any(not h.name.startswith(base + _ROWS) for h in heads):
            continue
        first = heads[0]
        inputs = list(first.input)
        for i, name in enumerate(first.input):
            if _ROWS not in name or name not in inits:
                continue
            whole = name.rsplit(_ROWS, 1)[0]
            parts = [inits[h.input[i]] for h in heads]
            joined_part = TensorProto(data_type=parts[0].data_type, dims=[sum(p.dims[0] for p in parts)])
            joined_part.dims.extend(parts[0].dims[1:])
            _join_data(joined_part, parts)
            existing = inits.get(whole)
            if existing is None or not _same_data(existing, joined_part):
                while whole in inits:
                    whole += "_"
                existing = joined_part
                existing.name = whole
                graph.initializer.append(existing)
                inits[whole] = existing
            inputs[i] = whole
        head = helper.make_node(first.op_type, inputs, list(join.output), name=base)
        head.domain = first.domain
        head.attribute.extend(first.attribute)
        replace_node(graph, join, [head])
        for h in heads:
            graph.node.remove(h)
        joined += 1
    if joined:
        _drop_unused(graph)
    return joined


def _join_data(tensor: Any, parts: list[Any]) -> None:
    """Give `tensor` the bytes of `parts` one after another: a reference where they lie end to end in one file
    (chunks of a stored head), else the bytes themselves."""
    if all(is_external(p) for p in parts):
        spans = [_external(p) for p in parts]
        ends = [offset + length for _, offset, length in spans]
        if all(s[0] == spans[0][0] for s in spans) and all(s[1] == e for s, e in zip(spans[1:], ends, strict=False)):
            point_to(tensor, spans[0][0], spans[0][1], ends[-1] - spans[0][1])
            return
    if any(is_external(p) for p in parts):
        raise ValueError(f"the chunks of {parts[0].name!r} are not stored end to end; cannot join them")
    tensor.raw_data = b"".join(p.raw_data for p in parts)


def _same_data(a: Any, b: Any) -> bool:
    if a.data_type != b.data_type or list(a.dims) != list(b.dims) or is_external(a) != is_external(b):
        return False
    return _external(a) == _external(b) if is_external(a) else a.raw_data == b.raw_data


def twin_transpose(graph: Any, inits: dict[str, Any], weight: str, name: str) -> Any:
    """A `Transpose` node (not yet in `graph`) of a second initializer holding `weight`'s bytes, named `name` (made
    unique), which it adds to `graph` and `inits`. ONNX Runtime folds the `Transpose` at load, and the twin's mapping
    goes once folded, while `weight`'s stays with only the rows its other readers touch; stored once
    (`store_weights` keeps identical tensors once)."""
    from onnx import helper

    twin = type(inits[weight])()
    twin.CopyFrom(inits[weight])
    twin.name = name
    while twin.name in inits:
        twin.name += "_"
    graph.initializer.append(twin)
    inits[twin.name] = twin
    return helper.make_node("Transpose", [twin.name], [twin.name + ".T"], name=twin.name + ".T", perm=[1, 0])


def transpose_quantized_heads(model: Any) -> int:
    """Each `QGemm` with transB=1 on a constant B reads `Transpose(B')` with transB=0 instead, B' a second
    initializer holding B's bytes (stored once: `store_weights` keeps identical tensors once). Returns the count."""
    graph = model.graph
    inits = {init.name: init for init in graph.initializer}
    done = 0
    for node in list(graph.node):
        transposed = any(a.name == "transB" and a.i == 1 for a in node.attribute)
        if node.op_type != "QGemm" or node.domain != "com.microsoft" or not transposed or node.input[3] not in inits:
            continue
        flip = twin_transpose(graph, inits, node.input[3], f"{node.name}.weight")
        node.input[3] = flip.output[0]
        kept = [a for a in node.attribute if a.name != "transB"]
        del node.attribute[:]
        node.attribute.extend(kept)
        graph.node.insert(list(graph.node).index(node), flip)
        done += 1
    return done


def _per_row(tensor: Any, rows: int) -> bool:
    """One value for all rows, or one per row (a vector of `rows` values)."""
    size = math.prod(tensor.dims) if tensor is not None else 0
    return tensor is not None and (size == 1 or list(tensor.dims) == [rows])


def bias_add(
    graph: Any, gemm: Any, rows: int, inits: dict[str, Any], read: Callable[[Any], np.ndarray] | None = None
) -> tuple[Any, str] | None:
    """The `Add` of a constant bias of one value per row of B (per logit) that alone reads `gemm`'s output, and the
    bias as an initializer (made from a `Constant` node where the exporter left one), or None."""
    from onnx import helper, numpy_helper

    readers = [n for n in graph.node if gemm.output[0] in n.input]
    if len(readers) != 1 or readers[0].op_type != "Add" or gemm.output[0] in {o.name for o in graph.output}:
        return None
    add = readers[0]
    other = add.input[1] if add.input[0] == gemm.output[0] else add.input[0]
    if other in inits:  # `read`: where the graph was loaded without its external data
        value = (read or numpy_helper.to_array)(inits[other])
    else:
        constant = next((n for n in graph.node if n.op_type == "Constant" and n.output[0] == other), None)
        if constant is None or [a.name for a in constant.attribute] != ["value"]:
            return None
        value = numpy_helper.to_array(constant.attribute[0].t)
    dtype = helper.tensor_dtype_to_np_dtype(inits[gemm.input[1]].data_type)
    if value.dtype != dtype or value.shape not in ((rows,), (1, rows)):  # a higher rank would change the output's
        return None
    name = f"{gemm.name}.bias"
    while name in inits:
        name += "_"
    bias = numpy_helper.from_array(value.reshape(rows), name)
    graph.initializer.append(bias)
    inits[name] = bias
    return add, name


def _head_layout(node: Any) -> tuple[int, ...] | None:
    """Input indices of a transB=1 head's weight and of its per-row companions (weight first), or None."""
    transposed = any(a.name == "transB" and a.i == 1 for a in node.attribute)
    if not transposed:
        return None
    if node.op_type == "Gemm" and node.domain in ("", "ai.onnx") and len(node.input) in (2, 3):
        return (1, 2)[: len(node.input) - 1]  # B, and C when there is one
    return None


def replace_node(graph: Any, node: Any, new: list[Any]) -> None:
    """Put the nodes `new` where `node` is in `graph` (order matters to readers of the file), removing `node`."""
    index = list(graph.node).index(node)
    graph.node.remove(node)
    for offset, item in enumerate(new):
        graph.node.insert(index + offset, item)


def _drop_unused(graph: Any) -> None:
    """Remove the initializers (and Constant nodes) nothing reads: no node, subgraph or graph output; initializers
    listed as graph inputs stay (a caller may feed them)."""
    used = _read_names(graph) | {o.name for o in graph.output} | {i.name for i in graph.input}
    for node in [n for n in graph.node if n.op_type == "Constant" and n.output[0] not in used]:
        graph.node.remove(node)
    for init in [i for i in graph.initializer if i.name not in used]:
        graph.initializer.remove(init)


def _read_names(graph: Any) -> set[str]:
    from onnx import AttributeProto

    names = {name for node in graph.node for name in node.input}
    for node in graph.node:
        for attr in node.attribute:
            if attr.type == AttributeProto.GRAPH:
                names |= _read_names(attr.g)
            elif attr.type == AttributeProto.GRAPHS:
                for sub in attr.graphs:
                    names |= _read_names(sub)
    return names


_Key = tuple[int, bytes, int]  # a tensor's data type, the sha256 of its bytes, their length


def onnx_external_view(tensor: Any, location: str, offset: int, length: int) -> Any:
    """A tensor of the same name and type whose external data are `length` bytes at `offset` of `location` (a
    slice of `tensor`'s, for reading part of it)."""
    import onnx

    part = onnx.TensorProto(name=tensor.name, data_type=tensor.data_type)
    point_to(part, location, offset, length)
    return part


def rename_weights_file(paths: list[Path], old: str, new: str) -> None:
    """Rename the weights file `old` next to the graph files `paths` to `new`, and point their tensors at it (the
    bytes stay where they are: no copy)."""
    import onnx

    directory = paths[0].parent
    for path in paths:
        model = onnx.load(str(path), load_external_data=False)
        for tensor in model.graph.initializer:
            if is_external(tensor) and _external(tensor)[0] == old:
                point_to(tensor, new, *_external(tensor)[1:])
        onnx.save(model, str(path))
    (directory / old).replace(directory / new)


def point_to(tensor: Any, location: str, offset: int, length: int) -> None:
    """Make `tensor` an external one, its bytes at `offset` in the file `location` (relative to its graph's)."""
    import onnx

    tensor.ClearField("raw_data")
    tensor.data_location = onnx.TensorProto.EXTERNAL
    del tensor.external_data[:]
    for key, value in (("location", location), ("offset", str(offset)), ("length", str(length))):
        entry = tensor.external_data.add()
        entry.key, entry.value = key, value
