"""`onnxmt quantize`: an exported model directory to a new, smaller one (int8 dynamic or int4 weight-only).

Needs `onnx` and `onnxruntime` only, never torch. The graphs are rewritten by ONNX Runtime's own quantizers
(`quantize_dynamic`, `MatMulNBitsQuantizer`); this module picks the nodes, protects the tied LM head, and writes a
complete directory whose manifest records what was done. The source directory is only read.

The tied LM head is the one trap. The decoder's logits are `Gemm(x, embedding, transB=1)` reading the same
initializer as the token-embedding `Gather` (one copy on disk). ONNX Runtime's dynamic quantizer handles MatMul,
not Gemm, and untying the head into a MatMul on a transposed copy stores the vocabulary matrix twice in int8 (33 MB
each for opus-mt). So in int8 the vocabulary tables are quantized here, not by `quantize_dynamic`: one row-major
int8 matrix with a scale per row (per vocabulary entry), read by the lookups as contiguous rows (`Gather` + scale)
and by the head as `DynamicQuantizeMatMul` on its transpose, whose per-row scales are exactly per-output-channel
scales (the transpose is a `Transpose` that ONNX Runtime folds at load: export/weights.py), with the logits' bias
in the kernel's epilogue. Measured on the opus-mt architecture: same speed as the untied MatMul head, 33 MB less on
disk (docs/performance.md). A Gemm that stays float keeps sharing the float embedding, and the Gathers on it stay
float too: quantizing them would only add a second copy. int4 (MatMulNBits) unties the head into a MatMul.
"""

from __future__ import annotations

import difflib
import logging
import shutil
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

from ..extras import missing_extra
from ..manifest import WEIGHTS_FILE, Manifest, describe_files, read_manifest, verify_files
from ..options import option
from .binding import TensorFile, Tensors
from .groups import Quantizer, groups, quantize_in_groups
from .row_scales import per_row_activations
from .staging import occupied, staged
from .weights import Reader, bias_add, join_heads, nbytes, replace_node, store_weights, twin_transpose

PARTS = ("encoder", "decoder", "all")
LM_HEAD = "lm_head"  # an --exclude name for the tied LM head, whatever the exporter called its node
OP_TYPES = ("MatMul", "Gemm", "Gather")
# Element types of quantized weights: int8, uint8, int4, uint4.
_QUANTIZED_DTYPES = {2, 3, 21, 22}

Progress = Callable[[str], None]

_TABLE_BLOCK_ROWS = 8192  # rows of a vocabulary table quantized at a time
_SPLIT_BYTES = 128 << 20  # int4: a weight larger than this is quantized a slice of this size at a time (groups.py)

# The quantized weights as they are made; store_weights copies them into WEIGHTS_FILE.
QUANTIZED_WEIGHTS_FILE = "quantized-weights.bin"


class QuantizeError(ValueError):
    pass


@dataclass(frozen=True)
class QuantizeOptions:
    """How `quantize` works. Of the op_types, Gather quantizes the embeddings (int8 rows with a scale each) and Gemm
    the LM head; per_row_scales is export/row_scales.py."""

    parts: str = option("all", help="Graphs to quantize: encoder, decoder or all.")
    op_types: tuple[str, ...] = option(OP_TYPES, help="Operators to quantize, comma-separated.")
    exclude: tuple[str, ...] = option(
        (), help="Node to keep in float (lm_head: the tied LM head); repeat, or separate with commas.", repeat=True
    )
    per_channel: bool = option(True, help="int8 scales per output channel (else per tensor).")
    per_row_scales: bool = option(
        False,
        help="int8 activations with a scale per row (token), not per batch tensor: a sentence's output no longer "
        "depends on what it is batched with (docs/serve.md).",
        flags=("--per-row-scales",),
    )
    int4: bool = option(
        False, help="Weight-only int4 (MatMulNBits, GatherBlockQuantized) instead of dynamic int8.", flags=("--int4",)
    )
    block_size: int = option(32, help="int4: weights per scale (a power of two, at least 16).")
    # MatMulNBits' attribute: 0 leaves it unset (ONNX Runtime computes in fp32, the weights dequantized per block);
    # 4 quantizes each row of activations to int8 per block and multiplies in integers (VNNI/AMX where the CPU has
    # them), as onnxruntime-genai's CPU builds do. 1 (fp32), 2 (fp16) and 3 (bf16) name other compute types.
    accuracy_level: int = option(
        0, help="int4: MatMulNBits accuracy level (0: unset, fp32; 4: int8 activations).", min=0
    )
    force: bool = option(False, help="Replace a non-empty OUTPUT_DIR.", flags=("--force",))


