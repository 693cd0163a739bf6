"""What every request handler starts from: the request's `Service`, its fields once its API key is right, the key
it is counted by, and whether its client is still there."""

from __future__ import annotations

from starlette.requests import Request

from .fields import Fields, query_api_key, read_fields
from .service import Service


def service_of(request: Request) -> Service:
    service: Service = request.app.state.service
    return service


async def authorize(request: Request, *, always: bool = False) -> Fields:
    """The request's fields, once its API key is right (when keys are on, and for `always` endpoints or with
    protect_all). The key is checked before the body's content is judged: a wrong key answers 403 whatever the
    body holds. A key in the query string is checked before the body is even read."""
    service = service_of(request)
    needs_key = (always or service.options.protect_all) and service.quota.keys_on()
    query_key = query_api_key(request)
    if needs_key and query_key is not None:
        service.quota.check_key(query_key)
    fields = await read_fields(request)
    if needs_key and query_key is None:
        service.quota.check_key(fields.data.get("api_key"))
    return fields


def request_key(request: Request, fields: Fields) -> object:
    """The key a request is counted by: the query string's, else the body's."""
    return query_api_key(request) or fields.data.get("api_key")


async def gone(request: Request) -> None:
    """Returns when the client has disconnected (the body is read by now: the next message is the disconnect)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
