"""The ASGI app: module-level handlers, one route list, error handlers, and `create_app`.

Every answer other than 200 is `{"error": "..."}` (LibreTranslate's shape) with its status code; no input is meant
to give a 5xx (`guards.LastResortMiddleware` is the net for what slips through, and keeps the connection usable).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from functools import cache, partial
from importlib.resources import files
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse, Response
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException
from starlette.routing import BaseRoute, Route

from ..runtime.options import DecodeOptions, RuntimeOptions
from ..version import __version__
from .deepl import ROUTES as DEEPL_ROUTES
from .documents import ROUTES as DOCUMENT_ROUTES
from .documents import translate_html_request
from .google import ROUTES as GOOGLE_ROUTES
from .guards import (
    BodyLimitMiddleware,
    BodyTooLarge,
    LastResortMiddleware,
    PathMiddleware,
    SecurityHeadersMiddleware,
    csp_for,
    error,
)
from .handlers import authorize, gone, request_key, service_of
from .limits import charge
from .metrics import MetricsMiddleware
from .openai_chat import ROUTES as OPENAI_ROUTES
from .options import ServeOptions
from .protocol import ApiError, parse_detect, parse_translate
from .schemas import (
    DetectBody,
    DetectedLanguage,
    ErrorAnswer,
    FrontendSettings,
    Language,
    SuggestBody,
    TranslateAnswer,
    errors,
    request_body,
    translate_request,
)
from .service import Service

# LibreTranslate's answer to /suggest when suggestions are off (app.py `suggest`: 403).
SUGGESTIONS_OFF = "Suggestions are disabled on this server."
# Swagger UI's own files, served from the swagger-ui-bundle-v2 package (no CDN; the page works offline).
DOCS_ASSETS = {"swagger-ui-bundle.js": "text/javascript", "swagger-ui.css": "text/css"}


async def translate(request: Request) -> JSONResponse:
    """Translate a text or a list of texts (LibreTranslate's API): fields in a JSON body, a form (urlencoded or
    multipart) or the query string."""
    service = service_of(request)
    fields = await authorize(request, always=True)
    parsed = parse_translate(fields.checked(), service.options, form=fields.form)
    await charge(request, service.quota, request_key(request, fields), sum(map(len, parsed.texts)))
    if parsed.format == "html":
        return JSONResponse(await translate_html_request(service, parsed, partial(gone, request)))
    answer = await service.translate(parsed, partial(gone, request), cut=True)
    return JSONResponse(answer)


async def detect(request: Request) -> JSONResponse:
    """The language of a text: candidates, most confident first (LibreTranslate's API; JSON, form or query string)."""
    service = service_of(request)
    fields = await authorize(request, always=True)
    text = parse_detect(fields.checked(), service.options)
    await charge(request, service.quota, request_key(request, fields), len(text))
    return JSONResponse([d.libretranslate() for d in await service.detect(text)])


async def languages(request: Request) -> Response:
    """The languages the service translates from and into, over all its models (LibreTranslate's shape)."""
    await authorize(request)
    return Response(service_of(request).listing("languages"), media_type="application/json")


async def frontend(request: Request) -> Response:
    """What LibreTranslate's web UI reads first: the limits, whether keys are on, the file formats, and the
    languages to start with (LibreTranslate's `/frontend/settings`)."""
    await authorize(request)
    return Response(service_of(request).listing("frontend"), media_type="application/json")


async def suggest(request: Request) -> JSONResponse:
    """LibreTranslate's `/suggest` (a better translation, sent by its web UI): onnxmt keeps no suggestions, so
    it answers as LibreTranslate does with suggestions off."""
    await authorize(request)  # reads the body too, so the connection stays usable
    raise ApiError(403, SUGGESTIONS_OFF)


async def info(request: Request) -> JSONResponse:
    """The models (manifest summaries, loaded or not, languages), routing, cache, decoding defaults, batching
    settings and limits."""
    await authorize(request)
    return JSONResponse(service_of(request).info())


async def health() -> JSONResponse:
    """Liveness: the process answers."""
    return JSONResponse({"status": "ok"})


async def ready(request: Request) -> JSONResponse:
    """Readiness: 200 once the model is loaded (several models: once they are opened; each loads on its first
    request), 503 while loading and while shutting down."""
    service = service_of(request)
    if service.ready:
        return JSONResponse({"ready": True})
    reason = "shutting down" if service.draining else service.public_error or "the model is still loading"
    return JSONResponse({"ready": False, "error": reason}, status_code=503)


async def metrics(request: Request) -> Response:
    """Prometheus metrics."""
    await authorize(request)
    m = service_of(request).metrics
    return Response(m.render(), media_type=m.content_type)


async def page(request: Request) -> HTMLResponse:
    """A page to try translations."""
    await authorize(request)
    html = _page_html()
    return HTMLResponse(html, headers={"Content-Security-Policy": csp_for(html)})


async def favicon(request: Request) -> Response:
    """The page's icon (browsers ask for /favicon.ico whatever the page says): public, like /docs' assets."""
    return Response(_favicon(), media_type="image/x-icon", headers={"Cache-Control": "public, max-age=86400"})


async def openapi(request: Request) -> JSONResponse:
    await authorize(request)
    return JSONResponse(request.app.openapi())


async def docs(request: Request) -> HTMLResponse:
    """Swagger UI, from the installed swagger-ui-bundle-v2 package; 404 when it is not installed."""
    await authorize(request)
    if _swagger_dir() is None:
        raise ApiError(404, "API docs need the swagger-ui-bundle-v2 package; /openapi.json has the API")
    root = request.scope.get("root_path", "")
    html = DOCS_HTML.format(root=root, openapi=json.dumps(f"{root}/openapi.json"))
    return HTMLResponse(html, headers={"Content-Security-Policy": csp_for(html, inline_style_attributes=True)})


async def docs_asset(request: Request) -> Response:
    """Swagger UI's script and stylesheet: public files of a public package, so never behind the key."""
    name = request.path_params["name"]
    directory = _swagger_dir()
    if directory is None or name not in DOCS_ASSETS:
        raise ApiError(404, "Not Found")
    return FileResponse(directory / name, media_type=DOCS_ASSETS[name], headers={"Cache-Control": "max-age=86400"})


DOCS_HTML = """<!doctype html>
<html lang="en">
<head><meta charset="utf-8"><title>onnxmt API</title><link rel="stylesheet" href="{root}/docs/swagger-ui.css"></head>
<body><div id="swagger-ui"></div><script src="{root}/docs/swagger-ui-bundle.js"></script>
<script>SwaggerUIBundle({{url: {openapi} + location.search, dom_id: "#swagger-ui", validatorUrl: null}});</script>
</body>
</html>
"""


@cache
def _page_html() -> str:
    return (files("onnxmt.serve") / "static" / "index.html").read_text(encoding="utf-8")


@cache
def _favicon() -> bytes:
    return (files("onnxmt.serve") / "static" / "favicon.ico").read_bytes()


@cache
def _swagger_dir() -> Path | None:
    try:
        from swagger_ui_bundle import swagger_ui_path
    except ImportError:
        return None
    directory = Path(str(swagger_ui_path))
    return directory if all((directory / name).is_file() for name in DOCS_ASSETS) else None


ROUTES: list[BaseRoute] = [
    APIRoute(
        "/translate",
        translate,
        methods=["POST"],
        response_model=TranslateAnswer,
        responses=errors(400, 403, 413, 503, 504),
        openapi_extra=translate_request(),
    ),
    APIRoute(
        "/detect",
        detect,
        methods=["POST"],
        response_model=list[DetectedLanguage],
        responses=errors(400, 403, 413, 503),
        openapi_extra=request_body(DetectBody, query=True),
    ),
    *DOCUMENT_ROUTES,
    APIRoute("/languages", languages, methods=["GET"], response_model=list[Language], responses=errors(403, 503)),
    APIRoute(
        "/frontend/settings",
        frontend,
        methods=["GET"],
        response_model=FrontendSettings,
        responses=errors(403, 503),
    ),
    APIRoute(
        "/suggest",
        suggest,
        methods=["POST"],
        responses={403: {"model": ErrorAnswer, "description": SUGGESTIONS_OFF}, **errors(413)},
        openapi_extra=request_body(SuggestBody, query=True),
    ),
    APIRoute("/info", info, methods=["GET"], responses=errors(403, 503)),
    APIRoute("/health", health, methods=["GET"]),
    APIRoute("/ready", ready, methods=["GET"], responses=errors(503)),
    APIRoute("/metrics", metrics, methods=["GET"], response_class=Response, responses=errors(403)),
    APIRoute("/", page, methods=["GET"], response_class=HTMLResponse, include_in_schema=False),
    Route("/favicon.ico", favicon, methods=["GET"]),
    APIRoute("/openapi.json", openapi, methods=["GET"], include_in_schema=False),
    APIRoute("/docs", docs, methods=["GET"], response_class=HTMLResponse, include_in_schema=False),
    Route("/docs/{name}", docs_asset, methods=["GET"]),
    # The APIs of other services, over the same translations (docs/apis.md).
    *DEEPL_ROUTES,
    *GOOGLE_ROUTES,
    *OPENAI_ROUTES,
]


async def _api_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ApiError)
    return error(exc.status, exc.message, exc.headers, path=request.scope["path"])