@dataclass(frozen=True)
class FileResult:
    """One graph file, or the weights file (no nodes); 0 bytes where the file does not exist."""

    file: str
    bytes_before: int
    bytes_after: int
    quantized_nodes: list[str]
    float_weight_bytes: int  # float tensors a graph still reads (layer norms, biases, excluded nodes)


def quantize(
    model_dir: str | Path,
    output_dir: str | Path,
    options: QuantizeOptions = QuantizeOptions(),
    progress: Progress = print,
    quantized_from: str | None = None,
) -> tuple[Manifest, list[FileResult]]:
    """Quantize the graphs of `model_dir` into a new model directory `output_dir`; returns its manifest.
    `quantized_from` is what the manifest's provenance names as the source (default: `model_dir`'s path)."""
    source, output = Path(model_dir), Path(output_dir)
    manifest = _check_request(source, output, options)
    files = _graph_files(manifest, options.parts)
    with staged(output, progress) as staging:
        results = _quantize_into(staging, source, manifest, files, options, progress)
        names = [name for name in manifest.files if (staging / name).is_file()]
        if (staging / WEIGHTS_FILE).is_file() and WEIGHTS_FILE not in names:
            names.insert(2, WEIGHTS_FILE)
        new_manifest = replace(
            manifest,
            files=describe_files(staging, names),
            quantization=_record(manifest, results, options),
            provenance={**manifest.provenance, "quantized_from": quantized_from or str(source.resolve())},
        )
        new_manifest.save(staging)
    return new_manifest, results


def _check_request(source: Path, output: Path, options: QuantizeOptions) -> Manifest:
    if options.parts not in PARTS:
        raise QuantizeError(f"parts must be one of {', '.join(PARTS)}, got {options.parts!r}")
    unknown = sorted(set(options.op_types) - set(OP_TYPES))
    if unknown or not options.op_types:
        raise QuantizeError(f"op types {unknown or '(none)'} cannot be quantized; valid: {', '.join(OP_TYPES)}")
    if options.int4 and options.per_row_scales:
        raise QuantizeError("per_row_scales is for dynamic int8; int4 is weight-only (no activation scales)")
    if options.int4 and (options.block_size < 16 or options.block_size & (options.block_size - 1)):
        raise QuantizeError(f"block_size must be a power of two, at least 16; got {options.block_size}")
    if options.accuracy_level not in (0, 1, 2, 3, 4):
        raise QuantizeError(f"accuracy_level must be 0, 1, 2, 3 or 4; got {options.accuracy_level}")
    if options.int4:
        _int4_quantizer()  # a missing package fails here, before anything is read or written
    manifest = read_manifest(source)
    verify_files(source, manifest)
    if manifest.layout != "onnxmt":
        raise QuantizeError(
            f"{source}: layout {manifest.layout!r}; quantize takes directories written by `onnxmt export`"
        )
    if manifest.quantization:
        raise QuantizeError(f"{source} is already quantized ({manifest.quantization.get('method')}); start from fp32")
    if output.exists() and output.resolve() == source.resolve():
        raise QuantizeError("OUTPUT_DIR is the source directory; quantize writes a new directory")
    if occupied(output) and not options.force:
        raise QuantizeError(f"{output} exists and is not empty; pass --force to replace it")
    return manifest


def _graph_files(manifest: Manifest, parts: str) -> list[str]:
    keys = [k for k in ("encoder", "decoder") if k in manifest.graphs] if parts == "all" else [parts]
    if parts not in ("all", *manifest.graphs):
        raise QuantizeError(f"this model has no {parts} graph; it has {', '.join(manifest.graphs)}")
    return [manifest.graphs[key].file for key in keys]


