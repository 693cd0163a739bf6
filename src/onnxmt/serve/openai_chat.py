"""OpenAI's chat completions, as translation apps with an "OpenAI-compatible" backend and the `openai` client speak
them: `GET /v1/models`, `POST /v1/chat/completions` with and without `stream`.

A chat is a translation request (serve/prompts.py reads it): the text is the last user message, the languages
come from `target` / `source` fields (`extra_body` in the `openai` client) or else from the instruction in a system
or user message ("Translate the following text into Chinese"). Each line of the text is translated as `/translate`
translates a text, so the content is exactly what `/translate` gives for each line. The model named is echoed;
the pair decides the model, as for `/translate` (docs/apis.md).

The key comes as `Authorization: Bearer KEY`; a wrong one is 401. Errors are OpenAI's `{"error": {"message",
"type", "param", "code"}}` (serve/errors.py).
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from fastapi.responses import JSONResponse, StreamingResponse
from fastapi.routing import APIRoute
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute

from .apis import check_key, count, header_key, string_of, texts_of, translate_texts, type_name
from .errors import error_responses
from .fields import read_fields
from .handlers import service_of
from .prompts import read_chat
from .protocol import ApiError
from .schemas import json_body

PREFIX = "onnxmt/"
WRONG_KEY = "Incorrect API key provided: send Authorization: Bearer KEY"


async def _authorized(request: Request) -> str | None:
    key = header_key(request, "Bearer")
    check_key(service_of(request), key, 401, WRONG_KEY)
    return key


async def models(request: Request) -> JSONResponse:
    """The service's models, each as `onnxmt/<name>` (the names /info gives)."""
    await _authorized(request)
    catalog, _ = service_of(request).require_ready()
    data = [{"id": PREFIX + e.name, "object": "model", "created": 0, "owned_by": "onnxmt"} for e in catalog.entries]
    return JSONResponse({"object": "list", "data": data})


async def model(request: Request) -> JSONResponse:
    """One model of `/v1/models`, by its id; 404 for another."""
    await _authorized(request)
    catalog, _ = service_of(request).require_ready()
    wanted = request.path_params["model"]
    for e in catalog.entries:
        if PREFIX + e.name == wanted:
            return JSONResponse({"id": wanted, "object": "model", "created": 0, "owned_by": "onnxmt"})
    raise ApiError(404, f"The model '{wanted[:200]}' does not exist; GET /v1/models lists them")


def _integer(data: dict[str, Any], name: str) -> int | None:
    value = data.get(name)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ApiError(400, f"{name} must be a positive integer, got {type_name(value)}")
    return value


async def chat(request: Request) -> Response:
    """A chat completion whose content is the translation of the last user message (see the module's doc)."""
    service = service_of(request)
    key = await _authorized(request)
    data = dict((await read_fields(request)).checked())
    model = string_of(data, "model") or "onnxmt"
    stream = data.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise ApiError(400, f"stream must be a boolean, got {type_name(stream)}")
    if _integer(data, "n") not in (None, 1):
        raise ApiError(400, "n must be 1: one translation per request")
    max_new = _integer(data, "max_completion_tokens") or _integer(data, "max_tokens")
    beams = _integer(data, "beams")  # onnxmt's, as /translate's: greedy (1) streams token by token
    if beams is not None and beams > service.options.max_beams:
        raise ApiError(400, f"beams {beams} exceeds the limit of {service.options.max_beams}")
    ask = read_chat(data.get("messages"))
    source = string_of(data, "source") or string_of(data, "source_lang") or ask.source
    target = string_of(data, "target") or string_of(data, "target_lang") or ask.target
    lines = ask.text.split("\n")
    # Lines without a letter (blank, "%%", "---", "1.") are kept as they are: apps separate paragraphs with them.
    wanted = [i for i, line in enumerate(lines) if any(c.isalpha() for c in line)]
    texts = texts_of([lines[i] for i in wanted], "messages", service)
    await count(request, service, key, sum(map(len, texts)))
    reply = Reply(model, lines, wanted)
    if not stream:
        translated, _ = await translate_texts(request, texts, source, target, max_new_tokens=max_new, beams=beams)
        return JSONResponse(reply.completion(translated))
    told: asyncio.Queue[tuple[int, str] | None] = asyncio.Queue()
    task = asyncio.ensure_future(
        translate_texts(request, texts, source, target, max_new_tokens=max_new, beams=beams, on_partial=_put(told))
    )
    task.add_done_callback(lambda _: told.put_nowait(None))
    first = await told.get()
    if first is None and task.exception() is not None:  # before the first chunk: an ordinary error answer
        raise task.exception()  # type: ignore[misc]
    return StreamingResponse(reply.chunks(first, told, task), media_type="text/event-stream")


