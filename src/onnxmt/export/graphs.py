"""Tracing the export modules to ONNX, and the graph surgery and bookkeeping around it."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ..layout import role_of
from ..manifest import GraphSpec, TensorSpec
from .binding import TensorFile, bind_weights

_DTYPES = {1: "float32", 6: "int32", 7: "int64", 9: "bool", 10: "float16", 11: "float64"}


def cache_names(prefix: str, layers: int) -> list[str]:
    return [f"{prefix}_{kv}.{i}" for i in range(layers) for kv in ("key", "value")]


@dataclass(frozen=True)
class Target:
    """Where a traced graph goes: its file (`path`), the file of its large tensors (`out`, binding.py), the model's
    facts (its static dimensions), the opset, and where progress is told."""

    path: Path
    facts: dict[str, Any]
    opset: int
    out: TensorFile
    progress: Callable[[str], None] = lambda _: None


def export_encoder(module: Any, target: Target) -> None:
    """Trace the encoder module into `target`."""
    import torch

    layers = target.facts["num_layers"]

    ids = torch.tensor([[5, 6, 7, 8, 0], [9, 10, 0, 1, 1]], dtype=torch.int64)
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]], dtype=torch.int64)
    outputs = ["encoder_hidden_states", *cache_names("cross", layers)]
    axes = {"input_ids": {0: "batch", 1: "src_len"}, "attention_mask": {0: "batch", 1: "src_len"}}
    axes["encoder_hidden_states"] = {0: "batch", 1: "src_len"}
    axes.update({name: {0: "batch", 2: "src_len"} for name in outputs[1:]})
    _trace(module, (ids, mask), ["input_ids", "attention_mask"], outputs, axes, target)


def export_decoder(module: Any, target: Target) -> None:
    """Trace the decoder step module into `target`."""
    import torch

    facts = target.facts
    layers, heads, head_dim = facts["num_layers"], facts["num_heads"], facts["head_dim"]
    buffered = bool(getattr(module, "buffered", False))
    # Two sentences with two beams each: the decoder rows are sentences x beams, the encoder's K/V and mask are one
    # per sentence (the graph broadcasts them over the beams), so the trace must see the two counts differ. A
    # buffer holds more positions than are filled, so the trace sees capacity and length differ too.
    sentences, rows, src_len, past_len = 2, 4, 5, 3
    ids = torch.tensor([[3], [4], [5], [6]], dtype=torch.int64)
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]], dtype=torch.int64)
    capacity = past_len + (2 if buffered else 0)
    past = [torch.randn(rows, heads, capacity, head_dim) for _ in range(2 * layers)]
    cross = [torch.randn(sentences, heads, src_len, head_dim) for _ in range(2 * layers)]
    # Each row its own cache length (in-flight batching joins rows of different lengths): the trace sees them differ.
    length = [torch.tensor([past_len, past_len - 1, past_len, 1], dtype=torch.int64)] if buffered else []
    inputs = [
        "input_ids",
        "encoder_attention_mask",
        *(["past_length"] if buffered else []),
        *cache_names("past", layers),
        *cache_names("cross", layers),
    ]
    outputs = ["logits", *cache_names("new" if buffered else "present", layers)]
    axes: dict[str, dict[int, str]] = {
        "input_ids": {0: "rows"} if buffered else {0: "rows", 1: "new_len"},
        "encoder_attention_mask": {0: "batch", 1: "src_len"},
        "logits": {0: "rows"},
        **({"past_length": {0: "rows"}} if buffered else {}),
    }
    axes.update({name: {0: "rows", 2: "capacity" if buffered else "past_len"} for name in cache_names("past", layers)})
    axes.update({name: {0: "batch", 2: "src_len"} for name in cache_names("cross", layers)})
    if buffered:
        axes.update({name: {0: "rows"} for name in cache_names("new", layers)})
    else:
        axes.update({name: {0: "rows", 2: "total_len"} for name in cache_names("present", layers)})
    _trace(module, (ids, mask, *length, *past, *cross), inputs, outputs, axes, target)


def export_decoder_only(module: Any, target: Target) -> None:
    """Trace a decoder-only model's graph (export/decoder_only.py) into `target`."""
    import torch

    facts = target.facts
    layers, kv_heads, head_dim = facts["num_layers"], facts["num_kv_heads"], facts["head_dim"]
    # Three rows of different prompt and cache lengths, a buffer with spare capacity: the trace sees them differ.
    rows, new_len, capacity = 3, 4, 8
    ids = torch.tensor([[5, 6, 7, 8], [9, 10, 0, 0], [11, 0, 0, 0]], dtype=torch.int64)
    input_length = torch.tensor([new_len, 2, 1], dtype=torch.int64)
    past_length = torch.tensor([0, 3, 5], dtype=torch.int64)
    past = [torch.randn(rows, kv_heads, capacity, head_dim) for _ in range(2 * layers)]
    inputs = ["input_ids", "input_length", "past_length", *cache_names("past", layers)]
    # The cache written in place by the graph (the buffers are its outputs), or the new positions' keys and values.
    in_place = bool(getattr(module, "cache_in_place", False))
    outputs = ["logits", *cache_names("present" if in_place else "new", layers)]
    axes: dict[str, dict[int, str]] = {
        "input_ids": {0: "rows", 1: "new_len"},
        "input_length": {0: "rows"},
        "past_length": {0: "rows"},
        "logits": {0: "rows"},
    }
    axes.update({name: {0: "rows", 2: "capacity"} for name in cache_names("past", layers)})
    axes.update({name: {0: "rows", 2: "capacity" if in_place else "new_len"} for name in outputs[1:]})
    target = replace(target, facts={**facts, "num_heads": kv_heads})  # its K/V heads are the cache's
    _trace(module, (ids, input_length, past_length, *past), inputs, outputs, axes, target, new_positions=None)