def _quantize_into(
    staging: Path, source: Path, manifest: Manifest, files: list[str], options: QuantizeOptions, progress: Progress
) -> list[FileResult]:
    """The graphs are loaded without their weights, which are read where they lie one group of nodes at a time
    (groups.py), and the quantized ones written out as they are made: the peak is one group's weights."""
    import onnx

    all_graphs = [manifest.graphs[key].file for key in ("encoder", "decoder") if key in manifest.graphs]
    external = _external_locations(source, all_graphs)  # weights.bin (shared_weights.bin in older exports)
    locations = {name: source / name for name in external}
    models = {name: onnx.load(str(source / name), load_external_data=False) for name in all_graphs}
    tensors = Tensors(Reader(staging, locations), TensorFile(staging / QUANTIZED_WEIGHTS_FILE))
    selected = {}
    try:
        for model in models.values():
            join_heads(model)  # the quantizers see the LM head whole; store_weights cuts it again
        _check_exclude({name: models[name] for name in files}, options.exclude)
        for name in files:
            selected[name] = _quantize_graph(models[name], name, options, tensors, progress)
    finally:
        tensors.out.close()
        tensors.reader.close()
    for name in all_graphs:
        onnx.save(models[name], str(staging / name))  # small: every large tensor is external
    for name in manifest.files:
        if name not in models and name not in external:
            shutil.copy2(source / name, staging / name)
    # What the graphs still hold identically (the int8 vocabulary matrix, float weights of a graph left as it was)
    # is stored once; every large tensor is memory-mapped (export/weights.py).
    progress(f"writing {WEIGHTS_FILE}")
    store_weights([staging / name for name in all_graphs], WEIGHTS_FILE, locations, progress)
    (staging / QUANTIZED_WEIGHTS_FILE).unlink()
    results = [_result(source / n, staging / n, selected[n]) for n in files]
    for name in sorted(external | {WEIGHTS_FILE}):
        before, after = source / name, staging / name
        if before.is_file() or after.is_file():
            size_before = before.stat().st_size if before.is_file() else 0
            size_after = after.stat().st_size if after.is_file() else 0
            results.append(FileResult(name, size_before, size_after, [], 0))
    return results


def _quantize_graph(model: Any, name: str, options: QuantizeOptions, tensors: Tensors, progress: Progress) -> list[str]:
    """Quantize one graph in place; returns the names of the nodes quantized."""
    method = "int4 weight-only" if options.int4 else "dynamic int8"
    progress(f"quantizing {name} ({method})")
    _name_nodes(model.graph)
    excluded = _excluded(model.graph, options)  # before any rewrite: the tied head is still a Gemm
    rewritten: list[str] = []
    if options.int4:
        nodes, kept_heads = _prepare(model, options, excluded, tensors)
    else:
        rewritten = _int8_tables(model, options, excluded, tensors)
        nodes, kept_heads = _matmuls_for_int8(model, options, excluded, tensors)
    if nodes:
        members = groups(model.graph, nodes, by_input=not options.int4)
        quantizer = (
            _int4_group(options.block_size, options.accuracy_level)
            if options.int4
            else _int8_group(options.per_channel)
        )
        total = sum(nbytes(i) for i in model.graph.initializer if i.name in _weights_of(members))
        done, start = [0, 0], time.monotonic()

        def advance(weight_bytes: int) -> None:
            # The time left, from the weight bytes quantized so far (groups differ in size by 100x).
            done[0], done[1] = done[0] + 1, done[1] + weight_bytes
            left = (time.monotonic() - start) * (total - done[1]) / max(done[1], 1)
            progress(f"quantizing {name} ({method}): {done[0]}/{len(members)} groups of nodes, ~{left:.0f} s left")

        # int4 quantizes its 1-2 GB vocabulary table and LM head in slices; int8's per-tensor scales need the whole.
        quantize_in_groups(model, members, quantizer, tensors, advance, _SPLIT_BYTES if options.int4 else None)
        if not options.int4:
            _one_zero_point(model, tensors)
    if kept_heads:
        _restore_heads(model, kept_heads, tensors)
    if options.per_row_scales:
        try:
            per_row_activations(model, tensors.array)
        except ValueError as e:
            raise QuantizeError(str(e)) from e
    return rewritten + nodes


