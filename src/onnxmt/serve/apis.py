"""What the DeepL, Google and OpenAI routes share: the key from a header, texts checked against the limits, and
the translation through `Service.translate` (the path `/translate` takes, so the same text gets the same
translation whichever API asked for it)."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

from starlette.requests import Request

from .documents import translate_html_request
from .handlers import gone, service_of
from .limits import LimitExceeded, charge
from .protocol import ApiError, TranslateRequest, type_name
from .service import Service


def header_key(request: Request, *schemes: str) -> str | None:
    """The key of an `Authorization: <scheme> KEY` header (schemes compared without case), else None."""
    value = request.headers.get("authorization")
    if value is None:
        return None
    scheme, _, key = value.strip().partition(" ")
    return key.strip() if scheme.lower() in {s.lower() for s in schemes} else None


def check_key(service: Service, key: str | None, status: int, message: str) -> None:
    """When keys are on, `key` must be one: ApiError `status` with `message` otherwise."""
    try:
        service.quota.check_key(key)
    except ApiError as e:
        raise ApiError(status, message) from e


async def count(request: Request, service: Service, key: str | None, chars: int, *, daily_status: int = 429) -> None:
    """The request counted against its key's (address's) limits; `daily_status`: the status for a spent day (DeepL's
    456)."""
    try:
        await charge(request, service.quota, key, chars)
    except LimitExceeded as e:
        if e.daily and daily_status != 429:
            raise ApiError(daily_status, e.message, e.headers) from e
        raise


def texts_of(value: object, field: str, service: Service) -> list[str]:
    """`value` (a string or a list of strings) as a list of texts within --max-texts and --max-chars; ApiError 400
    naming `field` otherwise."""
    if value is None:
        raise ApiError(400, f"Parameter '{field}' not specified")
    texts = value if isinstance(value, list) else [value]
    options = service.options
    if len(texts) > options.max_texts:
        raise ApiError(400, f"Too many texts: {len(texts)} exceed the limit of {options.max_texts} per request")
    for i, text in enumerate(texts):
        where = f"{field}[{i}]" if isinstance(value, list) else field
        if not isinstance(text, str):
            raise ApiError(400, f"{where} must be a string, got {type_name(text)}")
        if len(text) > options.max_chars:
            raise ApiError(400, f"{where} has {len(text)} characters, the limit is {options.max_chars}")
    return [str(text) for text in texts]


def string_of(data: dict[str, Any], field: str) -> str | None:
    value = data.get(field)
    if value is None or isinstance(value, str):
        return value or None
    raise ApiError(400, f"{field} must be a string, got {type_name(value)}")


async def translate_texts(
    request: Request,
    texts: list[str],
    source: str | None,
    target: str | None,
    *,
    html: bool = False,
    max_new_tokens: int | None = None,
    beams: int | None = None,
    on_partial: Callable[[int, str], None] | None = None,
) -> tuple[list[str], str | None]:
    """`texts` translated as `/translate` translates them: (the translations, the detected source language as
    /languages names it, or None when the source was given). With `on_partial` (a stream) the response watches
    for the client's disconnect itself and cancels the translation, so it is not watched here too."""
    service = service_of(request)
    kind = "html" if html else "text"
    parsed = TranslateRequest(
        texts, batch=True, source=source, target=target, beams=beams, max_new_tokens=max_new_tokens, format=kind
    )
    disconnected = partial(gone, request)
    if html:
        answer = await translate_html_request(service, parsed, disconnected)
    else:
        answer = await service.translate(parsed, None if on_partial else disconnected, on_partial=on_partial)
    detected = answer.get("detectedLanguage")
    language = detected[0]["language"] if detected else None
    return list(answer["translatedText"]), language


async def detect_language(request: Request, text: str) -> tuple[str, float]:
    """(the language /languages names it by, confidence 0-100) of `text`."""
    best = (await service_of(request).detect(text))[0].libretranslate()
    return str(best["language"]), float(best["confidence"])


def language_names(service: Service) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """(sources, targets) of the service as (code, English name), codes as /languages lists them."""
    entries = service.libretranslate_languages()
    names = {e["code"]: e["name"] for e in entries}
    sources = [(e["code"], e["name"]) for e in entries if e["targets"]]
    targets = list(dict.fromkeys(t for e in entries for t in e["targets"]))
    return sources, [(t, names.get(t, t)) for t in targets]
