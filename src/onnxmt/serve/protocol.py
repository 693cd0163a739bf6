"""LibreTranslate's API shapes: reading a /translate body, naming languages, the `{"error": ...}` answer.

Existing LibreTranslate clients send `q` (a string, or a list for a batch), `source`, `target`, `format`,
`api_key` and optionally `alternatives`, as JSON or as a form. onnxmt adds `beams`, `max_new_tokens`, and for
models with prompts for them (HY-MT) `glossary` and `context`. `FIELDS` declares each once: how it is read, what
OpenAPI says of it (serve/schemas.py), whether /translate_file's form takes it (serve/documents.py).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ..architectures.decoder_only import glossary_pairs
from ..languages import AUTO, ModelLanguages, display_name, listing_order
from ..manifest import Manifest
from ..options import spec
from ..runtime.options import DecodeOptions
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
    """A checked /translate request (`parse_translate`): one attribute per field of FIELDS, `q` as `texts`."""

    texts: list[str]
    batch: bool  # q was a list: answer with a list
    source: str | None = None
    target: str | None = None
    api_key: str | None = None
    alternatives: int = 0
    beams: int | None = None
    max_new_tokens: int | None = None
    format: str = "text"  # or "html": markup kept (serve/documents.py)
    # HY-MT's terminology and context prompts (architectures/decoder_only.py): (source, target) pairs; a text.
    glossary: tuple[tuple[str, str], ...] = ()
    context: str | None = None


# A field's value from a request's fields: (the fields, its name, whether they came as text, the limits).
Reader = Callable[[Mapping[str, Any], str, bool, ServeOptions], Any]


@dataclass(frozen=True)
class RequestField:
    """One field of a LibreTranslate request, as /translate, /translate/stream and /translate_file take it: how it
    is read from JSON, a form or the query string (`read`), what OpenAPI says of it (serve/schemas.py: `type`, the
    JSON value's type as Python's; `help`; `min`; `examples`; `form_schema`, its schema in a form where a form
    sends it otherwise than as the JSON value), and whether /translate_file's form takes it (`upload`)."""

    name: str
    type: Any
    help: str
    read: Reader
    min: int | float | None = None
    examples: tuple[Any, ...] = ()
    form_schema: dict[str, Any] | None = None
    upload: bool = True


def parse_translate(data: Mapping[str, Any], limits: ServeOptions, *, form: bool) -> TranslateRequest:
    """Check a /translate body against the protocol and the limits, field by field in FIELDS' order; ApiError 400
    naming the problem. `form`: the values came from a form, so numbers arrive as strings."""
    values = {field.name: field.read(data, field.name, form, limits) for field in FIELDS}
    q = values.pop("q")
    batch = isinstance(q, list)
    return TranslateRequest(texts=q if batch else [q], batch=batch, **values)


def _texts(data: Mapping[str, Any], name: str, form: bool, limits: ServeOptions) -> str | list[str]:
    """`q`: a text, or a list of them (a batch), within --max-texts and --max-chars."""
    q = data.get(name)
    if q is None:
        raise ApiError(400, f"Invalid request: missing {name} parameter")
    batch = isinstance(q, list)
    texts = q if batch else [q]
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            where = f"{name}[{i}]" if batch else name
            raise ApiError(400, f"Invalid request: {where} must be a string, got {type_name(text)}")
    if len(texts) > limits.max_texts:
        raise ApiError(400, f"Invalid request: {len(texts)} texts exceed the limit of {limits.max_texts} per request")
    for i, text in enumerate(texts):
        if len(text) > limits.max_chars:
            where = f"{name}[{i}]" if batch else name
            raise ApiError(400, f"Invalid request: {where} has {len(text)} characters, the limit is {limits.max_chars}")
    return q


def _format(data: Mapping[str, Any], name: str, form: bool, limits: ServeOptions) -> str:
    text_format = _string(data, name) or "text"
    if text_format not in ("text", "html"):
        raise ApiError(400, f"Invalid request: {name} {text_format!r} is not supported; valid: text, html")
    return text_format


def _text(data: Mapping[str, Any], name: str, form: bool, limits: ServeOptions) -> str | None:
    return _string(data, name)


def _alternatives(data: Mapping[str, Any], name: str, form: bool, limits: ServeOptions) -> int:
    """LibreTranslate's alternatives are the runner-up beams: within --max-beams with the best one."""
    alternatives = _integer(data, name, form, low=0) or 0
    if alternatives + 1 > limits.max_beams:
        raise ApiError(
            400, f"Invalid request: {name} {alternatives} needs more beams than the limit {limits.max_beams}"
        )
    return alternatives