def _external_locations(directory: Path, graphs: list[str]) -> set[str]:
    """Files the graphs keep tensors in (ONNX external data)."""
    import onnx

    locations: set[str] = set()
    for name in graphs:
        for init in onnx.load(str(directory / name), load_external_data=False).graph.initializer:
            if init.data_location == onnx.TensorProto.EXTERNAL:
                locations.update(e.value for e in init.external_data if e.key == "location")
    return locations


def _check_exclude(models: dict[str, Any], exclude: tuple[str, ...]) -> None:
    names = {node.name for model in models.values() for node in model.graph.node} | {LM_HEAD}
    for wanted in exclude:
        if wanted not in names:
            close = difflib.get_close_matches(wanted, sorted(names), n=3)
            hint = f"; did you mean {', '.join(close)}?" if close else " (see the node names in Netron or onnx)"
            raise QuantizeError(f"--exclude {wanted!r}: no node of that name in {', '.join(models)}{hint}")


# ---------------------------------------------------------------------------------------------------------------
# Choosing nodes and untying the LM head.


@dataclass(frozen=True)
class _KeptHead:
    """A Gemm that stays float: quantized as an excluded MatMul, then put back as it was."""

    gemm: Any  # the original NodeProto
    transposed: str  # the initializer the temporary MatMul read


def _prepare(
    model: Any, options: QuantizeOptions, excluded: set[str], tensors: Tensors
) -> tuple[list[str], list[_KeptHead]]:
    """int4: untie every Gemm on a constant weight into a MatMul (same node name); return the nodes to quantize
    (MatMuls, and Gathers for GatherBlockQuantized) and the Gemms to put back in float afterwards."""
    graph = model.graph
    untied, kept = _untie_gemms(model, options, excluded, tensors)
    kept_names = {k.gemm.name for k in kept}
    inits = {init.name for init in graph.initializer}
    # A float head needs its float weight, so the Gathers sharing it stay float as well.
    kept_weights = {k.gemm.input[1] for k in kept}

    def wanted(node: Any) -> bool:
        if node.name in excluded or node.name in kept_names:
            return False
        if node.op_type == "MatMul" and node.input[1] in inits:
            return ("Gemm" if node.name in untied else "MatMul") in options.op_types
        if node.op_type == "Gather" and node.input[0] in inits and node.input[0] not in kept_weights:
            return "Gather" in options.op_types and _is_float_matrix(graph, node.input[0])
        return False

    return [node.name for node in graph.node if wanted(node)], kept


def _tied_heads(graph: Any) -> set[str]:
    """Names of the Gemm(transB=1) nodes whose weight a Gather reads too: the tied LM head."""
    gathered = {n.input[0] for n in graph.node if n.op_type == "Gather"}
    return {
        n.name for n in graph.node if n.op_type == "Gemm" and n.input[1] in gathered and _attribute(n, "transB", 0) == 1
    }


def _untie_gemms(
    model: Any, options: QuantizeOptions, excluded: set[str], tensors: Tensors
) -> tuple[set[str], list[_KeptHead]]:
    """Every plain Gemm on a constant weight becomes a MatMul of the same name (on a transposed copy when
    transB=1): returns the names to quantize, and the Gemms to put back in float afterwards (excluded ones, or all
    when Gemm is not among the op types), which the quantizers would otherwise rewrite."""
    graph = model.graph
    inits = {init.name for init in graph.initializer}
    untied: set[str] = set()
    kept: list[_KeptHead] = []
    for node in [n for n in graph.node if n.op_type == "Gemm" and n.input[1] in inits and _plain_gemm(n)]:
        gemm = type(node)()
        gemm.CopyFrom(node)  # the graph's own node object is removed below
        transposed = _gemm_to_matmul(model, node, tensors)
        if gemm.name in excluded or "Gemm" not in options.op_types:
            kept.append(_KeptHead(gemm, transposed))
        else:
            untied.add(gemm.name)
    return untied, kept


