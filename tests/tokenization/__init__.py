"""Tests of onnxmt.tokenization."""
