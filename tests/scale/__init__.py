"""Tests of onnxmt.scale."""
