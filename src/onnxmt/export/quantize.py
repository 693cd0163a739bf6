"""`onnxmt quantize`: an exported model directory to a new, smaller one (int8 dynamic or int4 weight-only).

Needs `onnx` and `onnxruntime` only, never torch. The graphs are rewritten by ONNX Runtime's own quantizers
(`quantize_dynamic`, `MatMulNBitsQuantizer`); this module picks the nodes, protects the tied LM head, and writes a
complete directory whose manifest records what was done. The source directory is only read.

The tied LM head is the one trap. The decoder's logits are `Gemm(x, embedding, transB=1)` reading the same
initializer as the token-embedding `Gather` (one copy on disk). ONNX Runtime quantizes MatMul, not Gemm, and the
Gemm-to-MatMul rewrite of older releases transposed the shared initializer in place ("assume B is not used by any
other node"): the Gather then reads garbage.
So the Gemm is untied here first: a MatMul on a transposed int8 copy (33 MB for opus-mt) next to the int8
embedding (33 MB), instead of one 133 MB float matrix. Dequantizing and transposing a shared int8 matrix at
every step instead was measured ~3x slower. A Gemm that stays float keeps sharing the float embedding, and the
Gathers on it stay float too: quantizing them would only add a second copy.
"""

from __future__ import annotations

import difflib
import logging
import shutil
import tempfile
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ..manifest import SHARED_WEIGHTS_FILE, Manifest, describe_files, read_manifest, verify_files
from .graphs import share_weights

PARTS = ("encoder", "decoder", "all")
LM_HEAD = "lm_head"  # an --exclude name for the tied LM head, whatever the exporter called its node
OP_TYPES = ("MatMul", "Gemm", "Gather")
# Element types of quantized weights: int8, uint8, int4, uint4.
_QUANTIZED_DTYPES = {2, 3, 21, 22}

Progress = Callable[[str], None]


class QuantizeError(ValueError):
    pass


@dataclass(frozen=True)
class QuantizeOptions:
    """parts: which graphs to quantize. op_types: the weight-carrying operators to quantize (Gather: the
    embeddings, per-tensor uint8 in ONNX Runtime's dynamic mode; Gemm: the LM head). exclude: node names kept in
    float ("lm_head": the tied LM head). int4: weight-only 4-bit (MatMulNBits, GatherBlockQuantized) instead of
    dynamic int8. per_channel: int8 scales per output column rather than per matrix."""

    parts: str = "all"
    op_types: tuple[str, ...] = OP_TYPES
    exclude: tuple[str, ...] = ()
    per_channel: bool = True
    int4: bool = False
    block_size: int = 32  # int4 only: weights per scale
    # Embedding lookups read the int8 LM-head matrix (one int8 vocabulary matrix instead of two: 112 -> 79 MB for
    # opus-mt). Off by default: the lookup becomes a strided column gather, 10-30% slower (docs/performance.md).
    share_embedding: bool = False
    force: bool = False


@dataclass(frozen=True)
class FileResult:
    """One graph file, or the shared weights file (no nodes); 0 bytes where the file does not exist."""

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
) -> tuple[Manifest, list[FileResult]]:
    """Quantize the graphs of `model_dir` into a new model directory `output_dir`; returns its manifest."""
    source, output = Path(model_dir), Path(output_dir)
    manifest = _check_request(source, output, options)
    files = _graph_files(manifest, options.parts)
    output.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{output.name}.", dir=output.parent))
    try:
        results = _quantize_into(staging, source, manifest, files, options, progress)
        names = [name for name in manifest.files if (staging / name).is_file()]
        if (staging / SHARED_WEIGHTS_FILE).is_file() and SHARED_WEIGHTS_FILE not in names:
            names.insert(2, SHARED_WEIGHTS_FILE)
        new_manifest = replace(
            manifest,
            files=describe_files(staging, names),
            quantization=_record(manifest, results, options),
            provenance={**manifest.provenance, "quantized_from": str(source.resolve())},
        )
        new_manifest.save(staging)
        if output.exists():
            shutil.rmtree(output) if output.is_dir() else output.unlink()
        staging.rename(output)
        output.chmod(0o755)  # mkdtemp made it private
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return new_manifest, results


