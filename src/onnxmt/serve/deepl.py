"""DeepL API v2, as the `deepl` client libraries, Weblate's DeepL backend and Nextcloud's integration speak it:
`POST /v2/translate`, `GET /v2/languages`, `GET /v2/usage`, and the glossary routes, which refuse (docs/apis.md).

The key comes as `Authorization: DeepL-Auth-Key KEY` (or DeepL's older `auth_key` field); a wrong one is 403.
Errors are DeepL's `{"message": ...}` (serve/errors.py); the day's characters spent is DeepL's 456.
DeepL's codes (`EN-US`, `PT-BR`, `ZH-HANS`) are read as `/translate` reads codes.
"""

from __future__ import annotations

from typing import Any

from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from starlette.requests import Request
from starlette.routing import BaseRoute

from .apis import (
    check_key,
    count,
    header_key,
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

QUOTA_EXCEEDED = 456  # DeepL's status for a spent character quota
NO_LIMIT = 10**12  # /v2/usage's character_limit when there is none (clients read a number)
GLOSSARIES_REFUSED = (
    "Glossaries are not supported: this server's models cannot apply glossary entries "
    "(GET /v2/glossary-language-pairs lists the pairs that support them: none)"
)
# Fields of /v2/translate that steer DeepL's own models; accepted and ignored here.
IGNORED = (
    "formality",
    "split_sentences",
    "preserve_formatting",
    "outline_detection",
    "non_splitting_tags",
    "splitting_tags",
    "ignore_tags",
    "context",
    "model_type",
    "show_billed_characters",
    "tag_handling_version",
    "custom_instructions",
)


async def _fields(request: Request) -> tuple[dict[str, Any], str | None]:
    """The request's fields (JSON, a form, or the query string; a repeated `text` as a list) once its key is
    right, and the key."""
    service = service_of(request)
    key = header_key(request, "DeepL-Auth-Key")
    if key is None and isinstance(request.query_params.get("auth_key"), str):
        key = request.query_params["auth_key"]
    fields = await read_fields(request)
    if key is None and isinstance(fields.data.get("auth_key"), str):
        key = fields.data["auth_key"]
    check_key(service, key, 403, "Wrong authentication key: send Authorization: DeepL-Auth-Key KEY")
    data = dict(fields.checked())
    if fields.form:  # a form's (or query string's) repeated text is a list, as DeepL reads it
        texts = request.query_params.getlist("text")
        if request.headers.get("content-type", "").startswith(("application/x-www-form", "multipart/")):
            form = await request.form()  # parsed once: starlette keeps it
            texts += [t for t in form.getlist("text") if isinstance(t, str)]
        if len(texts) > 1:
            data["text"] = texts
    return data, key


def _code(code: str | None) -> str | None:
    """A DeepL code as `/translate` reads codes (`EN-US`, `ZH-HANS`); None for none."""
    return None if code is None else code.strip().lower() or None


async def translate(request: Request) -> JSONResponse:
    """DeepL's `POST /v2/translate`: `text` (a string or a list), `target_lang`, `source_lang` (none: detected),
    `tag_handling` (`html`, `xml`: markup kept), `glossary_id` (none exist: 404)."""
    service = service_of(request)
    data, key = await _fields(request)
    texts = texts_of(data.get("text"), "text", service)
    target = string_of(data, "target_lang")
    if target is None:
        raise ApiError(400, "Parameter 'target_lang' not specified")
    source = string_of(data, "source_lang")
    tags = string_of(data, "tag_handling")
    if tags not in (None, "html", "xml"):
        raise ApiError(400, f"Value for 'tag_handling' not supported: {tags!r}; valid: html, xml")
    glossary = string_of(data, "glossary_id")
    if glossary is not None:
        raise ApiError(404, f"Glossary not found: {glossary} ({GLOSSARIES_REFUSED})")
    for name in IGNORED:  # ignored, but not any type: a list where text is expected is a client's bug
        if isinstance(data.get(name), dict):
            raise ApiError(400, f"{name} must not be an object")
    await count(request, service, key, sum(map(len, texts)), daily_status=QUOTA_EXCEEDED)
    translated, detected = await translate_texts(request, texts, _code(source), _code(target), html=tags is not None)
    language = (detected or source or "").split("-")[0].upper()
    return JSONResponse(
        {
            "translations": [
                {"detected_source_language": language, "text": text, "billed_characters": len(given)}
                for text, given in zip(translated, texts, strict=True)
            ]
        }
    )


def deepl_codes(code: str) -> list[str]:
    """The DeepL codes a /languages target code is listed by: upper case, LibreTranslate's own codes (`zt`, `pb`)
    left to their BCP-47 twins, and English and Portuguese by region as DeepL lists them."""
    if code in ("zt", "pb"):
        return []
    if code == "en":
        return ["EN-GB", "EN-US"]
    if code == "pt":
        return ["PT-PT", "PT-BR"]
    return [code.upper()]


async def languages(request: Request) -> JSONResponse:
    """DeepL's `GET /v2/languages`: `type` `source` (the default) or `target`, from the query string or a form
    body (the `deepl` client sends it in the body of its GET)."""
    service = service_of(request)
    data, _ = await _fields(request)
    kind = string_of(data, "type") or "source"
    if kind not in ("source", "target"):
        raise ApiError(400, f"Value for 'type' not supported: {kind!r}; valid: source, target")
    sources, targets = language_names(service)
    if kind == "source":
        seen = dict.fromkeys((code.split("-")[0].upper(), name) for code, name in sources if code not in ("zt", "pb"))
        listed: list[dict[str, Any]] = [{"language": code, "name": name} for code, name in seen]
    else:
        listed = [
            {"language": deepl, "name": name, "supports_formality": False}
            for code, name in targets
            for deepl in deepl_codes(code)
        ]
    return JSONResponse(list({entry["language"]: entry for entry in listed}.values()))


async def usage(request: Request) -> JSONResponse:
    """DeepL's `GET /v2/usage`: the characters counted today for the key (its address without keys) and the day's
    limit (`--daily-char-limit`, or the key's own; 10^12 when there is none)."""
    service = service_of(request)
    _, key = await _fields(request)
    address = request.client.host if request.client else None
    used, limit = service.quota.used_today(key, address)
    return JSONResponse({"character_count": used, "character_limit": limit or NO_LIMIT})


async def glossary_pairs(request: Request) -> JSONResponse:
    """DeepL's `GET /v2/glossary-language-pairs`: none (no model here can apply glossary entries)."""
    await _fields(request)
    return JSONResponse({"supported_languages": []})


async def glossaries(request: Request) -> JSONResponse:
    """DeepL's `GET /v2/glossaries` (none) and `POST /v2/glossaries` (refused: 400)."""
    await _fields(request)
    if request.method == "POST":
        raise ApiError(400, GLOSSARIES_REFUSED)
    return JSONResponse({"glossaries": []})


async def glossary(request: Request) -> JSONResponse:
    """DeepL's `/v2/glossaries/{id}` and `/v2/glossaries/{id}/entries`: none exists (404)."""
    await _fields(request)
    raise ApiError(404, f"Glossary not found: {request.path_params['glossary_id'][:100]}")


def _route(path: str, endpoint: Any, methods: list[str], *statuses: int, **extra: Any) -> APIRoute:
    return APIRoute(
        path, endpoint, methods=methods, tags=["DeepL API v2"], responses=error_responses(path, *statuses), **extra
    )


TRANSLATE_BODY = {
    "requestBody": json_body(
        ["text", "target_lang"],
        {
            "text": {"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}]},
            "target_lang": {"type": "string"},
            "source_lang": {"type": "string"},
            "tag_handling": {"type": "string", "enum": ["html", "xml"]},
            "glossary_id": {"type": "string"},
        },
    )
}
GLOSSARY_ID = {"parameters": [{"name": "glossary_id", "in": "path", "required": True, "schema": {"type": "string"}}]}

ROUTES: list[BaseRoute] = [
    _route("/v2/translate", translate, ["POST"], 400, 403, 404, 413, 429, 456, 503, 504, openapi_extra=TRANSLATE_BODY),
    _route("/v2/languages", languages, ["GET", "POST"], 400, 403, 503),
    _route("/v2/usage", usage, ["GET", "POST"], 400, 403),
    _route("/v2/glossary-language-pairs", glossary_pairs, ["GET"], 400, 403),
    _route("/v2/glossaries", glossaries, ["GET", "POST"], 400, 403, 413),
    _route("/v2/glossaries/{glossary_id}", glossary, ["GET", "DELETE"], 400, 403, 404, openapi_extra=GLOSSARY_ID),
    _route("/v2/glossaries/{glossary_id}/entries", glossary, ["GET"], 400, 403, 404, openapi_extra=GLOSSARY_ID),
]
