"""The HTTP service: `onnxmt serve MODEL_DIR` (extra: onnxmt[serve]).

A LibreTranslate-compatible API on FastAPI + uvicorn, with micro-batching of concurrent requests, bounded queues,
limits, API keys, Prometheus metrics and graceful shutdown. Run side only: never imports torch or transformers.
`onnxmt.serve.app.create_app` builds the ASGI app; `onnxmt.serve.server.run` serves it. Importing this package
does nothing but define `ServeOptions`.
"""

from __future__ import annotations

from .options import ServeOptions

__all__ = ["ServeOptions"]
