"""The vocabulary ops shipped under runtime/ops are exactly what export/ops.py builds."""

from __future__ import annotations

from tests.helpers.skips import importorskip

importorskip("onnx")

from onnxmt.export.ops import OPS_DIR, build_ops  # noqa: E402


def test_shipped_ops_match_their_builder() -> None:
    built = build_ops()
    assert sorted(p.name for p in OPS_DIR.glob("*.onnx")) == sorted(built)
    for name, data in built.items():
        assert (OPS_DIR / name).read_bytes() == data, f"{name} is stale: run python -m onnxmt.export.ops"
