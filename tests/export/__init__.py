"""Tests of onnxmt.export."""
