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
from pathlib import Path
from typing import Any

WEIGHTS_ALIGN = 1 << 16  # ONNX Runtime maps external data at offsets aligned to 64 KiB (Windows' granularity)
MAP_MIN_BYTES = 1 << 16  # smaller tensors stay in the graph files, unless several graphs hold them
SHARE_MIN_BYTES = 1 << 12
HEAD_CHUNK_BYTES = 48 << 20  # the LM head is cut into chunks of about this many bytes (more where alignment needs)

# A graph whose tensors hold more than this is saved with them in a side file `<graph file>.data` (ONNX external
# data), which store_weights reads in and removes: protobuf cannot write a message over 2 GB, and the graphs of
# NLLB-200-1.3B or M2M100-1.2B are larger than that before their weights move to `weights.bin`.
LARGE_GRAPH_BYTES = 1 << 30
SIDE_DATA_SUFFIX = ".data"
_ROWS = ".rows"  # a chunk's nodes, outputs and sliced tensors are named f"{whole}.rows{start}-{stop}"
_JOIN = ".chunks"  # the Concat that joins them: f"{head node}.chunks"


def too_large(model: Any) -> bool:
    """Whether the tensors a loaded graph holds in memory (not those it leaves in external files) pass
    LARGE_GRAPH_BYTES, so that it must be saved with them in a side file."""
    return sum(len(init.raw_data) for init in model.graph.initializer) > LARGE_GRAPH_BYTES


def side_file(path: Path) -> Path:
    """Where `save_graph` puts the tensors of the graph file `path` that is too large."""
    return path.with_name(path.name + SIDE_DATA_SUFFIX)


def save_graph(model: Any, path: Path) -> None:
    """`onnx.save`, with the tensors in `<path>.data` when they hold more than LARGE_GRAPH_BYTES (see there)."""
    import onnx

    if not too_large(model):
        onnx.save(model, str(path))
        return
    side = side_file(path)
    side.unlink(missing_ok=True)  # onnx appends to an existing file
    onnx.save(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True, location=side.name)


def store_weights(paths: list[Path], file_name: str) -> bool:
    """Rewrite the graph files `paths` (one directory) so that their large and shared tensors live in `file_name`
    next to them, their tied LM heads in chunks (module docstring). Returns whether `file_name` was written. Running
    it again on its own output stores the same bytes the same way."""
    import onnx

    models = [onnx.load(str(p)) for p in paths]  # any external data is read in: the file can be rewritten
    # Tensors are told apart by digest, not by their bytes: protobuf copies `raw_data` on every read, and keys holding
    # the bytes would keep a second copy of every weight (2.4 GB for NLLB-200-600M) for the whole call.
    # Where a key's bytes are read from when they are written: an initializer holding them, or the bytes themselves.
    data: dict[_Key, Any] = {}
    slices = [_cut_heads(model, data) for model in models]
    keys, holders = _tensor_keys(models, slices, data)
    mapped, shared = _placement(holders, slices)
    if not mapped and not shared:
        for model, path in zip(models, paths, strict=True):
            onnx.save(model, str(path))
            side_file(path).unlink(missing_ok=True)
        return False
    offsets = _write_tensors(paths[0].parent / file_name, mapped, shared, data)
    data.clear()
    for model, path, rows, names in zip(models, paths, slices, keys, strict=True):
        _point_initializers(model, file_name, offsets, rows, names)
        onnx.save(model, str(path))
        side_file(path).unlink(missing_ok=True)  # read in above, now in file_name
    return True


def _cut_heads(model: Any, data: dict[_Key, Any]) -> dict[str, tuple[_Key, int]]:
    """Cut the heads of `model` into chunks again, with today's chunk size (a directory stored before has them cut
    already), and return its chunk tensors: name -> (the whole tensor's key, offset of its rows in it). The chunks
    point into the whole tensor, stored however small, even where no initializer holds it any more: its bytes are
    kept in `data`."""
    join_heads(model)
    transpose_quantized_heads(model)
    cut = chunk_heads(model)
    inits = {init.name: init for init in model.graph.initializer}  # with the biases chunk_heads made
    wholes: dict[str, _Key] = {}
    for whole in {whole for whole, _ in cut.values()}:
        raw = inits[whole].raw_data
        wholes[whole] = _key(inits[whole].data_type, raw)
        data.setdefault(wholes[whole], raw)  # kept: the cut may leave no initializer holding it
    rows = {name: (wholes[whole], start) for name, (whole, start) in cut.items()}
    _drop_unused(model.graph)
    kept = {init.name for init in model.graph.initializer}
    return {name: where for name, where in rows.items() if name in kept}