def _plain_gemm(node: Any) -> bool:
    from onnx import helper

    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    return attrs.get("alpha", 1.0) == 1.0 and attrs.get("beta", 1.0) == 1.0 and attrs.get("transA", 0) == 0


def _gemm_to_matmul(model: Any, node: Any, tensors: Tensors) -> str:
    """Replace `node` (a Gemm on a constant B) by a MatMul of the same name [+ Add], reading B or, when
    transB=1, a new transposed copy of B. Returns the name of the weight the MatMul reads."""
    from onnx import helper

    graph = model.graph
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    original, name, inputs, outputs = node.input[1], node.name, list(node.input), list(node.output)
    weight = original
    if attrs.get("transB", 0):
        init = next(i for i in graph.initializer if i.name == weight)
        taken = {i.name for i in graph.initializer}
        weight = f"{weight}.transposed"
        while weight in taken:
            weight += "_"
        graph.initializer.append(tensors.transposed(init, weight))
    has_bias = len(inputs) > 2 and bool(inputs[2])
    product = outputs[0] + "_matmul" if has_bias else outputs[0]
    replacement = [helper.make_node("MatMul", [inputs[0], weight], [product], name=name)]
    if has_bias:
        replacement.append(helper.make_node("Add", [product, inputs[2]], outputs, name=name + "_bias"))
    replace_node(graph, node, replacement)
    if weight != original and not any(original in n.input for n in graph.node):
        # B was not shared: the transposed copy replaces it.
        graph.initializer.remove(next(i for i in graph.initializer if i.name == original))
    return weight


def _is_float_matrix(graph: Any, name: str) -> bool:
    init = next(i for i in graph.initializer if i.name == name)
    return init.data_type == 1 and len(init.dims) == 2


def _restore_heads(model: Any, kept: list[_KeptHead], tensors: Tensors) -> None:
    """Put float Gemms back: the excluded MatMul and its transposed copy go, the Gemm reads the original weight."""
    graph = model.graph
    for head in kept:
        index = next(i for i, n in enumerate(graph.node) if n.name == head.gemm.name)
        for name in (head.gemm.name, head.gemm.name + "_bias"):
            node = next((n for n in graph.node if n.name == name), None)
            if node is not None:
                graph.node.remove(node)
        graph.node.insert(index, head.gemm)
        inits = {i.name: i for i in graph.initializer}
        weight = head.gemm.input[1]
        if weight not in inits:  # it was not shared, so the transposed copy had replaced it
            graph.initializer.append(tensors.transposed(inits[head.transposed], weight))
        if head.transposed != weight and not any(head.transposed in n.input for n in graph.node):
            graph.initializer.remove(inits[head.transposed])


# ---------------------------------------------------------------------------------------------------------------
# int8: the vocabulary tables as int8 rows, the MatMuls by ONNX Runtime.


def _name_nodes(graph: Any) -> None:
    for i, node in enumerate(graph.node):
        if not node.name:
            node.name = f"{node.op_type}_{i}"  # the quantizers select nodes by name


def _excluded(graph: Any, options: QuantizeOptions) -> set[str]:
    excluded = set(options.exclude)
    if LM_HEAD in excluded:
        excluded |= _tied_heads(graph)
    return excluded


def _matmuls_for_int8(
    model: Any, options: QuantizeOptions, excluded: set[str], tensors: Tensors
) -> tuple[list[str], list[_KeptHead]]:
    """The MatMuls on constant weights for `quantize_dynamic`, after `_int8_tables` took the transB=1 heads; the
    Gemms left are untied (`_untie_gemms`)."""
    graph = model.graph
    untied, kept = _untie_gemms(model, options, excluded, tensors)
    skipped = excluded | {k.gemm.name for k in kept}
    inits = {init.name for init in graph.initializer}
    nodes = [
        n.name
        for n in graph.node
        if n.op_type == "MatMul"
        and n.input[1] in inits
        and n.name not in skipped
        and (n.name in untied or "MatMul" in options.op_types)
    ]
    return nodes, kept


