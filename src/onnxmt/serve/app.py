"""The ASGI app: module-level handlers, one route list, error handlers, and `create_app`.

Every answer other than 200 is `{"error": "..."}` (LibreTranslate's shape) with its status code.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from functools import cache, partial
from importlib.resources import files
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import HTMLResponse, JSONResponse, Response
from fastapi.routing import APIRoute
from starlette.datastructures import UploadFile
from starlette.exceptions import HTTPException
from starlette.routing import BaseRoute
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .. import __version__
from ..runtime.options import DecodeOptions, RuntimeOptions
from .metrics import MetricsMiddleware
from .options import ServeOptions
from .protocol import ApiError, parse_translate
from .schemas import Language, TranslateAnswer, errors, request_body
from .service import Service

FORM_TYPES = ("application/x-www-form-urlencoded", "multipart/form-data")


def _service(request: Request) -> Service:
    service: Service = request.app.state.service
    return service


async def translate(request: Request) -> JSONResponse:
    """Translate a text or a list of texts (LibreTranslate's API; JSON or form body)."""
    service = _service(request)
    data, is_form = await _read_body(request)
    service.check_key(data.get("api_key"))
    answer = await service.translate(parse_translate(data, service.options, form=is_form), partial(_gone, request))
    return JSONResponse(answer)


async def _gone(request: Request) -> None:
    """Returns when the client has disconnected (the body is read by now: the next message is the disconnect)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def languages(request: Request) -> JSONResponse:
    """The languages this model translates from and into (LibreTranslate's shape)."""
    return JSONResponse(_service(request).libretranslate_languages())


async def info(request: Request) -> JSONResponse:
    """The model (manifest summary), decoding defaults, batching settings and limits."""
    return JSONResponse(_service(request).info())


async def health() -> JSONResponse:
    """Liveness: the process answers."""
    return JSONResponse({"status": "ok"})


async def ready(request: Request) -> JSONResponse:
    """Readiness: 200 once the model is loaded, 503 while loading and while shutting down."""
    service = _service(request)
    if service.ready:
        return JSONResponse({"ready": True})
    reason = "shutting down" if service.draining else service.error or "the model is still loading"
    return JSONResponse({"ready": False, "error": reason}, status_code=503)


async def metrics(request: Request) -> Response:
    """Prometheus metrics."""
    m = _service(request).metrics
    return Response(m.render(), media_type=m.content_type)


async def page() -> HTMLResponse:
    """A page to try translations."""
    return HTMLResponse(_page_html())


@cache
def _page_html() -> str:
    return (files("onnxmt.serve") / "static" / "index.html").read_text(encoding="utf-8")


ROUTES: list[BaseRoute] = [
    APIRoute(
        "/translate",
        translate,
        methods=["POST"],
        response_model=TranslateAnswer,
        responses=errors(400, 403, 413, 503, 504),
        openapi_extra=request_body(),
    ),
    APIRoute("/languages", languages, methods=["GET"], response_model=list[Language], responses=errors(503)),
    APIRoute("/info", info, methods=["GET"], responses=errors(503)),
    APIRoute("/health", health, methods=["GET"]),
    APIRoute("/ready", ready, methods=["GET"], responses=errors(503)),
    APIRoute("/metrics", metrics, methods=["GET"], response_class=Response),
    APIRoute("/", page, methods=["GET"], response_class=HTMLResponse, include_in_schema=False),
]


async def _read_body(request: Request) -> tuple[Mapping[str, Any], bool]:
    """The body as a mapping, and whether it was a form; ApiError 400 when it is neither a JSON object nor a form."""
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if content_type in FORM_TYPES:
        try:
            form = await request.form()
        except HTTPException as e:  # python-multipart's parse errors, as starlette reports them
            raise ApiError(400, f"Invalid request: malformed form ({e.detail})") from e
        data: dict[str, Any] = {}
        for key in form:
            values = form.getlist(key)
            if any(isinstance(v, UploadFile) for v in values):
                raise ApiError(400, f"Invalid request: {key} must be a form field, not a file")
            # A repeated q is a batch; any other repeated field keeps its last value.
            data[key] = values if key == "q" and len(values) > 1 else values[-1]
        return data, True
    if content_type not in ("", "application/json") and not content_type.endswith("+json"):
        raise ApiError(400, f"Invalid request: unsupported content type {content_type!r}; send JSON or a form")
    body = await request.body()
    try:
        data = json.loads(body)
    except ValueError as e:  # includes UnicodeDecodeError
        raise ApiError(400, f"Invalid request: malformed JSON ({e})") from e
    if not isinstance(data, dict):
        raise ApiError(400, "Invalid request: the body must be a JSON object")
    return data, False


class BodyTooLarge(Exception):
    pass


class BodyLimitMiddleware:
    """413 for bodies above the limit: at once when Content-Length says so, else as soon as the received bytes
    pass it (chunked uploads), without ever holding more than the limit in memory."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self.limit):
            status = 413 if length.isdigit() else 400
            await _error(status, self._message(int(length)) if status == 413 else "Invalid Content-Length")(
                scope, receive, send
            )
            return
        received = 0

        async def limited() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.limit:
                    raise BodyTooLarge(self._message(received))
            return message

        await self.app(scope, limited, send)

    def _message(self, size: int) -> str:
        return f"request body too large: {size} bytes or more, the limit is {self.limit}"


def _error(status: int, message: str, headers: Mapping[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status, headers=headers)


async def _api_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ApiError)
    return _error(exc.status, exc.message, exc.headers)


async def _too_large(request: Request, exc: Exception) -> JSONResponse:
    return _error(413, str(exc))


async def _http_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, HTTPException)
    return _error(exc.status_code, str(exc.detail), exc.headers)


async def _validation_error(request: Request, exc: Exception) -> JSONResponse:
    return _error(400, f"Invalid request: {exc}")


async def _internal_error(request: Request, exc: Exception) -> JSONResponse:
    # Starlette re-raises the exception after this answer, and uvicorn logs it with its traceback.
    return _error(500, "internal server error")


def create_app(
    model_dir: str | Path,
    options: ServeOptions,
    runtime: RuntimeOptions = RuntimeOptions(),
    decoding: DecodeOptions = DecodeOptions(),
) -> FastAPI:
    """The service as an ASGI app. The model loads when the app starts (its lifespan), not here."""
    service = Service(model_dir, options, runtime, decoding)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await service.start()
        yield
        await service.stop()

    app = FastAPI(
        title="onnxmt",
        version=__version__,
        description="Machine translation on ONNX Runtime, LibreTranslate-compatible.",
        routes=ROUTES,
        lifespan=lifespan,
        exception_handlers={
            ApiError: _api_error,
            BodyTooLarge: _too_large,
            HTTPException: _http_error,
            RequestValidationError: _validation_error,
            Exception: _internal_error,
        },
    )
    app.state.service = service
    app.add_middleware(BodyLimitMiddleware, limit=options.max_body_bytes)
    if options.cors_origins:
        app.add_middleware(CORSMiddleware, allow_origins=list(options.cors_origins), allow_methods=["GET", "POST"])
    # Added last, so outermost: it also counts what the inner middlewares answer themselves (413).
    paths = [getattr(route, "path", "") for route in app.routes]  # ours and FastAPI's /docs, /openapi.json
    app.add_middleware(MetricsMiddleware, metrics=service.metrics, paths=paths)
    return app
