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

It is h11's protocol (uvicorn's pure-Python one, the one the `serve` extra installs), chosen explicitly so that the
guard always applies: httptools, when installed, would otherwise be picked by uvicorn's "auto".
"""

from __future__ import annotations

import asyncio
import json

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

# Waiting for the client: no request yet (maybe part of its headers), or its body is still coming.
WAITING = (h11.IDLE, h11.SEND_BODY)


class GuardedH11Protocol(H11Protocol):
    """See the module docstring. Settings are class attributes: `guarded_protocol()` makes the class uvicorn
    instantiates per connection."""

    request_timeout: float = 30.0
    max_connections: int = 1000

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