def _int8_tables(model: Any, options: QuantizeOptions, excluded: set[str], tensors: Tensors) -> list[str]:
    """Rewrite the lookups (`Gather` on a float table) and the `Gemm(x, W, transB=1)` heads onto int8 rows of
    their tables, one int8 matrix per table whoever reads it; returns the names of the rewritten nodes."""
    import numpy as np
    from onnx import helper, numpy_helper

    graph = model.graph
    inits = {init.name: init for init in graph.initializer}
    heads, lookups = _int8_readers(graph, inits, options, excluded)
    tables = _add_int8_tables(
        graph, inits, [n.input[1] for n in heads] + [n.input[0] for n in lookups], options, tensors
    )
    axes = "int8_rows_unsqueeze_axes"
    if options.per_channel and lookups:
        graph.initializer.append(numpy_helper.from_array(np.array([-1], np.int64), axes))
    for head in heads:
        _int8_head(graph, inits, head, *tables[head.input[1]], tensors)
    for lookup in lookups:
        _int8_lookup(graph, lookup, *tables[lookup.input[0]], axes if options.per_channel else None)
    used = {i for n in graph.node for i in n.input}
    for init in [i for i in graph.initializer if i.name in tables and i.name not in used]:
        graph.initializer.remove(init)
    if heads and not any(o.domain == "com.microsoft" for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    return [n.name for n in heads + lookups]


def _int8_readers(
    graph: Any, inits: dict[str, Any], options: QuantizeOptions, excluded: set[str]
) -> tuple[list[Any], list[Any]]:
    """The heads (`Gemm(x, W, transB=1)` on a constant W) and the lookups (`Gather` on a float table) to rewrite
    onto int8 rows."""
    gemms = [n for n in graph.node if n.op_type == "Gemm" and n.input[1] in inits and _plain_gemm(n)]
    heads = [n for n in gemms if _attribute(n, "transB", 0) and n.name not in excluded and "Gemm" in options.op_types]
    float_tables = {n.input[1] for n in gemms if n not in heads}  # float Gemms keep their weight: no second copy
    lookups = [
        n
        for n in graph.node
        if n.op_type == "Gather"
        and "Gather" in options.op_types
        and n.name not in excluded
        and n.input[0] in inits
        and n.input[0] not in float_tables
        and _attribute(n, "axis", 0) == 0
        and _is_float_matrix(graph, n.input[0])
    ]
    return heads, lookups


def _add_int8_tables(
    graph: Any, inits: dict[str, Any], tables: list[str], options: QuantizeOptions, tensors: Tensors
) -> dict[str, tuple[str, str]]:
    """One int8 copy of each float table in `tables` (however many nodes read it), with its scales, added to the
    graph. Returns float table -> (int8 rows, scale); symmetric: no zero point."""
    int8: dict[str, tuple[str, str]] = {}
    for table in dict.fromkeys(tables):
        init = inits[table]
        values, scales = _int8_rows(partial(tensors.reader.rows, init), int(init.dims[0]), options.per_channel)
        names = (f"{table}_int8", f"{table}_int8_scale")
        for array, name in zip((values, scales), names, strict=True):
            inits[name] = tensors.make(array, name)
            graph.initializer.append(inits[name])
        int8[table] = names
    return int8


def _int8_head(graph: Any, inits: dict[str, Any], head: Any, rows: str, scale: str, tensors: Tensors) -> None:
    """Replace the head `head` by a DynamicQuantizeMatMul on the int8 rows `rows` of its weight."""
    from onnx import helper

    # B as (d_model, vocab): a Transpose of a twin of the int8 rows, which ONNX Runtime folds at load and packs
    # from, then frees (export/weights.py); the bias goes into the kernel's epilogue.
    flip = twin_transpose(graph, inits, rows, f"{head.name}.weight")
    output, bias = head.output[0], head.input[2] if len(head.input) > 2 else ""
    if not bias and (found := bias_add(graph, head, inits[rows].dims[0], inits, tensors.array)):
        add, bias = found  # a bias Add after the Gemm (a head the exporter did not cut) goes in too
        output = add.output[0]
        graph.node.remove(add)
    inputs = [head.input[0], flip.output[0], scale] + (["", bias] if bias else [])  # no zero point: symmetric
    matmul = helper.make_node("DynamicQuantizeMatMul", inputs, [output], name=head.name, domain="com.microsoft")
    replace_node(graph, head, [flip, matmul])


def _int8_lookup(graph: Any, lookup: Any, rows: str, scale: str, axes: str | None) -> None:
    """Replace the lookup `lookup` by a Gather of int8 rows, cast and scaled: per row (`axes`, the Unsqueeze axes
    of the row scales) or by the table's one scale (`axes` None)."""
    from onnx import TensorProto, helper

    ids, out, base = lookup.input[1], lookup.output[0], lookup.output[0]
    nodes = [
        helper.make_node("Gather", [rows, ids], [base + "_int8"], name=lookup.name),
        helper.make_node("Cast", [base + "_int8"], [base + "_unscaled"], to=TensorProto.FLOAT),
    ]
    if axes is not None:
        nodes += [
            helper.make_node("Gather", [scale, ids], [base + "_scales"]),
            helper.make_node("Unsqueeze", [base + "_scales", axes], [base + "_row_scales"]),
            helper.make_node("Mul", [base + "_unscaled", base + "_row_scales"], [out]),
        ]
    else:
        nodes.append(helper.make_node("Mul", [base + "_unscaled", scale], [out]))
    replace_node(graph, lookup, nodes)


def _int8_rows(read: Callable[[int, int], Any], n_rows: int, per_channel: bool) -> tuple[Any, Any]:
    """Symmetric int8 of a (rows, columns) float table, whose rows `read(start, stop)` reads: one scale per row,
    or one for the table."""
    import numpy as np

    # In blocks of rows, read twice (the scales first): NLLB-200-3.3B's table is 2 GB in fp32; only the int8
    # result (a quarter of it) and one block are ever in memory.
    starts = range(0, n_rows, _TABLE_BLOCK_ROWS)
    peaks = np.concatenate([np.abs(read(start, start + _TABLE_BLOCK_ROWS)).max(axis=1) for start in starts])
    peak = peaks if per_channel else peaks.max()
    scale = np.where(peak > 0, peak / 127, 1).astype(np.float32)
    values: Any = None
    for start in starts:
        block = read(start, start + _TABLE_BLOCK_ROWS)
        if values is None:
            values = np.empty((n_rows, *block.shape[1:]), np.int8)
        rows = slice(start, start + len(block))
        per_row = scale[rows, None] if per_channel else scale
        values[rows] = np.clip(np.rint(block / per_row), -127, 127)
    return values, scale


def _attribute(node: Any, name: str, default: Any) -> Any:
    from onnx import helper

    return next((helper.get_attribute_value(a) for a in node.attribute if a.name == name), default)


# ---------------------------------------------------------------------------------------------------------------
# Running ONNX Runtime's quantizers.


@contextmanager
def _quiet() -> Iterator[None]:
    # The quantizers log a pre-processing advice on the root logger, and the int4 one divides by the zero scale of
    # all-zero blocks before discarding the result; none is actionable here.
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="invalid value encountered in divide", category=RuntimeWarning)
            yield
    finally:
        root.setLevel(level)


