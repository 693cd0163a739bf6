"""ASGI middlewares that stand between the network and the handlers: paths as clients write them, the body limit,
security headers, and the last resort for an exception no handler expected.

Each is a plain ASGI class (no BaseHTTPMiddleware): they never buffer a body and never start a task.
"""

from __future__ import annotations

import base64
import hashlib
import logging
import re
from collections.abc import Mapping

from fastapi.responses import JSONResponse
from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .errors import shaped_body

log = logging.getLogger("onnxmt.serve")

NOSNIFF = (b"x-content-type-options", b"nosniff")
# For the HTML the service serves (the page at /, Swagger UI at /docs): nothing from elsewhere, nothing inline
# but the scripts and styles whose hashes are listed, no framing, no form posts, no <base> tricks.
CSP = (
    "default-src 'none'; script-src 'self' {scripts}; style-src 'self' {styles}; img-src 'self' data:; "
    "connect-src 'self'; font-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)


def csp_for(html: str, *, inline_style_attributes: bool = False) -> str:
    """The Content-Security-Policy for a page: its inline <script> and <style> blocks allowed by their sha256, so
    the page can change without the policy going stale. `inline_style_attributes`: for Swagger UI, whose React
    components set style attributes, which hashes cannot allow."""
    scripts = " ".join(_hashes(html, "script"))
    styles = " ".join(_hashes(html, "style"))
    if inline_style_attributes:
        styles = "'unsafe-inline'"  # CSP ignores 'unsafe-inline' when hashes are listed, so list none
    return CSP.format(scripts=scripts, styles=styles).replace("  ", " ")


def _hashes(html: str, tag: str) -> list[str]:
    blocks = re.findall(rf"<{tag}(?:\s[^>]*)?>(.*?)</{tag}>", html, flags=re.S | re.I)
    digests = (base64.b64encode(hashlib.sha256(b.encode()).digest()).decode() for b in blocks if b.strip())
    return [f"'sha256-{d}'" for d in digests]


class HttpMiddleware:
    """A plain ASGI middleware that sees HTTP requests only (lifespan messages pass through): subclasses set `app`
    and implement `http`."""

    app: ASGIApp

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        await self.http(scope, receive, send)

    async def http(self, scope: Scope, receive: Receive, send: Send) -> None:
        raise NotImplementedError


def with_header(message: Message, name: bytes, value: bytes) -> Message:
    """An `http.response.start` message with header `name` (lower case) set to `value`, any other one removed."""
    headers = [h for h in message.get("headers", []) if h[0].lower() != name]
    return {**message, "headers": [*headers, (name, value)]}


class PathMiddleware:
    """`/translate/` and `//translate` are `/translate`: clients join a base URL and a path in every way (a base
    with a trailing slash plus `/translate`, or a path with a trailing slash). Rewritten in place rather than
    redirected, because urllib (libretranslatepy) does not follow a 307 for a POST."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            path = scope["path"]
            clean = re.sub("/{2,}", "/", path)
            if len(clean) > 1:
                clean = clean.rstrip("/") or "/"
            if clean != path:
                scope = {**scope, "path": clean, "raw_path": clean.encode()}
        await self.app(scope, receive, send)


class SecurityHeadersMiddleware(HttpMiddleware):
    """`X-Content-Type-Options: nosniff` on every response, so no browser ever runs a JSON error as HTML."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def http(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = with_header(message, *NOSNIFF)
            await send(message)

        await self.app(scope, receive, send_with_headers)


class LastResortMiddleware(HttpMiddleware):
    """An exception that no handler expected: a JSON 500 whose connection stays usable, and the traceback in the
    log. Without it Starlette answers 500 and re-raises, and uvicorn then closes the connection: the client's next
    keep-alive request fails with ECONNRESET. A client that went away (ClientDisconnect) gets nothing."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def http(self, scope: Scope, receive: Receive, send: Send) -> None:
        started = False

        async def send_tracking(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, send_tracking)
        except ClientDisconnect:
            return
        except Exception:
            log.exception("unexpected error answering %s %s", scope.get("method"), scope.get("path"))
            if not started:
                await error(500, "internal server error", path=scope["path"])(scope, receive, send)


class BodyTooLarge(Exception):
    pass


class BodyLimitMiddleware(HttpMiddleware):
    """413 for bodies above the limit: at once when Content-Length says so, else as soon as the received bytes
    pass it (chunked uploads), without ever holding more than the limit in memory."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def http(self, scope: Scope, receive: Receive, send: Send) -> None:
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None and (not length.isdigit() or len(length) > 18 or int(length) > self.limit):
            too_large = length.isdigit()
            # int() of a 5,000-digit value raises: a length that long is only "more than the limit".
            size = int(length) if too_large and len(length) <= 18 else self.limit + 1
            message = self._message(size) if too_large else "Invalid Content-Length"
            await error(413 if too_large else 400, message, path=scope["path"])(scope, receive, send)
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


def error(status: int, message: str, headers: Mapping[str, str] | None = None, *, path: str = "") -> JSONResponse:
    """LibreTranslate's error shape, or the shape of the API `path` belongs to (serve/errors.py)."""
    return JSONResponse(shaped_body(path, status, message), status_code=status, headers=headers)