def _check_request(source: Path, output: Path, options: QuantizeOptions) -> Manifest:
    if options.parts not in PARTS:
        raise QuantizeError(f"parts must be one of {', '.join(PARTS)}, got {options.parts!r}")
    unknown = sorted(set(options.op_types) - set(OP_TYPES))
    if unknown or not options.op_types:
        raise QuantizeError(f"op types {unknown or '(none)'} cannot be quantized; valid: {', '.join(OP_TYPES)}")
    if options.int4 and (options.block_size < 16 or options.block_size & (options.block_size - 1)):
        raise QuantizeError(f"block_size must be a power of two, at least 16; got {options.block_size}")
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
    if output.exists() and (not output.is_dir() or any(output.iterdir())) and not options.force:
        raise QuantizeError(f"{output} exists and is not empty; pass --force to replace it")
    return manifest


def _graph_files(manifest: Manifest, parts: str) -> list[str]:
    keys = ["encoder", "decoder"] if parts == "all" else [parts]
    return [manifest.graphs[key].file for key in keys]


def _quantize_into(
    staging: Path, source: Path, manifest: Manifest, files: list[str], options: QuantizeOptions, progress: Progress
) -> list[FileResult]:
    import onnx

    all_graphs = [manifest.graphs[key].file for key in ("encoder", "decoder")]
    external = _external_locations(source, all_graphs)  # e.g. shared_weights.bin
    models = {name: onnx.load(str(source / name)) for name in files}  # external data read in
    _check_exclude(models, options.exclude)
    selected = {}
    for name, model in models.items():
        progress(f"quantizing {name} ({'int4 weight-only' if options.int4 else 'dynamic int8'})")
        nodes, kept_heads = _prepare(model, options)
        out = staging / name
        if not nodes:
            onnx.save(model, str(out))
        elif options.int4:
            _run_int4(model, out, nodes, options.block_size)
        else:
            _run_int8(model, out, nodes, options.per_channel)
        if kept_heads:
            _restore_heads(out, kept_heads)
        selected[name] = nodes
    for name in manifest.files:
        if name not in models and (name not in external or len(models) < len(all_graphs)):
            shutil.copy2(source / name, staging / name)
    if len(models) == len(all_graphs):
        if options.share_embedding and not options.int4:
            _lookup_from_head([staging / name for name in all_graphs])
        # Both graphs rewritten: what they still hold identically (the int8 head/embedding, positions) is stored once.
        share_weights([staging / name for name in all_graphs], SHARED_WEIGHTS_FILE)
    else:
        # The untouched graph still reads the source's shared file; unchanged float tensors of the other one too.
        for name in models:
            _point_unchanged_to_shared(staging / name, source, all_graphs)
    results = [_result(source / n, staging / n, selected[n]) for n in models]
    for name in sorted(external | {SHARED_WEIGHTS_FILE}):
        before, after = source / name, staging / name
        if before.is_file() or after.is_file():
            size_before = before.stat().st_size if before.is_file() else 0
            size_after = after.stat().st_size if after.is_file() else 0
            results.append(FileResult(name, size_before, size_after, [], 0))
    return results


def _external_locations(directory: Path, graphs: list[str]) -> set[str]:
    """Files the graphs keep tensors in (ONNX external data)."""
    import onnx

    locations: set[str] = set()
    for name in graphs:
        for init in onnx.load(str(directory / name), load_external_data=False).graph.initializer:
            if init.data_location == onnx.TensorProto.EXTERNAL:
                locations.update(e.value for e in init.external_data if e.key == "location")
    return locations


def _point_unchanged_to_shared(path: Path, source: Path, graphs: list[str]) -> None:
    """Tensors of the rewritten graph `path` that the source kept in a shared file and that are unchanged (same
    name, same bytes) point to that file again instead of being stored a second time inside the graph."""
    import onnx
    from onnx.external_data_helper import ExternalDataInfo

    pointers = {}
    for name in graphs:
        for init in onnx.load(str(source / name), load_external_data=False).graph.initializer:
            if init.data_location == onnx.TensorProto.EXTERNAL:
                pointers[init.name] = init
    model = onnx.load(str(path), load_external_data=False)
    changed = False
    for init in model.graph.initializer:
        pointer = pointers.get(init.name)
        if pointer is None or not init.raw_data or init.data_type != pointer.data_type:
            continue
        info = ExternalDataInfo(pointer)
        with open(source / info.location, "rb") as f:
            f.seek(info.offset or 0)
            if f.read(info.length) != init.raw_data:
                continue
        init.ClearField("raw_data")
        init.data_location = onnx.TensorProto.EXTERNAL
        init.external_data.extend(pointer.external_data)
        changed = True
    if changed:
        onnx.save(model, str(path))


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


