"""Documents in the service: `format: "html"` in /translate, LibreTranslate's `POST /translate_file` and
`GET /download_file/{name}`, and `POST /translate/stream` (Server-Sent Events, sentence by sentence).

Every sentence goes through `Service.translate`, so documents get the same checks, limits, micro-batching and
errors as /translate: a document's sentences are sent in chunks that each stay under --max-request-cost.
An upload is limited by --max-body-bytes (413 above it, as for any body).
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Iterator, Sequence
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

from fastapi.responses import FileResponse, JSONResponse, Response, StreamingResponse
from fastapi.routing import APIRoute
from starlette.datastructures import UploadFile
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.routing import BaseRoute

from ..documents import prepare
from ..documents.files import FORMATS
from ..documents.segment import Piece
from ..documents.stream import Joiner, Update
from ..documents.translate import Plan, join_texts
from .downloads import TooLargeToStore
from .fields import encodable, query_api_key, read_fields, with_api_key
from .handlers import authorize, gone, request_key, service_of
from .limits import charge
from .pool import RETRY_AFTER
from .protocol import UPLOAD_FIELDS, ApiError, TranslateRequest, parse_translate
from .schemas import ErrorAnswer, errors, translate_request, upload_request
from .service import Service
from .workers import ClientLeft, JobError, WorkerBusy, WorkerGone, WorkerTimeout

Disconnected = Callable[[], Awaitable[object]] | None
Cost = Callable[[int], int]  # a sentence's source tokens -> its cost in tokens x beams
# Characters of a document the language of `source: auto` is detected on: its beginning.
DETECT_SAMPLE_CHARS = 2000
# A Host header translatedFileUrl is built from: a name or IPv4 address, or an IPv6 one in brackets; a port.
HOST = re.compile(r"(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.-]+)(:[0-9]{1,5})?")
MEDIA_TYPES = {
    "text": "text/plain; charset=utf-8",
    "srt": "application/x-subrip; charset=utf-8",
    "vtt": "text/vtt; charset=utf-8",
    "html": "text/html; charset=utf-8",
    "markdown": "text/markdown; charset=utf-8",
    "docx": "application/vnd.openxmlformats-officedocument.wordprocessingml.document",
}


async def _in_worker(
    service: Service, function: Callable[..., Any], args: tuple[Any, ...], disconnected: Disconnected
) -> Any:
    """A step of a document's preparation in a document worker (serve/workers.py), within --timeout; its failures
    as the answers they are. A request's own texts (a stream, HTML snippets: a list of strings within --max-texts
    and --max-chars, checked before) are prepared on a thread instead: they are not documents, and neither wait for
    a worker nor count against --max-document-queue."""
    document = args[1]
    small = isinstance(document, list) and sum(len(t) for t in document) <= service.options.max_chars
    try:
        if small:
            return await service.workers.run_small(function, args)
        return await service.workers.run(function, args, service.options.timeout or None, disconnected)
    except WorkerBusy as e:
        raise ApiError(503, f"server busy: {e}; retry later", RETRY_AFTER) from e
    except ClientLeft as e:
        raise ApiError(499, "the client disconnected; the document was cancelled") from e
    except (WorkerTimeout, WorkerGone) as e:
        if service.draining:
            raise ApiError(503, "the service is shutting down", RETRY_AFTER) from e
        if isinstance(e, WorkerTimeout):
            raise ApiError(504, f"preparing the document took over {service.options.timeout:g} s (timeout)") from e
        raise ApiError(413, f"{e} ({service.options.document_worker_mb} MB: document_worker_mb)") from e
    except JobError as e:
        if e.kind == "too_large":
            raise ApiError(413, f"document too large: {e.message}") from e
        raise ApiError(400, f"Invalid request: cannot read the document: {e.message}") from e


async def translate_document(
    service: Service, request: TranslateRequest, kind: str, document: Any, disconnected: Disconnected
) -> tuple[Any, Any]:
    """`document` (see documents/prepare.py: a file's bytes, HTML pages, plain texts) translated, and the detected
    language when the request asked for detection. Read and cut into sentences in a worker; its cost checked
    against --max-document-cost before any of it is translated; its sentences translated in requests under
    --max-request-cost each, so other clients' requests take turns with them; written again in a worker."""
    request, plan, cost, detected = await _plan(service, request, kind, document, disconnected)
    translated: list[str] = []
    for chunk, ids in _chunks(service, plan, cost):
        answer = await service.translate(replace(request, texts=chunk, batch=True), disconnected, ids)
        translated += answer["translatedText"]
    texts = join_texts(plan.layouts, translated)
    if kind == prepare.TEXTS:
        return texts, detected
    return await _in_worker(service, prepare.render, (kind, document, texts, service.limits), disconnected), detected


async def _plan(
    service: Service, request: TranslateRequest, kind: str, document: Any, disconnected: Disconnected
) -> tuple[TranslateRequest, Plan, Cost, Any]:
    """The request with its source named (detected once for the whole document), the document's plan, what a
    sentence of n tokens costs, and the detected language. 413 above --max-document-cost."""
    request = replace(request, alternatives=0)
    detected = None
    if request.source in (None, "", "auto"):
        sample = await _in_worker(
            service, prepare.sample, (kind, document, DETECT_SAMPLE_CHARS, service.limits), disconnected
        )
        found, source = await service.source_of(replace(request, texts=[sample]))
        detected = found.libretranslate() if found is not None else None
        request = replace(request, source=source)
    counting, cost = await service.counting(request)
    plan: Plan = await _in_worker(service, prepare.plan, (kind, document, counting, service.limits), disconnected)
    total = sum(cost(n) for n in plan.tokens)
    limit = service.options.max_document_cost
    if total > limit:
        raise ApiError(
            413,
            f"document too large: its {len(plan.sentences)} sentences cost {total} tokens x beams; the limit is "
            f"{limit} (max_document_cost): send a shorter document, fewer beams or a lower max_new_tokens",
        )
    return request, plan, cost, detected


def _chunks(
    service: Service, plan: Plan, cost: Cost, first: int | None = None, size: int | None = None
) -> Iterator[tuple[list[str], list[Sequence[int]]]]:
    """The plan's sentences (and their source ids) as consecutive requests, each under every model's request limit
    (--max-request-cost, capped by --max-cache-mb: serve/costs.py) and of at most `size` texts (default and
    at most: --max-texts); the first of at most `first`."""
    limit = service.smallest_request_limit()
    size = min(size or service.options.max_texts, service.options.max_texts)
    chunk: list[str] = []
    ids: list[Sequence[int]] = []
    total = 0
    most = first or size
    for sentence, source in zip(plan.sentences, plan.ids, strict=True):
        if chunk and (len(chunk) >= most or (limit is not None and total + cost(len(source)) > limit)):
            yield chunk, ids
            chunk, ids, total, most = [], [], 0, size
        chunk.append(sentence)
        ids.append(source)
        total += cost(len(source))
    if chunk:
        yield chunk, ids


async def translate_html_request(service: Service, request: TranslateRequest, disconnected: Disconnected) -> Any:
    """/translate with `format: "html"`: each text a page or fragment, its markup kept (documents/html.py)."""
    service.require_ready()
    pages, detected = await translate_document(service, request, prepare.PAGES, request.texts, disconnected)
    body: dict[str, Any] = {"translatedText": pages if request.batch else pages[0]}
    if detected is not None:
        body["detectedLanguage"] = [detected] * len(pages) if request.batch else detected
    return body


# --- files ------------------------------------------------------------------------------------------------------


async def translate_file(request: Request) -> JSONResponse:
    """Translate an uploaded file (LibreTranslate's API: multipart fields `file`, `source`, `target`, `api_key`);
    the answer's `translatedFileUrl` downloads the translation. Formats by extension: .txt, .srt, .vtt, .html,
    .htm, .md, .docx."""
    service = service_of(request)
    query_key = query_api_key(request)
    if service.quota.keys_on() and query_key is not None:
        service.quota.check_key(query_key)
    fields, upload = await _upload(request)
    if service.quota.keys_on() and query_key is None:
        service.quota.check_key(fields.get("api_key"))
    if upload is None:
        raise ApiError(400, "Invalid request: missing file parameter (a multipart upload named file)")
    filename = Path(upload.filename or "").name
    if not filename:
        raise ApiError(400, "Invalid request: empty file name")
    kind = FORMATS.get(Path(filename).suffix.lower())
    if kind is None:
        raise ApiError(400, f"Invalid request: file format not supported; valid extensions: {', '.join(FORMATS)}")
    parsed = parse_translate({**fields, "q": ""}, service.options, form=True)
    await charge(request, service.quota, query_key or fields.get("api_key"), 0)
    data = await upload.read()
    service.require_ready()
    result, _ = await translate_document(service, parsed, kind, data, partial(gone, request))
    try:
        name = await asyncio.to_thread(service.downloads.store, filename, result)
    except TooLargeToStore as e:
        raise ApiError(413, str(e)) from e
    return JSONResponse({"translatedFileUrl": _download_url(request, service, name)})


def _download_url(request: Request, service: Service, name: str) -> str:
    """Where the translated file is: under --public-url when it is set, else where this request came to (the
    client's own Host header; the scheme a trusted proxy forwarded, --forwarded-allow-ips). A Host that is not a
    host name or address with an optional port (none, `a/b?`, `user@host`) gives a URL relative to the service's
    root, rather than a URL built from whatever the client sent."""
    path = request.app.url_path_for("download_file", filename=name)
    if service.options.public_url:
        return service.options.public_url.rstrip("/") + path
    if not HOST.fullmatch(request.headers.get("host", "")):
        return request.scope.get("root_path", "") + path
    return str(request.url_for("download_file", filename=name))


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
    kept = {k: v for k, v in with_api_key(fields).items() if k in UPLOAD_FIELDS}
    bad = next((k for k, v in kept.items() if not encodable(v)), None)
    if bad is not None:
        raise ApiError(400, f"Invalid request: {bad} is not valid Unicode text")
    return kept, upload


async def download_file(request: Request) -> Response:
    """A translated file, by the name `translatedFileUrl` gave (kept --keep-files-seconds)."""
    service = service_of(request)
    if service.options.protect_all:
        fields = await read_fields(request)
        service.quota.check_key(query_api_key(request) or fields.data.get("api_key"))
    name = request.path_params["filename"]
    # Only names the store made: nothing else on the disk can be named.
    path = service.downloads.path(name)
    if path is None or not path.is_file():
        raise ApiError(404, f"file not found (translated files are kept {service.options.keep_files_seconds:g} s)")
    kind = FORMATS.get(Path(name).suffix.lower(), "text")
    download = name.split(".", 1)[1]
    return FileResponse(path, media_type=MEDIA_TYPES[kind], filename=download)


# --- streams ----------------------------------------------------------------------------------------------------


async def translate_stream(request: Request) -> Response:
    """Translate one text (`q`, a string; fields as /translate's) as Server-Sent Events: `data: {"translatedText":
    piece}` with each piece of the translation as soon as it is known (token by token with greedy search on a model
    batched in flight, else sentence by sentence), then `event: done` with the whole translation. An error before
    the first piece is an ordinary error answer; one after it, an `event: error` with `{"error", "status"}`."""
    service = service_of(request)
    fields = await authorize(request, always=True)
    parsed = parse_translate(fields.checked(), service.options, form=fields.form)
    if parsed.batch:
        raise ApiError(400, "Invalid request: /translate/stream translates one text: q must be a string")
    await charge(request, service.quota, request_key(request, fields), len(parsed.texts[0]))
    if parsed.format != "text":
        raise ApiError(400, "Invalid request: /translate/stream translates text; format must be text")
    catalog, _ = service.require_ready()
    # The text's language detected once, on the whole text: its sentences are translated from it, not each from
    # what a detector makes of it alone.
    parsed, plan, cost, _ = await _plan(service, parsed, prepare.TEXTS, parsed.texts, partial(gone, request))
    pivot = catalog.route(parsed.source, parsed.target).pivot  # said in the last event, as /translate says it
    updates = _updates(service, parsed, plan, cost)
    # The first update before the answer starts: errors until then (400, 413, 503) keep their status.
    first = await anext(updates, None)
    return StreamingResponse(_events(plan.layouts[0], first, updates, pivot), media_type="text/event-stream")


async def _updates(service: Service, request: TranslateRequest, plan: Plan, cost: Cost) -> AsyncGenerator[Update]:
    """The current sentence's translation so far, after each of its tokens where the model's batcher tells them,
    and each sentence's whole translation, in order: the first sentence alone (soonest), then in chunks of one
    decoder batch. Leaving this generator early cancels the chunk running."""
    current = 0  # the first sentence not yet finished: the only one whose tokens are shown
    for chunk, ids in _chunks(service, plan, cost, first=1, size=service.options.max_batch_size):
        told: asyncio.Queue[tuple[int, str] | None] = asyncio.Queue()
        start = current

        def on_partial(i: int, text: str, start: int = start, told: asyncio.Queue = told) -> None:
            told.put_nowait((start + i, text))

        def ended(_: object, told: asyncio.Queue = told) -> None:
            told.put_nowait(None)

        task = asyncio.ensure_future(
            service.translate(replace(request, texts=chunk, batch=True), ids=ids, on_partial=on_partial)
        )
        task.add_done_callback(ended)
        try:
            while (item := await told.get()) is not None:
                if item[0] == current:
                    yield current, item[1], False
            answer = task.result()
        finally:
            task.cancel()  # a no-op once done
        for text in answer["translatedText"]:
            yield current, text, True
            current += 1


async def _events(
    pieces: list[Piece], first: Update | None, rest: AsyncGenerator[Update], pivot: str | None = None
) -> AsyncIterator[str]:
    out: list[str] = []
    joiner = Joiner(pieces)
    try:
        if first is not None:
            for text in joiner.update(*first[1:]):
                out.append(text)
                yield _sse({"translatedText": text})
        async for _, partial_text, finished in rest:
            for text in joiner.update(partial_text, finished):
                out.append(text)
                yield _sse({"translatedText": text})
        for text in joiner.end():
            out.append(text)
            yield _sse({"translatedText": text})
        done: dict[str, Any] = {"translatedText": "".join(out)}
        if pivot is not None:
            done["pivot"] = pivot
        yield _sse(done, event="done")
    except ApiError as e:
        yield _sse({"error": e.message, "status": e.status}, event="error")
    finally:
        await rest.aclose()  # the client gone: the sentence running stops at its next step


def _sse(data: dict[str, Any], event: str | None = None) -> str:
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {json.dumps(data, ensure_ascii=False)}\n\n"


UPLOAD_BODY = upload_request(", ".join(FORMATS))
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
