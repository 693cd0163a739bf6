"""Reading a request's fields the ways LibreTranslate clients send them, and refusing what is not text.

LibreTranslate's own server (`get_req_arg`) reads a JSON body, or else the query string and the form together.
Clients differ: libretranslatepy posts a urlencoded form, deep-translator posts with every field in the query
string and no body, browsers and curl users send JSON or multipart. Here a field is taken from the body (JSON or
form) and, when the body does not have it (or has it as null), from the query string; so every client works.

Every value that comes back is a str, a list of them (a form's repeated `q`), or, from JSON, any JSON value. Two
things JSON allows and text does not are refused with a 400 naming the field: lone surrogates (`"\\ud800"` cannot be
encoded, so no tokenizer or key comparison could use it) and nesting past `MAX_DEPTH`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from starlette.datastructures import UploadFile
from starlette.exceptions import HTTPException
from starlette.requests import Request

from .protocol import ApiError

FORM_TYPES = ("application/x-www-form-urlencoded", "multipart/form-data")
# The body of a LibreTranslate request is an object of strings and lists of strings: depth 2. Deeper is refused
# before Python's recursion limit (~1,000 levels) is ever reached, whatever the interpreter's setting.
MAX_DEPTH = 32
# The npm `libretranslate` client (1.0.1, src/translate.ts) sends the key as `apiKey`.
API_KEY_ALIAS = "apiKey"
UTF8_BOM = b"\xef\xbb\xbf"


class Fields:
    """A request's fields: `data` (body over query string), whether they came as text (`form`: a form or the query
    string, so numbers arrive as strings), and the body's own parse error, kept for after the key check."""

    def __init__(self, data: dict[str, Any], form: bool, error: ApiError | None = None) -> None:
        self.data = data
        self.form = form
        self.error = error

    def checked(self) -> Mapping[str, Any]:
        """The fields, or the body's parse error (raised only now, so that a wrong key answers 403 first)."""
        if self.error is not None:
            raise self.error
        return self.data


async def read_fields(request: Request) -> Fields:
    """The request's fields. Never raises for the body: a malformed one is kept as `Fields.error`."""
    query = _query_fields(request)
    try:
        body, form = await _read_body(request)
    except ApiError as e:
        return Fields(with_api_key(query), form=True, error=e)
    # JSON null is "not given" (as an empty form field is): the query string may still give the field.
    given = {name: value for name, value in body.items() if value is not None}
    twice = sorted(set(query) & set(given))
    if twice:  # which one to believe is a guess; a client that sends both has a bug worth hearing about
        error = ApiError(400, f"Invalid request: {', '.join(twice)} given both in the query string and in the body")
        return Fields(with_api_key({**query, **given}), form=True, error=error)
    data = with_api_key({**query, **given})
    # Values from the query string are text, as a form's are: "4" is a number there (and only there).
    form = form or any(name not in given for name in query)
    bad = next((name for name, value in data.items() if not encodable(value)), None)
    if bad is not None:
        error = ApiError(400, f"Invalid request: {bad} is not valid Unicode text (it holds a lone surrogate)")
        return Fields(data, form, error)
    return Fields(data, form)


def with_api_key(data: dict[str, Any]) -> dict[str, Any]:
    """`data` with the npm `libretranslate` client's `apiKey` read as `api_key` (and removed): `api_key` when it
    is given and not empty, else `apiKey` (the npm client sends `apiKey: ""` when it has no key). An `apiKey`
    that is not text is taken whatever `api_key` says, so that it is refused rather than ignored."""
    if API_KEY_ALIAS not in data:
        return data
    data = dict(data)
    alias = data.pop(API_KEY_ALIAS)
    if alias is not None and (data.get("api_key") in (None, "") or not isinstance(alias, str)):
        data["api_key"] = alias
    return data


def query_api_key(request: Request) -> str | None:
    """The API key of the query string (`api_key`, or the npm client's `apiKey`), None when it has none."""
    return with_api_key(dict(request.query_params)).get("api_key")


def _query_fields(request: Request) -> dict[str, Any]:
    """The query string's fields, with repeated `q` as a batch as in forms."""
    return _multi(request.query_params.multi_items())


def _multi(items: list[tuple[str, Any]]) -> dict[str, Any]:
    data: dict[str, Any] = {}
    for key, value in items:
        if key in data and key == "q":
            data[key] = [*data[key], value] if isinstance(data[key], list) else [data[key], value]
        else:  # any other repeated field keeps its last value
            data[key] = value
    return data


async def _read_body(request: Request) -> tuple[dict[str, Any], bool]:
    """The body as a mapping, and whether it was a form; ApiError 400 when it is neither a JSON object nor a form.
    An empty body (deep-translator's POST with fields in the query string) is an empty mapping."""
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if content_type in FORM_TYPES:
        try:
            form = await request.form()
        except HTTPException as e:  # python-multipart's parse errors, as starlette reports them
            raise ApiError(400, f"Invalid request: malformed form ({e.detail})") from e
        items = form.multi_items()
        for key, value in items:
            if isinstance(value, UploadFile):
                raise ApiError(400, f"Invalid request: {key} must be a form field, not a file")
        return _multi(items), True
    if content_type not in ("", "application/json") and not content_type.endswith("+json"):
        raise ApiError(400, f"Invalid request: unsupported content type {content_type!r}; send JSON or a form")
    body = await request.body()
    if not body.strip():
        return {}, False
    data = _loads(body)
    if not isinstance(data, dict):
        raise ApiError(400, "Invalid request: the body must be a JSON object")
    return data, False


def _loads(body: bytes) -> Any:
    """A JSON body as RFC 8259 has it exchanged: UTF-8 without a byte order mark. `json.loads` would take bytes in
    UTF-16 or UTF-32 too, and skip a BOM; both are refused, as docs/serve.md says."""
    if body.startswith(UTF8_BOM):
        raise ApiError(400, "Invalid request: malformed JSON (a byte order mark before it; send UTF-8 without one)")
    try:
        data = json.loads(body.decode("utf-8"))
    except RecursionError as e:  # json's C scanner stops at Python's recursion limit, cleanly
        raise ApiError(400, f"Invalid request: JSON nested deeper than {MAX_DEPTH} levels") from e
    except ValueError as e:  # includes UnicodeDecodeError
        raise ApiError(400, f"Invalid request: malformed JSON ({e})") from e
    if _depth(data) > MAX_DEPTH:
        raise ApiError(400, f"Invalid request: JSON nested deeper than {MAX_DEPTH} levels")
    return data


def _depth(value: Any) -> int:
    """How deep lists and objects nest in `value`, without recursion (a recursive walk of a JSON that parsed just
    below the recursion limit would hit it)."""
    deepest, stack = 0, [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            item = list(item.values())
        if isinstance(item, list):
            deepest = max(deepest, depth + 1)
            if deepest > MAX_DEPTH:
                break
            stack.extend((v, depth + 1) for v in item)
    return deepest


def encodable(value: Any) -> bool:
    """False when a string anywhere in `value` (a key or a value, at any depth up to MAX_DEPTH) holds a lone
    surrogate."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return False
        return True
    if isinstance(value, list):
        return all(encodable(v) for v in value)
    if isinstance(value, dict):
        return all(encodable(k) and encodable(v) for k, v in value.items())
    return True
