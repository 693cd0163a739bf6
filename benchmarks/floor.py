"""The bandwidth floor of a greedy batch-1 decoder step: the bytes of weights the step reads, from an onnxmt
directory's decoder graph, over the memory bandwidth measured in the same run (`machine.bandwidth`).

A step reads every initializer of the decoder graph but those only gathered from: the token embedding (and a
learned position table) give one row each. An encoder-decoder's cross-attention keys and values are the encoder
graph's outputs, computed once per sentence, so its decoder graph holds the decoder layers and the head only. A
tied head (a Gemm or MatMul reading the embedding a Gather reads too) is read whole at every step and counts.

`bench.py decoder` (decoder_bench.py) and `bench.py offline` (offline.py) both put it in their tables.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

GATHERS = ("Gather", "GatherBlockQuantized")


def step_bytes(directory: Path) -> dict[str, int]:
    """The bytes of an onnxmt directory's decoder-graph weights one batch-1 step reads ("read_per_step") and those
    only gathered from ("gathered")."""
    import onnx

    manifest = json.loads((directory / "onnxmt.json").read_text(encoding="utf-8"))
    graph = onnx.load(str(directory / manifest["graphs"]["decoder"]["file"]), load_external_data=False).graph
    consumers: dict[str, set[str]] = {}
    for node in graph.node:
        for name in node.input:
            consumers.setdefault(name, set()).add(node.op_type)
    read = gathered = 0
    for init in graph.initializer:
        size = next((int(e.value) for e in init.external_data if e.key == "length"), None)
        if size is None:
            size = len(init.raw_data) or 4 * len(init.float_data)
        ops = consumers.get(init.name, set())
        if ops and ops <= set(GATHERS):
            gathered += size
        else:
            read += size
    return {"read_per_step": read, "gathered": gathered}


def floor(graph: str, directory: Path, bandwidth: float) -> dict[str, Any]:
    """One bit width's floor: `directory`'s step bytes over `bandwidth` (bytes/s), in ms a step."""
    b = step_bytes(directory)
    return {"graph": graph, **b, "floor_ms": b["read_per_step"] / bandwidth * 1000}