def _prepare(model: Any, options: QuantizeOptions) -> tuple[list[str], list[_KeptHead]]:
    """Untie every Gemm on a constant weight into a MatMul (same node name); return the nodes to quantize."""
    graph = model.graph
    inits = {init.name for init in graph.initializer}
    for i, node in enumerate(graph.node):
        if not node.name:
            node.name = f"{node.op_type}_{i}"  # the quantizers select nodes by name
    excluded = set(options.exclude)
    if LM_HEAD in excluded:
        excluded |= _tied_heads(graph)
    kept: list[_KeptHead] = []
    untied = set()
    for node in [n for n in graph.node if n.op_type == "Gemm" and n.input[1] in inits and _plain_gemm(n)]:
        gemm = type(node)()
        gemm.CopyFrom(node)  # the graph's own node object is removed below
        untied.add(gemm.name)
        transposed = _gemm_to_matmul(model, node)
        if gemm.name in excluded or "Gemm" not in options.op_types:
            kept.append(_KeptHead(gemm, transposed))
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
    from onnx import helper

    gathered = {n.input[0] for n in graph.node if n.op_type == "Gather"}
    return {
        n.name
        for n in graph.node
        if n.op_type == "Gemm"
        and n.input[1] in gathered
        and any(a.name == "transB" and helper.get_attribute_value(a) == 1 for a in n.attribute)
    }


def _plain_gemm(node: Any) -> bool:
    from onnx import helper

    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    return attrs.get("alpha", 1.0) == 1.0 and attrs.get("beta", 1.0) == 1.0 and attrs.get("transA", 0) == 0


def _gemm_to_matmul(model: Any, node: Any) -> str:
    """Replace `node` (a Gemm on a constant B) by a MatMul of the same name [+ Add], reading B or, when
    transB=1, a new transposed copy of B. Returns the name of the weight the MatMul reads."""
    from onnx import helper, numpy_helper

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
        graph.initializer.append(numpy_helper.from_array(numpy_helper.to_array(init).T.copy(), weight))
    has_bias = len(inputs) > 2 and bool(inputs[2])
    product = outputs[0] + "_matmul" if has_bias else outputs[0]
    replacement = [helper.make_node("MatMul", [inputs[0], weight], [product], name=name)]
    if has_bias:
        replacement.append(helper.make_node("Add", [product, inputs[2]], outputs, name=name + "_bias"))
    index = list(graph.node).index(node)
    graph.node.remove(node)
    for offset, new in enumerate(replacement):
        graph.node.insert(index + offset, new)
    if weight != original and not any(original in n.input for n in graph.node):
        # B was not shared: the transposed copy replaces it.
        graph.initializer.remove(next(i for i in graph.initializer if i.name == original))
    return weight


def _is_float_matrix(graph: Any, name: str) -> bool:
    init = next(i for i in graph.initializer if i.name == name)
    return init.data_type == 1 and len(init.dims) == 2


def _restore_heads(path: Path, kept: list[_KeptHead]) -> None:
    """Put float Gemms back: the excluded MatMul and its transposed copy go, the Gemm reads the original weight."""
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(path))
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
            graph.initializer.append(numpy_helper.from_array(numpy_helper.to_array(inits[head.transposed]).T, weight))
        if head.transposed != weight and not any(head.transposed in n.input for n in graph.node):
            graph.initializer.remove(inits[head.transposed])
    onnx.save(model, str(path))


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


def _run_int8(model: Any, out: Path, nodes: list[str], per_channel: bool) -> None:
    from onnxruntime.quantization import QuantType, quantize_dynamic

    with _quiet():
        quantize_dynamic(
            model,
            out,
            op_types_to_quantize=["MatMul", "Gather"],
            nodes_to_quantize=nodes,
            per_channel=per_channel,
            weight_type=QuantType.QInt8,
            extra_options={"MatMulConstBOnly": True},
        )


