"""Tests of onnxmt.cli."""
