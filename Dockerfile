# The translation service: onnxruntime + FastAPI + uvicorn, no torch, no transformers.
#
#   docker build -t onnxmt .
#   docker run -p 5000:5000 -v "$PWD/opus-mt-en-zh-onnx:/model:ro" onnxmt
#
# The model directory (made by `onnxmt export`) is mounted at /model, or copied in by a two-line image:
#   FROM onnxmt
#   COPY opus-mt-en-zh-onnx /model
# Settings are ONNXMT_* variables (docs/serve.md), e.g. -e ONNXMT_API_KEYS=secret -e ONNXMT_MAX_BATCH_SIZE=32.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    ONNXMT_MODEL=/model \
    ONNXMT_HOST=0.0.0.0 \
    ONNXMT_PORT=5000

WORKDIR /src
COPY pyproject.toml README.md ./
COPY src ./src
# The base install is the run side; the serve extra adds FastAPI, uvicorn, prometheus-client, python-multipart.
RUN pip install ".[serve]" && rm -rf /src

RUN useradd --system --uid 10001 --no-create-home onnxmt
USER onnxmt
WORKDIR /

EXPOSE 5000
HEALTHCHECK --interval=30s --timeout=5s --start-period=60s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:' + os.environ.get('ONNXMT_PORT', '5000') + '/health', timeout=4)"]

# Exec form: the server is PID 1 and gets SIGTERM itself; it finishes the requests in flight and exits 0.
CMD ["onnxmt", "serve"]