def fix_static_dims(path: Path, facts: dict[str, Any], new_positions: int | None = 1) -> None:
    """Write heads, head_dim, d_model and vocab as numbers in the graph's inputs and outputs.

    The tracer names every dimension it cannot prove constant (`Transposecross_key.0_dim_1`); the manifest and
    `onnxmt inspect` should show what the runtime can rely on. `new_positions`: the positions of a `new_*` output
    (one new token per row for an encoder-decoder's step; None: as many as the call's, a decoder-only prefill).
    """
    import onnx

    model = onnx.load(str(path), load_external_data=False)  # saved again pointing to the same external data
    known = {1: facts["num_heads"], 3: facts["head_dim"]}
    for value in [*model.graph.input, *model.graph.output]:
        dims = value.type.tensor_type.shape.dim
        role = role_of(value.name)
        if role.startswith("new_"):  # one new token's key or value per row
            fixed = {**known, 2: new_positions} if new_positions is not None else known
        elif role.startswith(("past_key", "past_value", "present_", "cross_")):
            fixed = known
        elif role == "encoder_hidden_states":
            fixed = {2: facts["d_model"]}
        elif role == "logits":
            fixed = {1: facts["vocab_size"]}
        else:
            continue
        if len(dims) == 0:  # shape inference left a rank unknown (a decoder-only graph's new K/V): name each axis
            for axis_name in ("rows", "heads", "new_len", "head_dim")[: max(fixed) + 1]:
                dims.add().dim_param = axis_name
        for axis, size in fixed.items():
            dims[axis].Clear()
            dims[axis].dim_value = size
    onnx.save(model, str(path))  # the tensors stay where they are: in the graph or in their external files


def _weights(module: Any) -> dict[str, Any]:
    """The module's parameters and buffers by the names the traced graph reads them under (tied ones by each)."""
    return {
        **dict(module.named_buffers(remove_duplicate=False)),
        **dict(module.named_parameters(remove_duplicate=False)),
    }


@contextmanager
def shape_inference_without_weight_values() -> Iterator[None]:
    """torch's exporter runs ONNX shape inference with the value of every weight at hand, converting each into an
    ONNX tensor (NLLB-200-600M: 2.4 GB more at the peak, with every weight read). Traced without folding, the graph
    reads the weights as typed inputs, and their values change nothing inference finds (tests/export/
    test_binding.py compares the graphs): it is given none."""
    import torch

    real = torch._C._jit_pass_onnx_graph_shape_type_inference

    def without_values(graph: Any, params: Any, opset: int) -> None:
        real(graph, {}, opset)

    torch._C._jit_pass_onnx_graph_shape_type_inference = without_values  # type: ignore[assignment]
    try:
        yield
    finally:
        torch._C._jit_pass_onnx_graph_shape_type_inference = real


def _trace(
    module: Any,
    args: tuple[Any, ...],
    inputs: list[str],
    outputs: list[str],
    axes: dict[str, dict[int, str]],
    target: Target,
    **fixed: Any,
) -> None:
    """Trace `module` on `args` into `target`, then give the graph its weights (binding.py) and its static
    dimensions (`fix_static_dims`, with `fixed`)."""
    _export(module, args, target.path, inputs, outputs, axes, target.opset)
    bind_weights(target.path, _weights(module), target.out, target.progress)
    fix_static_dims(target.path, target.facts, **fixed)


def _export(module, args, path, inputs, outputs, axes, opset) -> None:
    """Trace without the weights (binding.py gives them, one at a time): the graph reads them as inputs."""
    import torch

    with warnings.catch_warnings(), torch.no_grad(), shape_inference_without_weight_values():
        # The TorchScript exporter warns about tracing and its own deprecation on every call; none is actionable.
        warnings.simplefilter("ignore")
        torch.onnx.export(
            module,
            args,
            str(path),
            dynamo=False,
            input_names=inputs,
            output_names=outputs,
            dynamic_axes=axes,
            opset_version=opset,
            export_params=False,
            do_constant_folding=False,
        )


def graph_spec(path: Path, file_name: str) -> GraphSpec:
    """Input and output names, roles, dtypes and symbolic shapes of an ONNX file, read without its weights."""
    import onnx

    graph = onnx.load(str(path), load_external_data=False).graph
    return GraphSpec(
        file=file_name,
        inputs=[_tensor_spec(v) for v in graph.input],
        outputs=[_tensor_spec(v) for v in graph.output],
    )


def _tensor_spec(value: Any) -> TensorSpec:
    tensor = value.type.tensor_type
    shape: list[str | int] = [d.dim_param if d.dim_param else int(d.dim_value) for d in tensor.shape.dim]
    return TensorSpec(name=value.name, role=role_of(value.name), dtype=_DTYPES.get(tensor.elem_type, "?"), shape=shape)