def _beams(data: Mapping[str, Any], name: str, form: bool, limits: ServeOptions) -> int | None:
    beams = _decoding(data, name, form, limits)
    if beams is not None and beams > limits.max_beams:
        raise ApiError(400, f"Invalid request: beams {beams} exceeds the limit of {limits.max_beams}")
    return beams


def _glossary(data: Mapping[str, Any], name: str, form: bool, limits: ServeOptions) -> tuple[tuple[str, str], ...]:
    """A request's `glossary`: a list of [source, target] pairs or a {source: target} object (in a form, as JSON
    text), within --max-glossary-terms and --max-glossary-chars."""
    value = data.get(name)
    if form and isinstance(value, str):
        if not value.strip():
            return ()
        try:
            value = json.loads(value)
        except ValueError as e:
            raise ApiError(400, f"Invalid request: glossary is not JSON ({e})") from e
    if value is not None and not isinstance(value, (list, dict)):
        raise ApiError(400, f"Invalid request: glossary must be a list of [source, target] pairs or an object, got "
                       f"{type_name(value)}")  # fmt: skip
    try:
        pairs = glossary_pairs(value)
    except ValueError as e:
        raise ApiError(400, f"Invalid request: {e}") from e
    if len(pairs) > limits.max_glossary_terms:
        raise ApiError(
            400, f"Invalid request: the glossary has {len(pairs)} pairs; the limit is {limits.max_glossary_terms}"
        )
    chars = sum(len(s) + len(t) for s, t in pairs)
    if chars > limits.max_glossary_chars:
        raise ApiError(
            400, f"Invalid request: the glossary has {chars} characters; the limit is {limits.max_glossary_chars}"
        )
    return pairs


def _context(data: Mapping[str, Any], name: str, form: bool, limits: ServeOptions) -> str | None:
    """A request's `context` (None when empty), within --max-context-chars."""
    context = _string(data, name)
    if context is not None and len(context) > limits.max_context_chars:
        raise ApiError(
            400, f"Invalid request: context has {len(context)} characters, the limit is {limits.max_context_chars}"
        )
    return context if context and context.strip() else None


def parse_detect(data: Mapping[str, Any], limits: ServeOptions) -> str:
    """The text of a /detect body (LibreTranslate's: `q`, a string); ApiError 400 naming the problem."""
    _string(data, "api_key")  # checked as /translate checks it, though only the key check reads it
    q = data.get("q")
    if q is None:
        raise ApiError(400, "Invalid request: missing q parameter")
    if not isinstance(q, str):
        raise ApiError(400, f"Invalid request: q must be a string, got {type_name(q)}")
    if len(q) > limits.max_chars:
        raise ApiError(400, f"Invalid request: q has {len(q)} characters, the limit is {limits.max_chars}")
    return q


def type_name(value: object) -> str:
    """How an error names a JSON value's type: `a number`, `a list`, `null`."""
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
    raise ApiError(400, f"Invalid request: {name} must be a string, got {type_name(value)}")


def _decoding(data: Mapping[str, Any], name: str, form: bool, limits: ServeOptions) -> int | None:
    """A request's override of DecodeOptions' `name` (`beams`, `max_new_tokens`), held to the option's lower bound."""
    return _integer(data, name, form, low=spec(DecodeOptions, name).min or 0)


def _integer(data: Mapping[str, Any], name: str, form: bool, low: float) -> int | None:
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
        raise ApiError(400, f"Invalid request: {name} must be an integer, got {type_name(value)}")
    if value < low:
        raise ApiError(400, f"Invalid request: {name} must be at least {low}, got {value}")
    return value


def _decoding_field(name: str, read: Reader) -> RequestField:
    """A request field that overrides DecodeOptions' `name`, with the option's lower bound and help."""
    option = spec(DecodeOptions, name)
    return RequestField(name, int, f"onnxmt: {option.help[0].lower()}{option.help[1:]}", read, min=option.min)


