"""Tests of onnxmt.serve."""
