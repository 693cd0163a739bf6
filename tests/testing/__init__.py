"""Tests of onnxmt.testing."""
