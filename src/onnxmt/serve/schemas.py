"""Pydantic models of the API's bodies, for the OpenAPI document (/openapi.json, /docs). The handlers read bodies
themselves (`fields.read_fields`, `protocol.parse_translate`), because LibreTranslate clients send JSON, forms or
query strings and expect its error shape."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from ..options import spec
from ..runtime.options import DecodeOptions


def decoding_field(name: str) -> Any:
    """A request field that overrides DecodeOptions' `name`, with the option's lower bound and help."""
    described = spec(DecodeOptions, name)
    return Field(None, ge=described.min, description=f"onnxmt: {described.help[0].lower()}{described.help[1:]}")


def decoding_property(name: str) -> dict[str, Any]:
    """The same field in a hand-written form schema (/translate_file's)."""
    return {"type": "integer", "minimum": spec(DecodeOptions, name).min}


class TranslateBody(BaseModel):
    q: str | list[str] | None = Field(
        None, description="Text, or a list of texts for a batch (required).", examples=["Hello world"]
    )
    source: str | None = Field(None, description='Source language code, or "auto".', examples=["en"])
    target: str | None = Field(None, description="Target language code (see /languages).", examples=["zh"])
    format: str | None = Field(
        None, description='"text" (default) or "html" (markup kept; docs/documents.md).', examples=["text"]
    )
    api_key: str | None = Field(None, description="Needed when the server has API keys.")
    apiKey: str | None = Field(None, description="The same as api_key (the npm libretranslate client's name).")
    alternatives: int | None = Field(None, ge=0, description="Number of alternative translations to return too.")
    beams: int | None = decoding_field("beams")
    max_new_tokens: int | None = decoding_field("max_new_tokens")
    glossary: list[list[str]] | dict[str, str] | None = Field(
        None,
        description="onnxmt, models with a terminology prompt (HY-MT): [source term, target term] pairs or a "
        "{source: target} object; a text's prompt holds the pairs whose source term it contains. 400 for another "
        "model.",
        examples=[[["river", "江"]]],
    )
    context: str | None = Field(
        None,
        description="onnxmt, models with a context prompt (HY-MT): text the translation should agree with (not "
        "translated). 400 for another model.",
    )


class TranslateAnswer(BaseModel):
    translatedText: str | list[str]  # LibreTranslate's names
    alternatives: list[str] | list[list[str]] | None = None
    detectedLanguage: dict[str, Any] | list[dict[str, Any]] | None = None
    pivot: str | None = Field(None, description="onnxmt: translated through this language (--pivot), by two models.")


class DetectBody(BaseModel):
    # Required, here or in the query string: JSON null is "not given", so the schema admits it.
    q: str | None = Field(None, description="Text whose language to detect (required).", examples=["Hello world"])
    api_key: str | None = Field(None, description="Needed when the server has API keys.")
    apiKey: str | None = Field(None, description="The same as api_key.")


class DetectedLanguage(BaseModel):
    language: str = Field(description="A code of /languages, or the detector's ISO 639-1 code.", examples=["en"])
    confidence: float = Field(description="0 to 100.", examples=[99.5])


class ErrorAnswer(BaseModel):
    error: str


class Language(BaseModel):
    code: str
    name: str
    targets: list[str]


class LanguageChoice(BaseModel):
    code: str = Field(examples=["en"])
    name: str = Field(examples=["English"])


class FrontendLanguages(BaseModel):
    source: LanguageChoice = Field(description='The source to start with: the only one, or "auto".')
    target: LanguageChoice


class FrontendSettings(BaseModel):
    """LibreTranslate's /frontend/settings, as its web UI reads it."""

    charLimit: int = Field(description="Most characters per text (max_chars).")
    frontendTimeout: int = Field(description="Milliseconds the web UI waits after typing before it translates.")
    apiKeys: bool = Field(description="Whether the server has API keys.")
    keyRequired: bool = Field(description="Whether /translate needs a key.")
    suggestions: bool = Field(description="Always false: POST /suggest answers 403.")
    filesTranslation: bool = Field(description="Always true: see /translate_file.")
    supportedFilesFormat: list[str] = Field(description="Extensions /translate_file reads.", examples=[[".txt"]])
    language: FrontendLanguages


class SuggestBody(BaseModel):
    # LibreTranslate's fields; onnxmt keeps no suggestions (403), so none is required.
    q: str | None = Field(None, description="The original text.")
    s: str | None = Field(None, description="The suggested translation.")
    source: str | None = None
    target: str | None = None
    api_key: str | None = Field(None, description="Needed with --protect-all.")


FORM_NOTE = (
    "The same fields as the JSON body. A form cannot say null: an empty field is the same as a field not given "
    "(q empty is the empty text). A repeated q is a batch."
)
QUERY_NOTE = "Or in the query string of the POST (deep-translator sends every field there, with no body)."


def request_body(model: type[BaseModel] = TranslateBody, *, query: bool = False) -> dict[str, Any]:
    """A request in OpenAPI: a JSON body or the same fields as a form, and (`query`) the same fields in the query
    string. Form and query schemas have no null (a form cannot send one)."""
    schema = model.model_json_schema()
    if query:  # a field the body lacks may come from the query string: no body field is required then
        schema = {k: v for k, v in schema.items() if k != "required"}
    form = _without_null(schema)
    form["description"] = FORM_NOTE
    parameters = [
        {"name": name, "in": "query", "required": False, "schema": field, "description": QUERY_NOTE}
        for name, field in form["properties"].items()
    ]
    return {
        "parameters": parameters if query else [],
        "requestBody": {
            "required": False,
            "content": {
                "application/json": {"schema": schema},
                "application/x-www-form-urlencoded": {"schema": form},
                "multipart/form-data": {"schema": form},
            },
        },
    }


def translate_request() -> dict[str, Any]:
    return request_body(TranslateBody, query=True)


def _without_null(schema: dict[str, Any]) -> dict[str, Any]:
    """`schema` with every `anyOf: [X, null]` property made `X`, and no null defaults."""
    properties = {}
    for name, field in schema["properties"].items():
        field = {k: v for k, v in field.items() if k != "default"}
        options = [o for o in field.pop("anyOf", []) if o.get("type") != "null"]
        if len(options) == 1:
            field.update(options[0])
        elif options:
            field["anyOf"] = options
        properties[name] = field
    return {**schema, "properties": properties}


def errors(*statuses: int) -> dict[int | str, dict[str, Any]]:
    descriptions = {
        400: "Malformed body, wrong types, unknown language, or a limit exceeded",
        403: "Missing or wrong API key",
        413: "Request body too large",
        503: "Queue full, model loading, or shutting down (see Retry-After)",
        504: "Timed out",
    }
    return {s: {"model": ErrorAnswer, "description": descriptions[s]} for s in statuses}
