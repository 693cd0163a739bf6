"""The quantizers run on one group of nodes at a time (export/groups.py). The result must be what they give on all
the nodes at once, as `onnxmt quantize` ran them before: the same bytes in weights.bin, the same translations."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from onnxmt.export import quantize as quantize_module
from onnxmt.export.quantize import QuantizeOptions, quantize
from onnxmt.manifest import WEIGHTS_FILE
from onnxmt.runtime.translator import Translator

TEXTS = ["The river is long and the mountain is high", "Where is the doctor?", "Tom is reading a letter."]
FORMS = {
    "int8": QuantizeOptions(),
    "int8-per-row": QuantizeOptions(per_row_scales=True),
    "int8-per-tensor": QuantizeOptions(per_channel=False),
    "int4": QuantizeOptions(int4=True),
}


def _all_at_once(graph: Any, nodes: list[str], by_input: bool) -> list[list[Any]]:
    chosen = set(nodes)
    return [[node for node in graph.node if node.name in chosen]]


@pytest.mark.parametrize("form", sorted(FORMS))
def test_quantizing_by_groups_gives_what_all_nodes_at_once_give(form: str, tiny_onnx_dir: Path, tmp_path: Path) -> None:
    grouped, whole = tmp_path / "groups", tmp_path / "at-once"
    counts: list[int] = []
    real = quantize_module.groups

    def counted(graph: Any, nodes: list[str], by_input: bool) -> list[list[Any]]:
        found = real(graph, nodes, by_input)
        counts.append(len(found))
        return found

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(quantize_module, "groups", counted)
        quantize(tiny_onnx_dir, grouped, FORMS[form], progress=lambda _: None)
    assert min(counts) > 4  # the tiny model's layers make many groups of each graph
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(quantize_module, "groups", _all_at_once)
        quantize(tiny_onnx_dir, whole, FORMS[form], progress=lambda _: None)
    assert (grouped / WEIGHTS_FILE).read_bytes() == (whole / WEIGHTS_FILE).read_bytes()
    expected = [t.token_ids for t in Translator(whole).translate(TEXTS)]
    assert [t.token_ids for t in Translator(grouped).translate(TEXTS)] == expected
    assert len({len(ids) for ids in expected}) > 1


def test_int4_in_slices_gives_the_same_bytes(tiny_onnx_dir: Path, tmp_path: Path) -> None:
    """int4 quantizes a large weight a slice at a time (rows of a Gather's table, columns of a MatMul's weight),
    and transposes the tied head's table a block at a time: forced on the tiny model, the same bytes as whole."""
    from onnxmt.export import groups as groups_module
    from onnxmt.export.weights import Reader

    whole, sliced = tmp_path / "whole", tmp_path / "sliced"
    quantize(tiny_onnx_dir, whole, FORMS["int4"], progress=lambda _: None)
    calls: dict[str, int] = {}
    real = groups_module._quantize_slices

    def counted(model: Any, node: Any, *args: Any) -> Any:
        calls[node.op_type] = calls.get(node.op_type, 0) + 1
        return real(model, node, *args)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(quantize_module, "_SPLIT_BYTES", 16 << 10)  # slices of 16 KB of the 2-8 MB tables
        patch.setattr(Reader, "BLOCK", 64 << 10)  # the transposed head written and read in many blocks
        patch.setattr(groups_module, "_quantize_slices", counted)
        quantize(tiny_onnx_dir, sliced, FORMS["int4"], progress=lambda _: None)
    assert calls.get("Gather", 0) >= 1 and calls.get("MatMul", 0) >= 1, calls  # the table and the head
    assert (sliced / WEIGHTS_FILE).read_bytes() == (whole / WEIGHTS_FILE).read_bytes()
    expected = [t.token_ids for t in Translator(whole).translate(TEXTS)]
    assert [t.token_ids for t in Translator(sliced).translate(TEXTS)] == expected
