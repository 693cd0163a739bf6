"""Each API's own error shape, chosen by the request's path: the clients of the DeepL, Google and OpenAI APIs read
their errors from their own fields (google-api-core reads `error.message`, and fails on LibreTranslate's
`{"error": "..."}`). Every other path answers LibreTranslate's `{"error": message}`.

Used by every error answer, including those the middlewares give before a route runs (413 for a body too large)."""

from __future__ import annotations

from typing import Any

DEEPL = "/v2/"
GOOGLE = "/language/translate/v2"
OPENAI = "/v1/"

# google.rpc.Code names, as Google's JSON errors carry them in `status`.
GOOGLE_STATUS = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    405: "UNIMPLEMENTED",
    408: "DEADLINE_EXCEEDED",
    413: "INVALID_ARGUMENT",
    429: "RESOURCE_EXHAUSTED",
    499: "CANCELLED",
    500: "INTERNAL",
    503: "UNAVAILABLE",
    504: "DEADLINE_EXCEEDED",
}
# OpenAI's error `type` and `code` by status (as api.openai.com answers them).
OPENAI_TYPE = {
    401: ("invalid_request_error", "invalid_api_key"),
    403: ("invalid_request_error", "invalid_api_key"),
    404: ("invalid_request_error", "not_found"),
    429: ("requests", "rate_limit_exceeded"),
    500: ("server_error", None),
    503: ("server_error", None),
    504: ("server_error", "timeout"),
}


def shaped_body(path: str, status: int, message: str) -> dict[str, Any]:
    """The error body for a request to `path`."""
    if path.startswith(GOOGLE):
        google = {"code": status, "message": message, "status": GOOGLE_STATUS.get(status, "UNKNOWN")}
        return {"error": {**google, "errors": [{"message": message, "domain": "global", "reason": "invalid"}]}}
    if path.startswith(DEEPL):
        return {"message": message}
    if path.startswith(OPENAI):
        kind, code = OPENAI_TYPE.get(status, ("invalid_request_error", None))
        return {"error": {"message": message, "type": kind, "param": None, "code": code}}
    return {"error": message}


def error_schema(path: str) -> dict[str, Any]:
    """The OpenAPI schema of `shaped_body` for a route."""
    text = {"type": "string"}
    if path.startswith(GOOGLE):
        inner = {"type": "object", "required": ["code", "message", "status"], "properties": {"message": text}}
        return {"type": "object", "required": ["error"], "properties": {"error": inner}}
    if path.startswith(DEEPL):
        return {"type": "object", "required": ["message"], "properties": {"message": text}}
    if path.startswith(OPENAI):
        inner = {"type": "object", "required": ["message", "type"], "properties": {"message": text, "type": text}}
        return {"type": "object", "required": ["error"], "properties": {"error": inner}}
    return {"type": "object", "required": ["error"], "properties": {"error": text}}


DESCRIPTIONS = {
    400: "Malformed body, wrong types, unknown language, or a limit exceeded",
    401: "Missing or wrong API key",
    403: "Missing or wrong API key",
    404: "Not found",
    413: "Request body too large",
    429: "Too many requests or characters for the key (see Retry-After)",
    456: "The key's characters for the day are spent",
    503: "Queue full, model loading, or shutting down (see Retry-After)",
    504: "Timed out",
}


def error_responses(path: str, *statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI `responses` for a route's errors, in its API's shape."""
    schema = error_schema(path)
    return {s: {"description": DESCRIPTIONS[s], "content": {"application/json": {"schema": schema}}} for s in statuses}
