"""Tests of onnxmt.runtime."""
