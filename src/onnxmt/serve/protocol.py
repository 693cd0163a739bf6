"""LibreTranslate's API shapes: reading a /translate body, naming languages, the `{"error": ...}` answer.

Existing LibreTranslate clients send `q` (a string, or a list for a batch), `source`, `target`, `format`,
`api_key` and optionally `alternatives`, as JSON or as a form. onnxmt adds `beams` and `max_new_tokens`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..languages import ModelLanguages, display_name, listing_order
from ..manifest import Manifest
from .options import ServeOptions

FORM_INTEGER = re.compile(r"[+-]?[0-9]{1,18}", re.ASCII)


class ApiError(Exception):
    """An answer other than 200, sent as `{"error": message}` with `status` (and `headers`)."""

    def __init__(self, status: int, message: str, headers: Mapping[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = dict(headers or {})


@dataclass(frozen=True)
class TranslateRequest:
    texts: list[str]
    batch: bool  # q was a list: answer with a list
    source: str | None
    target: str | None
    api_key: str | None
    alternatives: int
    beams: int | None
    max_new_tokens: int | None
    format: str = "text"  # or "html": markup kept (serve/documents.py)


def parse_translate(data: Mapping[str, Any], limits: ServeOptions, *, form: bool) -> TranslateRequest:
    """Check a /translate body against the protocol and the limits; ApiError 400 naming the problem.
    `form`: the values came from a form, so numbers arrive as strings."""
    q = data.get("q")
    if q is None:
        raise ApiError(400, "Invalid request: missing q parameter")
    batch = isinstance(q, list)
    texts = q if batch else [q]
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            where = f"q[{i}]" if batch else "q"
            raise ApiError(400, f"Invalid request: {where} must be a string, got {_type_name(text)}")
    if len(texts) > limits.max_texts:
        raise ApiError(400, f"Invalid request: {len(texts)} texts exceed the limit of {limits.max_texts} per request")
    for i, text in enumerate(texts):
        if len(text) > limits.max_chars:
            where = f"q[{i}]" if batch else "q"
            raise ApiError(400, f"Invalid request: {where} has {len(text)} characters, the limit is {limits.max_chars}")
    text_format = _string(data, "format") or "text"
    if text_format not in ("text", "html"):
        raise ApiError(400, f"Invalid request: format {text_format!r} is not supported; valid: text, html")
    alternatives = _integer(data, "alternatives", form, low=0) or 0
    beams = _integer(data, "beams", form, low=1)
    if beams is not None and beams > limits.max_beams:
        raise ApiError(400, f"Invalid request: beams {beams} exceeds the limit of {limits.max_beams}")
    if alternatives + 1 > limits.max_beams:
        raise ApiError(
            400, f"Invalid request: alternatives {alternatives} needs more beams than the limit {limits.max_beams}"
        )
    return TranslateRequest(
        texts=texts,
        batch=batch,
        source=_string(data, "source"),
        target=_string(data, "target"),
        api_key=_string(data, "api_key"),
        alternatives=alternatives,
        beams=beams,
        max_new_tokens=_integer(data, "max_new_tokens", form, low=1),
        format=text_format,
    )


def parse_detect(data: Mapping[str, Any], limits: ServeOptions) -> str:
    """The text of a /detect body (LibreTranslate's: `q`, a string); ApiError 400 naming the problem."""
    _string(data, "api_key")  # checked as /translate checks it, though only the key check reads it
    q = data.get("q")
    if q is None:
        raise ApiError(400, "Invalid request: missing q parameter")
    if not isinstance(q, str):
        raise ApiError(400, f"Invalid request: q must be a string, got {_type_name(q)}")
    if len(q) > limits.max_chars:
        raise ApiError(400, f"Invalid request: q has {len(q)} characters, the limit is {limits.max_chars}")
    return q


def _type_name(value: object) -> str:
    names = {
        type(None): "null",
        bool: "a boolean",
        int: "a number",
        float: "a number",
        list: "a list",
        dict: "an object",
    }
    return names.get(type(value), type(value).__name__)


def _string(data: Mapping[str, Any], name: str) -> str | None:
    value = data.get(name)
    if value is None or isinstance(value, str):
        return value
    raise ApiError(400, f"Invalid request: {name} must be a string, got {_type_name(value)}")


def _integer(data: Mapping[str, Any], name: str, form: bool, low: int) -> int | None:
    value = data.get(name)
    if value is None or (form and value == ""):
        return None
    if form and isinstance(value, str):
        # ASCII digits only, and few of them: str.isdigit() accepts "²", and int() refuses it, "--4" and
        # 5,000-digit values with a ValueError of its own.
        if not FORM_INTEGER.fullmatch(value.strip()):
            raise ApiError(400, f"Invalid request: {name} must be an integer, got {value[:20]!r}")
        value = int(value)
    # bool is an int in Python, but `true` is not a number in JSON.
    if not isinstance(value, int) or isinstance(value, bool):
        raise ApiError(400, f"Invalid request: {name} must be an integer, got {_type_name(value)}")
    if value < low:
        raise ApiError(400, f"Invalid request: {name} must be at least {low}, got {value}")
    return value


class Languages:
    """The model's languages in LibreTranslate's terms (onnxmt.languages does the mapping): the codes /languages
    shows (ISO 639-1 where one exists: `en`, `zh`, `zt`), and the model's codes for what a client sends."""

    def __init__(self, manifest: Manifest) -> None:
        self.model = ModelLanguages(manifest.languages)
        # Every language the model translates from (NLLB-200: 202 of them, Marian: one), listed as its targets are,
        # and the one it reads when a request names none (a model told its source by a token: its default source).
        self._sources = sorted(self.model.sources, key=lambda c: listing_order(self.model.public[c]))
        self.sources: list[str] = [self.model.public[s] for s in self._sources]
        self.source: str | None = self.model.public.get(self.model.default_source or self.model.source or "")
        self.targets: list[str] = [self.model.public[t] for t in self.model.targets]
        default = self.model.default_target
        self.target: str | None = self.model.public[default] if default else None

    def check_source(self, code: str | None) -> None:
        try:
            self.model.resolve_source(code)
        except ValueError as e:
            raise ApiError(400, str(e)) from e

    def target_lang(self, code: str | None) -> str | None:
        """The translator's `target_lang` for a request's `target`: None means the model's default."""
        try:
            return self.model.resolve_target(code)
        except ValueError as e:
            raise ApiError(400, str(e)) from e

    def libretranslate(self) -> list[dict[str, Any]]:
        """`GET /languages`: each language with the languages it translates into (never itself: a translation
        into the text's own language is none), sources first."""
        public = self.model.public
        entries = [_language(public[s], [t for t in self.targets if t != public[s]], s) for s in self._sources]
        entries.extend(_language(public[t], [], t) for t in self.model.targets if t not in self.model.sources)
        return entries


def _language(code: str, targets: list[str], model_code: str | None = None) -> dict[str, Any]:
    return {"code": code, "name": display_name(model_code or code), "targets": targets}
