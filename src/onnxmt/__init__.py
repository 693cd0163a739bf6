"""onnxmt: HuggingFace translation models on ONNX Runtime, without torch.

from onnxmt import Translator
translator = Translator("opus-mt-en-zh-onnx")
print(translator.translate(["Hello world"])[0].text)
"""

from __future__ import annotations

from .manifest import Manifest, ModelDirError
from .models import Translator
from .runtime.options import BatchLimits, CallOptions, DecodeOptions, RuntimeOptions
from .runtime.translator import ModelInput, Translation
from .version import __version__

__all__ = [
    "BatchLimits",
    "CallOptions",
    "DecodeOptions",
    "Manifest",
    "ModelDirError",
    "ModelInput",
    "RuntimeOptions",
    "Translation",
    "Translator",
    "__version__",
]
