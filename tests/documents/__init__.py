"""Tests of onnxmt.documents."""
