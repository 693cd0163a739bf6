"""Build side: export, validate, quantize. Needs the `onnxmt[export]` extra (torch, transformers, onnx)."""