def _run_int4(model: Any, out: Path, nodes: list[str], block_size: int) -> None:
    try:
        from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer
    except ImportError as e:  # pragma: no cover - depends on the installed onnxruntime
        raise QuantizeError(f"int4 needs onnxruntime's MatMulNBitsQuantizer (onnxruntime >= 1.17): {e}") from e

    chosen = set(nodes)
    with _quiet():
        quantizer = MatMulNBitsQuantizer(
            model,
            bits=4,
            block_size=block_size,
            is_symmetric=True,
            # Its nodes_to_include adds to op_types_to_quantize instead of narrowing it: exclude the rest.
            nodes_to_exclude=[n.name for n in model.graph.node if n.name not in chosen],
            op_types_to_quantize=("MatMul", "Gather"),
            quant_axes=(("MatMul", 0), ("Gather", 1)),
        )
        quantizer.process()
        quantizer.model.save_model_to_file(str(out), use_external_data_format=False)


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
    tool = "MatMulNBitsQuantizer" if options.int4 else "quantize_dynamic"
    record: dict[str, Any] = {
        "method": method,
        "operators": "MatMulNBits, GatherBlockQuantized"
        if options.int4
        else "MatMulInteger, Gather + DequantizeLinear",
        "weights": f"int4 symmetric, blocks of {options.block_size}" if options.int4 else "QInt8",
        "per_channel": None if options.int4 else options.per_channel,
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


def _lookup_from_head(paths: list[Path]) -> bool:
    """Let every int8 embedding lookup read the decoder's int8 LM head instead of its own int8 embedding copy.

    After dynamic quantization the tied matrix exists twice in int8: as the LM head's per-channel `E^T` (vocab
    columns) and as the lookups' per-tensor `E`. A lookup of token t is column t of `E^T` times that column's scale,
    so `Gather(E^T, ids, axis=1) * Gather(scales, ids)`, transposed, replaces `DequantizeLinear(Gather(E, ids))`.
    One 33 MB matrix for opus-mt instead of two, and per-row scales instead of one scale for the whole embedding.
    Returns False (graphs unchanged) when the graphs do not have that shape, e.g. a float or asymmetric head.
    """
    import onnx
    from onnx import helper

    models = [onnx.load(str(p)) for p in paths]
    head = _int8_head(models[-1].graph)
    if head is None:
        return False
    weight, scale = head
    shape = [weight.dims[1], weight.dims[0]]  # (vocab, d_model): the embedding the head was untied from
    for model in models:
        graph = model.graph
        inits = {init.name: init for init in graph.initializer}
        lookups = [n for n in graph.node if n.op_type == "Gather" and _is_quantized_embedding(inits, n.input[0], shape)]
        if not lookups:
            continue
        for init in (weight, scale):
            if init.name not in inits:
                graph.initializer.append(init)
        for gather in lookups:
            dequantize = next(
                n for n in graph.node if n.op_type == "DequantizeLinear" and n.input[0] == gather.output[0]
            )
            out, ids, base = dequantize.output[0], gather.input[1], gather.output[0]
            nodes = [
                helper.make_node("Gather", [weight.name, ids], [base + "_cols"], axis=1),  # (d_model, *ids)
                helper.make_node("Cast", [base + "_cols"], [base + "_colsf"], to=onnx.TensorProto.FLOAT),
                helper.make_node("Gather", [scale.name, ids], [base + "_scales"], axis=0),  # (*ids)
                helper.make_node("Mul", [base + "_colsf", base + "_scales"], [base + "_scaled"]),
                helper.make_node("Transpose", [base + "_scaled"], [out], perm=[1, 2, 0]),  # (*ids, d_model)
            ]
            index = list(graph.node).index(gather)
            graph.node.remove(gather)
            graph.node.remove(dequantize)
            for offset, node in enumerate(nodes):
                graph.node.insert(index + offset, node)
        used = {i for n in graph.node for i in n.input}
        for init in [i for i in graph.initializer if i.name not in used]:
            graph.initializer.remove(init)
    for model, path in zip(models, paths, strict=True):
        onnx.save(model, str(path))
    return True


def _int8_head(graph: Any) -> tuple[Any, Any] | None:
    """The decoder's LM head weight (d_model, vocab) int8 and its per-column scales, if symmetric per-channel."""
    from onnx import TensorProto, numpy_helper

    inits = {init.name: init for init in graph.initializer}
    # The untied LM head: `_gemm_to_matmul` named its weight `<embedding>.transposed`.
    for node in graph.node:
        if node.op_type != "MatMulInteger" or not node.input[1].endswith(".transposed_quantized"):
            continue
        weight = inits.get(node.input[1])
        if weight is None:
            continue
        base = weight.name.removesuffix("_quantized")
        scale, zero = inits.get(base + "_scale"), inits.get(base + "_zero_point")
        wide = len(weight.dims) == 2 and weight.dims[1] > weight.dims[0] and weight.data_type == TensorProto.INT8
        if not wide or scale is None or zero is None or list(scale.dims) != [weight.dims[1]]:
            continue
        if len(node.input) > 3 and node.input[3] == zero.name and not numpy_helper.to_array(zero).any():
            return weight, scale
    return None


def _is_quantized_embedding(inits: dict[str, Any], name: str, shape: list[int]) -> bool:
    init = inits.get(name)
    return init is not None and list(init.dims) == shape and init.data_type in (2, 3)  # uint8 or int8
