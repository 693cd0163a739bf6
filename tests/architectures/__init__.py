"""Tests of onnxmt.architectures."""
