"""Documents in the service: `format: "html"` in /translate, LibreTranslate's `POST /translate_file` and
`GET /download_file/{name}`, and `POST /translate/stream` (Server-Sent Events, sentence by sentence).

Every sentence goes through `Service.translate`, so documents get the same checks, limits, micro-batching and
errors as /translate: a document's sentences are sent in chunks that each stay under --max-request-cost.
An upload is limited by --max-body-bytes (413 above it, as for any body).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from fastapi.responses import FileResponse, JSONResponse, Response, StreamingResponse
from fastapi.routing import APIRoute
from starlette.datastructures import UploadFile
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.routing import BaseRoute

from ..documents.files import FORMATS, prepare
from ..documents.html import prepare_html
from ..documents.segment import Piece, join, separator
from ..documents.translate import layout
from ..runtime.translator import Translator
from .fields import read_fields
from .protocol import ApiError, TranslateRequest, parse_translate
from .schemas import ErrorAnswer, errors, translate_request
from .service import Service

Disconnected = Callable[[], Awaitable[object]] | None
# Translated files are kept this long for their download, then removed at the next upload.
KEEP_SECONDS = 3600
# The names this module gives translated files: a random hex id, a dot, the upload's own (cleaned) name.
STORED_NAME = re.compile(r"[0-9a-f]{32}\.[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
MEDIA_TYPES = {
    "text": "text/plain; charset=utf-8",
    "srt": "application/x-subrip; charset=utf-8",
    "vtt": "text/vtt; charset=utf-8",
    "html": "text/html; charset=utf-8",
    "markdown": "text/markdown; charset=utf-8",
    "docx": "application/vnd.openxmlformats-officedocument.wordprocessingml.document",
}


def _service(request: Request) -> Service:
    service: Service = request.app.state.service
    return service


async def translate_sentences(
    service: Service, request: TranslateRequest, texts: list[str], disconnected: Disconnected = None
) -> tuple[list[str], Any]:
    """`texts` translated sentence by sentence through `service` (in chunks under the cost limit); and the
    detected source language of the first chunk, when the request asked for detection. A document has no
    alternatives: `alternatives` is ignored."""
    request = replace(request, alternatives=0)
    layouts = await _layouts(service, request, texts)
    sentences = [p.text for pieces in layouts for p in pieces if p.translate]
    translated: list[str] = []
    detected = None
    for chunk in await _chunks(service, request, sentences):
        answer = await service.translate(replace(request, texts=chunk, batch=True), disconnected)
        translated += answer["translatedText"]
        if detected is None and "detectedLanguage" in answer:
            detected = answer["detectedLanguage"][0]
    out, position = [], 0
    for pieces in layouts:
        n = sum(p.translate for p in pieces)
        out.append(join(pieces, translated[position : position + n]))
        position += n
    return out, detected


@contextlib.asynccontextmanager
async def _first_model(service: Service, request: TranslateRequest) -> AsyncIterator[tuple[Translator, str | None]]:
    """The translator that reads the request's source (the first of a pivot's two), and its target_lang: its
    tokenizer decides where sentences too long for it are cut, and what a sentence costs."""
    catalog, pool = service._require_ready()
    _, source = await service._source(catalog, request)
    leg = catalog.route(source, request.target).legs[0]
    async with pool.use(leg.entry) as (translator, _):
        yield translator, leg.target_lang


async def _layouts(service: Service, request: TranslateRequest, texts: list[str]) -> list[list[Piece]]:
    async with _first_model(service, request) as (translator, target_lang):
        try:
            return await asyncio.to_thread(lambda: [layout(translator, t, target_lang) for t in texts])
        except ValueError as e:
            raise ApiError(400, str(e)) from e


async def _chunks(service: Service, request: TranslateRequest, sentences: list[str]) -> list[list[str]]:
    """`sentences` cut into consecutive requests, each under the request cost and text limits."""
    async with _first_model(service, request) as (translator, target_lang):
        options = service._decode_options(translator, target_lang, request, 0, request.source)
        costs = await asyncio.to_thread(lambda: [translator.cost([s], **vars(options)) for s in sentences])
    limit = service.options.max_request_cost or None
    chunks: list[list[str]] = []
    total = 0
    for sentence, cost in zip(sentences, costs, strict=True):
        full = chunks and len(chunks[-1]) >= service.options.max_texts
        if not chunks or full or (limit is not None and total + cost > limit):
            chunks.append([])
            total = 0
        chunks[-1].append(sentence)
        total += cost
    return chunks


async def translate_html_request(service: Service, request: TranslateRequest, disconnected: Disconnected) -> Any:
    """/translate with `format: "html"`: each text a page or fragment, its markup kept (documents/html.py)."""
    service._require_ready()
    try:
        jobs = await asyncio.to_thread(lambda: [prepare_html(text) for text in request.texts])
    except ValueError as e:
        raise ApiError(400, f"Invalid request: {e}") from e
    units = [text for texts, _ in jobs for text in texts]
    translated, detected = await translate_sentences(service, request, units, disconnected)
    pages, position = [], 0
    for texts, rebuild in jobs:
        pages.append(rebuild(translated[position : position + len(texts)]))
        position += len(texts)
    body: dict[str, Any] = {"translatedText": pages if request.batch else pages[0]}
    if detected is not None:
        body["detectedLanguage"] = [detected] * len(pages) if request.batch else detected
    return body


# --- files ------------------------------------------------------------------------------------------------------


async def translate_file(request: Request) -> JSONResponse:
    """Translate an uploaded file (LibreTranslate's API: multipart fields `file`, `source`, `target`, `api_key`);
    the answer's `translatedFileUrl` downloads the translation. Formats by extension: .txt, .srt, .vtt, .html,
    .htm, .md, .docx."""
    service = _service(request)
    query_key = request.query_params.get("api_key")
    if service.options.api_keys and query_key is not None:
        service.check_key(query_key)
    fields, upload = await _upload(request)
    if service.options.api_keys and query_key is None:
        service.check_key(fields.get("api_key"))
    if upload is None:
        raise ApiError(400, "Invalid request: missing file parameter (a multipart upload named file)")
    filename = Path(upload.filename or "").name
    if not filename:
        raise ApiError(400, "Invalid request: empty file name")
    kind = FORMATS.get(Path(filename).suffix.lower())
    if kind is None:
        raise ApiError(400, f"Invalid request: file format not supported; valid extensions: {', '.join(FORMATS)}")
    parsed = parse_translate({**fields, "q": ""}, service.options, form=True)
    data = await upload.read()
    service._require_ready()
    try:
        texts, rebuild = await asyncio.to_thread(prepare, data, kind)
    except (ValueError, ImportError) as e:
        raise ApiError(400, f"Invalid request: cannot read {filename}: {e}") from e
    translated, _ = await translate_sentences(service, parsed, texts)
    result = await asyncio.to_thread(rebuild, translated)
    name = f"{uuid.uuid4().hex}.{_clean(filename)}"
    await asyncio.to_thread(_store, request, name, result)
    return JSONResponse({"translatedFileUrl": str(request.url_for("download_file", filename=name))})


async def _upload(request: Request) -> tuple[dict[str, Any], UploadFile | None]:
    """The form's fields (text values only) and its `file`; 400 for a body that is not a multipart form."""
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if content_type != "multipart/form-data":
        raise ApiError(400, "Invalid request: send the file as multipart/form-data, in a field named file")
    try:
        form = await request.form()
    except HTTPException as e:
        raise ApiError(400, f"Invalid request: malformed form ({e.detail})") from e
    fields: dict[str, Any] = {}
    upload = None
    for key, value in form.multi_items():
        if isinstance(value, UploadFile):
            if key != "file":
                raise ApiError(400, f"Invalid request: {key} must be a form field, not a file")
            upload = value
        elif key == "file":
            raise ApiError(400, "Invalid request: file must be a file upload, not a form field")
        else:
            fields[key] = value
    for key in ("source", "target", "format", "api_key", "beams", "max_new_tokens"):
        field = fields.get(key)
        if isinstance(field, str) and not _encodable(field):
            raise ApiError(400, f"Invalid request: {key} is not valid Unicode text")
    return {k: v for k, v in fields.items() if k in ("source", "target", "api_key", "beams", "max_new_tokens")}, upload


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _clean(filename: str) -> str:
    """A file name safe to store and to put in a URL: letters, digits, dot, dash, underscore."""
    stem, suffix = Path(filename).stem, Path(filename).suffix.lower()
    cleaned = re.sub(r"[^A-Za-z0-9._-]+", "_", stem).strip("._-")[:80] or "file"
    return f"{cleaned}{suffix}"


def _directory(request: Request) -> Path:
    directory: Path | None = getattr(request.app.state, "translated_files", None)
    if directory is None:
        directory = Path(tempfile.mkdtemp(prefix="onnxmt-translated-"))
        request.app.state.translated_files = directory
    return directory


def _store(request: Request, name: str, data: bytes) -> None:
    directory = _directory(request)
    now = time.time()
    for old in directory.iterdir():
        if now - old.stat().st_mtime > KEEP_SECONDS:
            old.unlink(missing_ok=True)
    (directory / name).write_bytes(data)


async def download_file(request: Request) -> Response:
    """A translated file, by the name `translatedFileUrl` gave (kept for an hour)."""
    service = _service(request)
    if service.options.protect_all:
        fields = await read_fields(request)
        service.check_key(request.query_params.get("api_key") or fields.data.get("api_key"))
    name = request.path_params["filename"]
    directory: Path | None = getattr(request.app.state, "translated_files", None)
    # Only names this module made: nothing else on the disk can be named.
    if not STORED_NAME.fullmatch(name) or directory is None or not (directory / name).is_file():
        raise ApiError(404, "file not found (translated files are kept for an hour)")
    kind = FORMATS.get(Path(name).suffix.lower(), "text")
    download = name.split(".", 1)[1]
    return FileResponse(directory / name, media_type=MEDIA_TYPES[kind], filename=download)


# --- streams ----------------------------------------------------------------------------------------------------


async def translate_stream(request: Request) -> Response:
    """Translate one text (`q`, a string; fields as /translate's) as Server-Sent Events: `data: {"translatedText":
    piece}` for each sentence as soon as it is translated (with what separates it from the one before), then
    `event: done` with the whole translation. An error before the first sentence is an ordinary error answer; one
    after it, an `event: error` with `{"error", "status"}`."""
    service = _service(request)
    query_key = request.query_params.get("api_key")
    if service.options.api_keys and query_key is not None:
        service.check_key(query_key)
    fields = await read_fields(request)
    if service.options.api_keys and query_key is None:
        service.check_key(fields.data.get("api_key"))
    parsed = parse_translate(fields.checked(), service.options, form=fields.form)
    if parsed.batch:
        raise ApiError(400, "Invalid request: /translate/stream translates one text: q must be a string")
    if parsed.format != "text":
        raise ApiError(400, "Invalid request: /translate/stream translates text; format must be text")
    parsed = replace(parsed, alternatives=0)
    catalog, _ = service._require_ready()
    _, source = await service._source(catalog, parsed)
    # The text's language detected once, on the whole text: its sentences are translated from it, not each from
    # what a detector makes of it alone.
    parsed = replace(parsed, source=source)
    pivot = catalog.route(source, parsed.target).pivot  # said in the last event, as /translate says it
    pieces = (await _layouts(service, parsed, parsed.texts))[0]
    sentences = [p.text for p in pieces if p.translate]
    events = _sentences(service, parsed, sentences)
    # The first sentence before the answer starts: its errors (400, 413, 503) keep their status.
    first = await anext(events, None)
    return StreamingResponse(_events(pieces, first, events, pivot), media_type="text/event-stream")


async def _sentences(service: Service, request: TranslateRequest, sentences: list[str]) -> AsyncIterator[str]:
    """Each sentence's translation, in order: the first alone (soonest), then in chunks of one decoder batch."""
    size = 1
    position = 0
    while position < len(sentences):
        chunk = sentences[position : position + size]
        for group in await _chunks(service, request, chunk):
            answer = await service.translate(replace(request, texts=group, batch=True))
            for text in answer["translatedText"]:
                yield text
        position += len(chunk)
        size = service.options.max_batch_size


async def _events(
    pieces: list[Piece], first: str | None, rest: AsyncIterator[str], pivot: str | None = None
) -> AsyncIterator[str]:
    out: list[str] = []
    space, previous = "", None
    pending = first
    try:
        for piece in pieces:
            if not piece.translate:
                space += piece.text
                continue
            text = pending if pending is not None else await anext(rest)
            pending = None
            chunk = separator(previous, space, text) + text
            out.append(chunk)
            yield _sse({"translatedText": chunk})
            space, previous = "", text
        if space:
            out.append(space)
            yield _sse({"translatedText": space})
        done: dict[str, Any] = {"translatedText": "".join(out)}
        if pivot is not None:
            done["pivot"] = pivot
        yield _sse(done, event="done")
    except ApiError as e:
        yield _sse({"error": e.message, "status": e.status}, event="error")


def _sse(data: dict[str, Any], event: str | None = None) -> str:
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {json.dumps(data, ensure_ascii=False)}\n\n"


UPLOAD_BODY = {
    "requestBody": {
        "required": True,
        "content": {
            "multipart/form-data": {
                "schema": {
                    "type": "object",
                    "required": ["file"],
                    "properties": {
                        "file": {"type": "string", "format": "binary", "description": ", ".join(FORMATS)},
                        "source": {"type": "string", "examples": ["en"]},
                        "target": {"type": "string", "examples": ["zh"]},
                        "api_key": {"type": "string"},
                        "beams": {"type": "integer", "minimum": 1},
                        "max_new_tokens": {"type": "integer", "minimum": 1},
                    },
                }
            }
        },
    }
}
Answers = dict[int | str, dict[str, Any]]
FILE_ANSWER: Answers = {
    200: {
        "description": "Where to download the translated file",
        "content": {
            "application/json": {
                "schema": {
                    "type": "object",
                    "required": ["translatedFileUrl"],
                    "properties": {"translatedFileUrl": {"type": "string"}},
                }
            }
        },
    }
}
DOWNLOAD_ANSWER: Answers = {
    200: {"description": "The translated file", "content": {t: {} for t in sorted(set(MEDIA_TYPES.values()))}},
    404: {"model": ErrorAnswer, "description": "No such file, or kept past its hour"},
}
STREAM_ANSWER: Answers = {200: {"description": "Server-Sent Events", "content": {"text/event-stream": {}}}}


ROUTES: list[BaseRoute] = [
    APIRoute(
        "/translate_file",
        translate_file,
        methods=["POST"],
        responses={**FILE_ANSWER, **errors(400, 403, 413, 503, 504)},
        openapi_extra=UPLOAD_BODY,
    ),
    APIRoute(
        "/download_file/{filename}",
        download_file,
        methods=["GET"],
        response_class=Response,
        responses={**DOWNLOAD_ANSWER, **errors(403)},
        openapi_extra={
            "parameters": [{"name": "filename", "in": "path", "required": True, "schema": {"type": "string"}}]
        },
    ),
    APIRoute(
        "/translate/stream",
        translate_stream,
        methods=["POST"],
        response_class=StreamingResponse,
        responses={**STREAM_ANSWER, **errors(400, 403, 413, 503, 504)},
        openapi_extra=translate_request(),
    ),
]
