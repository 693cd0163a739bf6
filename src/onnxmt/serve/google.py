"""Google Cloud Translation v2 ("basic"), as `google-cloud-translate`'s `translate_v2.Client` and curl users speak
it: `/language/translate/v2` (translate), `/language/translate/v2/languages`, `/language/translate/v2/detect`,
each by POST (JSON or a form) or GET (the query string; a repeated `q` is a list).

The key comes as `x-goog-api-key` (what the client sends) or `?key=` (what curl users send); when keys are on, a
missing or wrong one is 403 PERMISSION_DENIED. Errors are Google's `{"error": {"code", "message", "status"}}`
(serve/errors.py). `format` defaults to `text` here (Google's default is `html`, docs/apis.md).
"""

from __future__ import annotations

from typing import Any

from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from starlette.requests import Request
from starlette.routing import BaseRoute

from ..languages import LIBRETRANSLATE_NEW_CODES
from .apis import (
    check_key,
    count,
    detect_language,
    language_names,
    string_of,
    texts_of,
    translate_texts,
)
from .errors import error_responses
from .fields import read_fields
from .handlers import service_of
from .protocol import ApiError
from .schemas import json_body

# /languages' codes as Google names them.
GOOGLE_CODES = {"zh": "zh-CN", "zt": "zh-TW", "pb": "pt-BR"}
TWINS = set(LIBRETRANSLATE_NEW_CODES.values())  # zh-Hans, zh-Hant, pt-BR: listed as zh-CN, zh-TW, pt-BR already


def google_code(code: str) -> str:
    return GOOGLE_CODES.get(code, code)


async def _fields(request: Request) -> tuple[dict[str, Any], str | None]:
    """The request's fields once its key is right (the key is not one of them), and the key."""
    service = service_of(request)
    key = request.headers.get("x-goog-api-key") or request.query_params.get("key")
    fields = await read_fields(request)
    if key is None and isinstance(fields.data.get("key"), str):
        key = fields.data["key"]
    check_key(service, key, 403, "The request is missing a valid API key.")
    data = {k: v for k, v in fields.checked().items() if k != "key"}
    return data, key


async def translate(request: Request) -> JSONResponse:
    """`q` (a string or a list), `target`, `source` (none: detected), `format` (`text`, the default here, or
    `html`: markup kept), `model` (accepted, ignored)."""
    service = service_of(request)
    data, key = await _fields(request)
    texts = texts_of(data.get("q"), "q", service)
    target = string_of(data, "target")
    if target is None:
        raise ApiError(400, "Required Text: target")  # Google's own words for it
    source = string_of(data, "source")
    text_format = string_of(data, "format") or "text"
    if text_format not in ("text", "html"):
        raise ApiError(400, f"Invalid Value: format {text_format!r}; valid: text, html")
    string_of(data, "model")
    await count(request, service, key, sum(map(len, texts)))
    translated, detected = await translate_texts(request, texts, source, target, html=text_format == "html")
    shown: dict[str, Any] = {} if source else {"detectedSourceLanguage": google_code(detected or "")}
    return JSONResponse({"data": {"translations": [{"translatedText": t, **shown} for t in translated]}})


async def languages(request: Request) -> JSONResponse:
    """Every language the service translates from or into; with `target`, each with its (English) name."""
    service = service_of(request)
    data, _ = await _fields(request)
    named = string_of(data, "target") is not None
    sources, targets = language_names(service)
    listed = {google_code(code): name for code, name in [*sources, *targets] if code not in TWINS}
    entries = [{"language": code, **({"name": name} if named else {})} for code, name in listed.items()]
    return JSONResponse({"data": {"languages": entries}})


async def detect(request: Request) -> JSONResponse:
    """`q` (a string or a list): each text's language, confidence 0-1."""
    service = service_of(request)
    data, key = await _fields(request)
    texts = texts_of(data.get("q"), "q", service)
    await count(request, service, key, sum(map(len, texts)))
    detections = []
    for text in texts:
        language, confidence = await detect_language(request, text)
        detections.append([{"language": google_code(language), "confidence": confidence / 100, "isReliable": False}])
    return JSONResponse({"data": {"detections": detections}})


def _query(*names: str) -> list[dict[str, Any]]:
    return [{"name": n, "in": "query", "required": False, "schema": {"type": "string"}} for n in names]


TEXTS = {"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}]}
TEXT = {"type": "string"}
BASE = "/language/translate/v2"


def _route(path: str, endpoint: Any, *statuses: int, body: dict[str, Any] | None = None, query: tuple = ()) -> APIRoute:
    extra: dict[str, Any] = {"parameters": _query("key", *query)}
    if body is not None:
        extra["requestBody"] = body
    return APIRoute(
        path,
        endpoint,
        methods=["GET", "POST"],
        tags=["Google Cloud Translation v2"],
        responses=error_responses(path, *statuses),
        openapi_extra=extra,
    )


ROUTES: list[BaseRoute] = [
    _route(
        BASE,
        translate,
        400,
        403,
        413,
        429,
        503,
        504,
        body=json_body(
            ["q", "target"], {"q": TEXTS, "target": TEXT, "source": TEXT, "format": TEXT, "model": TEXT}, needed=False
        ),
    ),
    _route(f"{BASE}/languages", languages, 400, 403, 503, query=("target",)),
    _route(f"{BASE}/detect", detect, 400, 403, 413, 429, 503, body=json_body(["q"], {"q": TEXTS}, needed=False)),
]
