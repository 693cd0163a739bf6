"""The package's version, in a module of its own: export records it in manifests and the service reports it, and
neither should import the package's public face (onnxmt/__init__.py) to read it."""

__version__ = "0.1.0"