async def _too_large(request: Request, exc: Exception) -> JSONResponse:
    return error(413, str(exc), path=request.scope["path"])


async def _http_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, HTTPException)
    return error(exc.status_code, str(exc.detail), exc.headers, path=request.scope["path"])


def create_app(
    model_dirs: str | Path | Sequence[str | Path],
    options: ServeOptions,
    runtime: RuntimeOptions = RuntimeOptions(),
    decoding: DecodeOptions = DecodeOptions(),
) -> FastAPI:
    """The service as an ASGI app, for one model directory or several (or directories of them). Models open when
    the app starts (its lifespan), not here."""
    service = Service(model_dirs, options, runtime, decoding)

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
        docs_url=None,  # ours: Swagger UI from the installed package, behind the key with protect_all
        redoc_url=None,
        openapi_url=None,
        exception_handlers={ApiError: _api_error, BodyTooLarge: _too_large, HTTPException: _http_error},
    )
    app.state.service = service
    # Each add_middleware wraps the app built so far: the last added is the outermost.
    app.add_middleware(BodyLimitMiddleware, limit=options.max_body_bytes)
    app.add_middleware(LastResortMiddleware)
    if options.cors_origins:
        app.add_middleware(CORSMiddleware, allow_origins=list(options.cors_origins), allow_methods=["GET", "POST"])
    # Outside the inner middlewares, so it also counts what they answer themselves (413, 500).
    paths = [getattr(route, "path", "") for route in app.routes]
    app.add_middleware(MetricsMiddleware, metrics=service.metrics, paths=paths)
    app.add_middleware(SecurityHeadersMiddleware)
    app.add_middleware(PathMiddleware)  # first of all, so routes and metrics see the path as written here
    return app