# Every field of a /translate request, in the order they are checked (the first problem found is the one answered).
FIELDS = (
    RequestField(
        "q",
        str | list[str],
        "Text, or a list of texts for a batch (required).",
        _texts,
        examples=("Hello world",),
        upload=False,  # /translate_file's text is its file
    ),
    RequestField(
        "format",
        str,
        '"text" (default) or "html" (markup kept; docs/documents.md).',
        _format,
        examples=("text",),
        upload=False,  # /translate_file's format is its file's
    ),
    RequestField(
        "alternatives",
        int,
        "Number of alternative translations to return too.",
        _alternatives,
        min=0,
        upload=False,
    ),
    _decoding_field("beams", _beams),
    RequestField("source", str, 'Source language code, or "auto".', _text, examples=("en",)),
    RequestField("target", str, "Target language code (see /languages).", _text, examples=("zh",)),
    RequestField("api_key", str, "Needed when the server has API keys.", _text),
    _decoding_field("max_new_tokens", _decoding),
    RequestField(
        "glossary",
        list[list[str]] | dict[str, str],
        "onnxmt, models with a terminology prompt (HY-MT): [source term, target term] pairs or a {source: target} "
        "object; a text's prompt holds the pairs whose source term it contains. 400 for another model.",
        _glossary,
        examples=([["river", "江"]],),
        form_schema={"type": "string", "description": "JSON: [[source, target], ...] or {source: target}"},
    ),
    RequestField(
        "context",
        str,
        "onnxmt, models with a context prompt (HY-MT): text the translation should agree with (not translated). "
        "400 for another model.",
        _context,
    ),
)

# The fields /translate_file's form takes beside its file.
UPLOAD_FIELDS = tuple(field.name for field in FIELDS if field.upload)


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
        into the text's own language is none), sources first; LibreTranslate 1.7's codes beside its older ones
        (`with_new_codes`)."""
        public = self.model.public
        entries = [_language(public[s], [t for t in self.targets if t != public[s]], s) for s in self._sources]
        entries.extend(_language(public[t], [], t) for t in self.model.targets if t not in self.model.sources)
        return with_new_codes(entries, self.model.new_codes())


def _language(code: str, targets: list[str], model_code: str | None = None) -> dict[str, Any]:
    return {"code": code, "name": display_name(model_code or code), "targets": targets}


def with_new_codes(entries: list[dict[str, Any]], new_codes: Mapping[str, str]) -> list[dict[str, Any]]:
    """`/languages` entries with the code LibreTranslate >= 1.7 lists for a language (`zh-Hans`, `zh-Hant`,
    `pt-BR`) after each of its older ones (`zh`, `zt`, `pb`): an entry of its own with the same name and targets,
    and beside the old code in every list of targets. Both are listed because clients check the list for the code
    they are about to send: Weblate (since 2025) looks for `zh-Hant`, the Discourse plugin and the npm client for
    `zh`. Every code in a list of targets is also an entry of its own (LibreTranslate's web UI looks each up)."""
    listed = {entry["code"] for entry in entries}
    new = {old: code for old, code in new_codes.items() if old in listed and code not in listed}
    out = []
    for entry in entries:
        targets = [code for target in entry["targets"] for code in (target, new.get(target)) if code is not None]
        out.append({**entry, "targets": targets})
        if entry["code"] in new:
            out.append({**entry, "code": new[entry["code"]], "targets": targets})
    return out


# LibreTranslate's default --frontend-timeout: how long its web UI waits after a keystroke before it translates.
FRONTEND_TIMEOUT_MS = 500


def frontend_settings(
    options: ServeOptions,
    languages: list[dict[str, Any]],
    defaults: tuple[str, str | None],
    file_formats: list[str],
) -> dict[str, Any]:
    """`GET /frontend/settings`, which LibreTranslate's web UI reads before anything else (its app.js stops with
    "Cannot load /frontend/settings" without it), in LibreTranslate's shape (app.py `frontend_settings`).
    `languages`: /languages' entries, for the names; `defaults`: the source and target to start with."""
    names = {entry["code"]: entry["name"] for entry in languages}
    names[AUTO] = "Auto Detect"
    source, target = defaults
    target = target or next(iter(names))
    return {
        "charLimit": options.max_chars,  # per text; LibreTranslate's -1 (no limit) is never the case here
        "frontendTimeout": FRONTEND_TIMEOUT_MS,
        "apiKeys": bool(options.api_keys) or options.key_db is not None,
        # /translate needs a key whenever there are keys
        "keyRequired": bool(options.api_keys) or options.key_db is not None,
        "suggestions": False,  # POST /suggest answers 403
        "filesTranslation": True,
        "supportedFilesFormat": file_formats,
        "language": {
            "source": {"code": source, "name": names.get(source, source)},
            "target": {"code": target, "name": names.get(target, target)},
        },
    }