def _weights_of(members: list[list[Any]]) -> set[str]:
    return {name for group in members for node in group for name in node.input}


def _int8_group(per_channel: bool) -> Quantizer:
    """ONNX Runtime's dynamic int8 quantizer on one group of MatMuls (groups.py)."""

    def run(model: Any, out: Path) -> None:
        from onnxruntime.quantization import QuantType, quantize_dynamic

        with _quiet():
            quantize_dynamic(
                model,
                out,
                op_types_to_quantize=["MatMul"],
                nodes_to_quantize=[n.name for n in model.graph.node],
                per_channel=per_channel,
                weight_type=QuantType.QInt8,
                extra_options={"MatMulConstBOnly": True},
            )

    return run


def _one_zero_point(model: Any, tensors: Tensors) -> None:
    """Symmetric int8 weights have zero points of 0: one scalar for every MatMulInteger instead of a vector each
    (opus-mt: 270 kB less; ONNX Runtime reads a scalar zero point as per-column zeros)."""
    import numpy as np
    import onnx
    from onnx import numpy_helper

    graph = model.graph
    inits = {init.name: init for init in graph.initializer}
    zero = "int8_weights_zero_point"
    changed = False
    for node in graph.node:
        if node.op_type != "MatMulInteger" or len(node.input) < 4 or node.input[3] not in inits:
            continue
        init = inits[node.input[3]]
        if init.data_type == onnx.TensorProto.INT8 and not tensors.array(init).any():
            node.input[3] = zero
            changed = True
    if not changed:
        return
    graph.initializer.append(numpy_helper.from_array(np.array(0, np.int8), zero))
    used = {i for n in graph.node for i in n.input}
    for init in [i for i in graph.initializer if i.name not in used]:
        graph.initializer.remove(init)


