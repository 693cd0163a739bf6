"""Slow clients, bounded: uvicorn's h11 protocol with a deadline per request and a cap on open connections.

uvicorn has no read timeout of its own. Its keep-alive timer runs only between requests and is cancelled by the
first byte of the next one, so a client that sends one header line and then nothing, or a body shorter than its
Content-Length, holds its connection (and the app's task waiting for that body) forever; and a connection that
never sends a byte has no timer at all. Its `limit_concurrency` answers 503 to requests beyond the limit, but only
once their headers are complete: sockets that never finish their headers are not counted out.

`GuardedH11Protocol` adds both, at the protocol level, under any ASGI app:

- **a request deadline**: from the moment the server waits for a request (the connection opened, or the first
  byte of a request on a kept-alive connection arrived) the whole request, headers and body, must have arrived
  within `request_timeout` seconds; otherwise the client gets `408` (if it had started a request) and the
  connection is closed. Idle keep-alive connections are closed by uvicorn's `timeout_keep_alive`, whichever of the
  two is longer.
- **a connection cap**: a connection beyond `max_connections` is answered `503` with `Retry-After` and closed at
  once, before anything is read from it.
- **a bound on a request's head** (its request line and header fields): h11's `max_incomplete_event_size` (16 KiB)
  applies only to a head still incomplete after a read, so a 60 KB head that arrives in one read went through.
  Here it applies to every head, however it arrived: larger is answered `400` and the connection closed.
- **keep-alive that clients can plan for**: responses say `Keep-Alive: timeout=N` (server.py), and an idle
  connection is closed `KEEP_ALIVE_GRACE` seconds after N, so that a client reusing it at N (httpx's pool keeps a
  connection 5 s, uvicorn's default timeout) does not meet the close on its way.

It is h11's protocol (uvicorn's pure-Python one, the one the `serve` extra installs), chosen explicitly so that the
guard always applies: httptools, when installed, would otherwise be picked by uvicorn's "auto".
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

# Waiting for the client: no request yet (maybe part of its headers), or its body is still coming.
WAITING = (h11.IDLE, h11.SEND_BODY)
# Seconds an idle keep-alive connection stays open past the `Keep-Alive: timeout=N` its responses announce.
KEEP_ALIVE_GRACE = 1.0


class BoundedHeadConnection(h11.Connection):
    """h11's server connection, with `max_incomplete_event_size` a bound on every request's head, also one that
    arrived whole in a single read. `head_too_large`: whether the last RemoteProtocolError was for that bound."""

    head_too_large = False

    def next_event(self) -> Any:
        try:
            event = super().next_event()
        except h11.RemoteProtocolError as e:  # h11's own bound, on a head still incomplete, hints 431
            self.head_too_large = e.error_status_hint == 431
            raise
        if isinstance(event, h11.Request) and head_size(event) > self._max_incomplete_event_size:
            self.head_too_large = True
            raise h11.RemoteProtocolError("request head too large", error_status_hint=431)
        return event


def head_size(request: h11.Request) -> int:
    """The bytes of a request's head as sent: request line, header lines, the blank line."""
    line = len(request.method) + len(request.target) + len(b"HTTP/") + len(request.http_version) + 4
    return line + sum(len(name) + len(value) + 4 for name, value in request.headers.raw_items()) + 2


class GuardedH11Protocol(H11Protocol):
    """See the module docstring. Settings are class attributes: `guarded_protocol()` makes the class uvicorn
    instantiates per connection."""

    request_timeout: float = 30.0
    max_connections: int = 1000

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.conn = BoundedHeadConnection(h11.SERVER, self.conn._max_incomplete_event_size)

    def send_400_response(self, msg: str) -> None:
        """uvicorn's answer to a request h11 cannot parse, as every other error is: `{"error": ...}`, closed."""
        if isinstance(self.conn, BoundedHeadConnection) and self.conn.head_too_large:
            message = f"request headers larger than {self.conn._max_incomplete_event_size} bytes"
        else:
            message = "invalid HTTP request"
        self._refuse(400, "Bad Request", message)

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._deadline: asyncio.TimerHandle | None = None
        super().connection_made(transport)
        if len(self.connections) > self.max_connections:
            message = f"too many open connections (the limit is {self.max_connections}); retry later"
            self._refuse(503, "Service Unavailable", message, retry_after=True)
            return
        self._follow()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        self._follow()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._follow()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _follow(self) -> None:
        """Arm the deadline while the server waits for (part of) a request; disarm it once the request is in, and
        while an idle keep-alive connection is left to uvicorn's keep-alive timer (its next byte cancels that timer
        and arms the deadline): `request_timeout` must not cut `timeout_keep_alive` short."""
        idle = self.conn.their_state is h11.IDLE and not self.conn.trailing_data[0]
        kept_alive = idle and self.timeout_keep_alive_task is not None
        if self.transport.is_closing() or self.conn.their_state not in WAITING or kept_alive:
            self._disarm()
        elif self._deadline is None:
            self._deadline = self.loop.call_later(self.request_timeout, self._expire)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _expire(self) -> None:
        self._deadline = None
        if self.transport.is_closing():
            return
        idle = self.conn.their_state is h11.IDLE and not self.conn.trailing_data[0]
        answered = self.conn.their_state is h11.SEND_BODY and self.cycle is not None and self.cycle.response_started
        if idle or answered:  # nothing started (or the response is out already): close, as keep-alive does
            self.transport.close()
            return
        message = f"request not received within {self.request_timeout:g} s"
        self._refuse(408, "Request Timeout", message)

    def _refuse(self, status: int, reason: str, message: str, *, retry_after: bool = False) -> None:
        """Answer outside h11's state machine (no request was parsed, or it never finished) and close."""
        body = json.dumps({"error": message}).encode()
        head = [
            f"HTTP/1.1 {status} {reason}",
            "content-type: application/json",
            f"content-length: {len(body)}",
            "connection: close",
            "x-content-type-options: nosniff",
        ]
        if retry_after:
            head.append("retry-after: 1")
        self.transport.write(("\r\n".join(head) + "\r\n\r\n").encode() + body)
        self.transport.close()


def guarded_protocol(request_timeout: float, max_connections: int) -> type[GuardedH11Protocol]:
    """The protocol class for `uvicorn.Config(http=...)` with these settings."""
    settings = {"request_timeout": request_timeout, "max_connections": max_connections}
    return type("GuardedH11Protocol", (GuardedH11Protocol,), settings)