def _tensor_keys(
    models: list[Any], slices: list[dict[str, tuple[_Key, int]]], data: dict[_Key, Any]
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
            raw = init.raw_data
            if raw:
                key = names[init.name] = _key(init.data_type, raw)
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


def _write_tensors(path: Path, mapped: list[_Key], shared: list[_Key], data: dict[_Key, Any]) -> dict[_Key, int]:
    """Write the weights file: the mapped tensors largest first at aligned offsets, then the shared ones packed.
    Returns each tensor's offset."""

    def raw_of(key: _Key) -> bytes:
        held = data[key]
        return held if isinstance(held, bytes) else held.raw_data

    offsets: dict[_Key, int] = {}
    with open(path, "wb") as f:
        for key in sorted(mapped, key=lambda k: -k[2]):
            offsets[key] = f.seek(-(-f.tell() // WEIGHTS_ALIGN) * WEIGHTS_ALIGN)
            f.write(raw_of(key))
        for key in shared:  # packed, unaligned: ONNX Runtime reads these
            offsets[key] = f.tell()
            f.write(raw_of(key))
    return offsets


def _point_initializers(
    model: Any,
    file_name: str,
    offsets: dict[_Key, int],
    rows: dict[str, tuple[_Key, int]],
    names: dict[str, _Key],
) -> None:
    """Point the chunks of `model` at their rows of the whole tensor in `file_name`, and its other initializers
    whose bytes were written there at those bytes."""
    for init in model.graph.initializer:
        if init.name in rows:
            whole_key, start = rows[init.name]
            _point_to(init, file_name, offsets[whole_key] + start, len(init.raw_data))
        elif init.name in names and names[init.name] in offsets:
            key = names[init.name]
            _point_to(init, file_name, offsets[key], key[2])


def chunk_heads(model: Any, chunk_bytes: int | None = None) -> dict[str, tuple[str, int]]:
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
        step = _chunk_rows(rows, len(weight.raw_data), limit)
        if step is None:
            continue
        if any(not _per_row(inits.get(node.input[i]), rows) for i in layout[1:]):
            continue  # a companion that is neither one value nor one per row could not be cut with the rows
        _cut_head(graph, node, layout, rows, step, inits, slices)
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
) -> None:
    """Replace the head `node` by Gemms over `step` rows at a time of its weight (and per-row companions), joined
    by a `Concat`; the chunk tensors it makes are added to `slices`."""
    from onnx import helper

    whole_inputs, output, absorbed = list(node.input), node.output[0], []
    beta = next((a.f for a in node.attribute if a.name == "beta"), 1.0)  # Gemm scales C by beta
    add = bias_add(graph, node, rows, inits) if len(node.input) == 2 and beta == 1.0 else None
    if add is not None:  # Gemm adds the bias in its output pass: the chunks cost no extra pass over the logits
        whole_inputs.append(add[1])
        layout = (*layout, 2)
        output, absorbed = add[0].output[0], [add[0]]
    # protobuf copies raw_data on every read (1 GB for NLLB-200's head): each tensor is read once.
    raws = {i: inits[whole_inputs[i]].raw_data for i in layout if whole_inputs[i] in inits}
    heads = []
    for start in range(0, rows, step):
        stop = min(rows, start + step)
        inputs = list(whole_inputs)
        for i in layout:
            tensor = inits.get(inputs[i])
            if tensor is not None and raws.get(i) and tensor.dims and tensor.dims[0] == rows:
                # per-row scales, zero points, biases too
                inputs[i] = _rows_of(graph, inits, slices, tensor, raws[i], start, stop)
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
    raw: bytes,
    start: int,
    stop: int,
) -> str:
    """The name of an initializer holding rows start:stop of `tensor` (whose bytes are `raw`), made and recorded
    in `slices` the first time."""
    from onnx import TensorProto

    name = f"{tensor.name}{_ROWS}{start}-{stop}"
    if name not in inits:
        row_bytes = len(raw) // tensor.dims[0]
        part = TensorProto(name=name, data_type=tensor.data_type, dims=[stop - start, *tensor.dims[1:]])
        part.raw_data = raw[start * row_bytes : stop * row_bytes]
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
            data = b"".join(p.raw_data for p in parts)
            existing = inits.get(whole)
            if existing is None or existing.raw_data != data or existing.data_type != parts[0].data_type:
                while whole in inits:
                    whole += "_"
                rows = sum(p.dims[0] for p in parts)
                existing = TensorProto(name=whole, data_type=parts[0].data_type, dims=[rows, *parts[0].dims[1:]])
                existing.raw_data = data
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


def bias_add(graph: Any, gemm: Any, rows: int, inits: dict[str, Any]) -> tuple[Any, str] | None:
    """The `Add` of a constant bias of one value per row of B (per logit) that alone reads `gemm`'s output, and the
    bias as an initializer (made from a `Constant` node where the exporter left one), or None."""
    from onnx import helper, numpy_helper

    readers = [n for n in graph.node if gemm.output[0] in n.input]
    if len(readers) != 1 or readers[0].op_type != "Add" or gemm.output[0] in {o.name for o in graph.output}:
        return None
    add = readers[0]
    other = add.input[1] if add.input[0] == gemm.output[0] else add.input[0]
    if other in inits:
        value = numpy_helper.to_array(inits[other])
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


def _key(data_type: int, raw: bytes) -> _Key:
    return data_type, hashlib.sha256(raw).digest(), len(raw)


def _point_to(tensor: Any, location: str, offset: int, length: int) -> None:
    import onnx

    tensor.ClearField("raw_data")
    tensor.data_location = onnx.TensorProto.EXTERNAL
    del tensor.external_data[:]
    for key, value in (("location", location), ("offset", str(offset)), ("length", str(length))):
        entry = tensor.external_data.add()
        entry.key, entry.value = key, value