def _int4_quantizer() -> Any:
    """ONNX Runtime's MatMulNBitsQuantizer class. It imports onnx_ir and ml_dtypes, which onnxruntime does not
    install: the export extra does."""
    try:
        from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer
    except ImportError as e:
        raise missing_extra("--int4 (onnxruntime's MatMulNBitsQuantizer, onnxruntime >= 1.17)", "export", e) from e
    return MatMulNBitsQuantizer


def _int4_group(block_size: int, accuracy_level: int = 0) -> Quantizer:
    """ONNX Runtime's int4 weight-only quantizer on one node (groups.py)."""

    def run(model: Any, out: Path) -> None:
        with _quiet():
            quantizer = _int4_quantizer()(
                model,
                bits=4,
                block_size=block_size,
                is_symmetric=True,
                accuracy_level=accuracy_level or None,
                op_types_to_quantize=("MatMul", "Gather"),
                quant_axes=(("MatMul", 0), ("Gather", 1)),
            )
            quantizer.process()
            quantizer.model.save_model_to_file(str(out), use_external_data_format=False)

    return run


def _result(before: Path, after: Path, nodes: list[str]) -> FileResult:
    import onnx

    graph = onnx.load(str(after), load_external_data=False).graph
    float_bytes = sum(_stored_bytes(i) for i in graph.initializer if i.data_type == onnx.TensorProto.FLOAT)
    return FileResult(after.name, before.stat().st_size, after.stat().st_size, nodes, float_bytes)


def _stored_bytes(init: Any) -> int:
    length = next((int(e.value) for e in init.external_data if e.key == "length"), None)
    return length if length is not None else len(init.raw_data) or 4 * len(init.float_data)


def _record(manifest: Manifest, results: list[FileResult], options: QuantizeOptions) -> dict[str, Any]:
    import onnxruntime

    method = "weight-only int4" if options.int4 else "dynamic int8"
    tool = "MatMulNBitsQuantizer" if options.int4 else "quantize_dynamic (layer MatMuls) + onnxmt (vocabulary tables)"
    record: dict[str, Any] = {
        "method": method,
        "operators": "MatMulNBits, GatherBlockQuantized"
        if options.int4
        else "MatMulIntegerToFloat on activations quantized per row; Gather on int8 rows for the vocabulary tables"
        if options.per_row_scales
        else "MatMulInteger; DynamicQuantizeMatMul and Gather on int8 rows for the vocabulary tables",
        "weights": f"int4 symmetric, blocks of {options.block_size}" if options.int4 else "QInt8",
        "accuracy_level": options.accuracy_level if options.int4 else None,
        "per_channel": None if options.int4 else options.per_channel,
        # Per tensor: a sentence's output depends on its batch-mates (docs/serve.md); per row: it does not.
        "activation_scales": None if options.int4 else ("per row" if options.per_row_scales else "per tensor"),
        "op_types": list(options.op_types),
        "parts": options.parts,
        "excluded_nodes": list(options.exclude),
        "tool": f"onnxruntime {onnxruntime.__version__} {tool}",
        "files": {
            r.file: {
                "quantized_nodes": len(r.quantized_nodes),
                "bytes_before": r.bytes_before,
                "bytes_after": r.bytes_after,
                "float_weight_bytes": r.float_weight_bytes,
            }
            for r in results
        },
        "source_sha256": {r.file: manifest.files[r.file]["sha256"] for r in results if r.file in manifest.files},
    }
    return record