def _put(told: asyncio.Queue[tuple[int, str] | None]) -> Any:
    def on_partial(i: int, text: str) -> None:
        told.put_nowait((i, text))

    return on_partial


class Reply:
    """The answer to one chat: a completion, or its chunks as the translation grows."""

    def __init__(self, model: str, lines: list[str], wanted: list[int]) -> None:
        self.model = model
        self.lines = lines
        self.wanted = wanted
        self.id = f"chatcmpl-{uuid.uuid4().hex}"
        self.created = int(time.time())

    def content(self, translated: list[str]) -> str:
        lines = list(self.lines)
        for i, text in zip(self.wanted, translated, strict=True):
            lines[i] = text
        return "\n".join(lines)

    def completion(self, translated: list[str]) -> dict[str, Any]:
        message = {"role": "assistant", "content": self.content(translated)}
        choice = {"index": 0, "message": message, "finish_reason": "stop", "logprobs": None}
        return {**self._head("chat.completion"), "choices": [choice]}

    def _head(self, kind: str) -> dict[str, Any]:
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model}

    def _chunk(self, delta: dict[str, Any], finish: str | None = None) -> str:
        choice = {"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}
        return (
            f"data: {json.dumps({**self._head('chat.completion.chunk'), 'choices': [choice]}, ensure_ascii=False)}\n\n"
        )

    async def chunks(
        self,
        first: tuple[int, str] | None,
        told: asyncio.Queue[tuple[int, str] | None],
        task: asyncio.Future[tuple[list[str], str | None]],
    ) -> AsyncIterator[str]:
        """The role; the first line's translation as its tokens come (each piece what the text so far adds to
        what was sent); the rest of the content once the translation is done, so that the pieces join into the
        content a request without `stream` gets; then `[DONE]`."""
        yield self._chunk({"role": "assistant", "content": ""})
        # Blank lines before the first line of text stand as they are.
        before = "\n".join(self.lines[: self.wanted[0]]) + "\n" if self.wanted and self.wanted[0] else ""
        shown = ""
        try:
            item = first
            while item is not None:
                j, text = item
                if j == 0 and (before + text).startswith(shown) and len(before + text) > len(shown):
                    piece, shown = (before + text)[len(shown) :], before + text
                    yield self._chunk({"content": piece})
                item = await told.get()
            whole = self.content((await task)[0])
        except ApiError as e:
            yield f"data: {json.dumps({'error': {'message': e.message, 'type': 'server_error', 'code': e.status}})}\n\n"
            return
        finally:
            task.cancel()  # a no-op once done; else the client has gone and the translation stops
        if not whole.startswith(shown):  # a token decoded alone and in context differently: cannot be unsent
            error = {"message": "the streamed pieces diverged from the translation", "type": "server_error"}
            yield f"data: {json.dumps({'error': error})}\n\n"
            return
        if whole[len(shown) :]:
            yield self._chunk({"content": whole[len(shown) :]})
        yield self._chunk({}, "stop")
        yield "data: [DONE]\n\n"


CHAT_BODY = {
    "requestBody": json_body(
        ["messages"],
        {
            "model": {"type": "string"},
            "messages": {
                "type": "array",
                "minItems": 1,
                "items": {
                    "type": "object",
                    "required": ["role", "content"],
                    "properties": {"role": {"type": "string"}, "content": {"type": "string"}},
                },
            },
            "stream": {"type": "boolean"},
            "target": {"type": "string"},
            "source": {"type": "string"},
            "max_tokens": {"type": "integer", "minimum": 1},
            "beams": {"type": "integer", "minimum": 1},
        },
    )
}

ROUTES: list[BaseRoute] = [
    APIRoute(
        "/v1/models",
        models,
        methods=["GET"],
        tags=["OpenAI chat completions"],
        responses=error_responses("/v1/models", 401, 503),
    ),
    APIRoute(
        "/v1/models/{model:path}",
        model,
        methods=["GET"],
        tags=["OpenAI chat completions"],
        responses=error_responses("/v1/models", 401, 404, 503),
        openapi_extra={"parameters": [{"name": "model", "in": "path", "required": True, "schema": {"type": "string"}}]},
    ),
    APIRoute(
        "/v1/chat/completions",
        chat,
        methods=["POST"],
        tags=["OpenAI chat completions"],
        responses=error_responses("/v1/chat/completions", 400, 401, 413, 429, 503, 504),
        openapi_extra=CHAT_BODY,
    ),
]
