"""onnxmt: HuggingFace translation models on ONNX Runtime, without torch."""

from __future__ import annotations

__version__ = "0.1.0"
__all__ = ["__version__"]
