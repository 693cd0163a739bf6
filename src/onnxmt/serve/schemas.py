"""Pydantic models of the API's bodies, for the OpenAPI document (/openapi.json, /docs). The handlers read bodies
themselves (`fields.read_fields`, `protocol.parse_translate`), because LibreTranslate clients send JSON, forms or
query strings and expect its error shape."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field, create_model

from .fields import API_KEY_ALIAS
from .protocol import FIELDS, UPLOAD_FIELDS

ALIAS_HELP = "The same as api_key (the npm libretranslate client's name)."


def _translate_body() -> type[BaseModel]:
    """/translate's JSON body: the fields of `protocol.FIELDS`, and the npm client's name for `api_key`."""
    fields: dict[str, Any] = {}
    for field in FIELDS:
        examples = list(field.examples) or None
        fields[field.name] = (field.type | None, Field(None, description=field.help, ge=field.min, examples=examples))
        if field.name == "api_key":
            fields[API_KEY_ALIAS] = (str | None, Field(None, description=ALIAS_HELP))
    return create_model("TranslateBody", **fields)


TranslateBody = _translate_body()
# How a form sends the fields it sends otherwise than JSON does (a glossary: as JSON text).
FORM_SCHEMAS = {field.name: field.form_schema for field in FIELDS if field.form_schema is not None}


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


def request_body(
    model: type[BaseModel] = TranslateBody, *, query: bool = False, form_schemas: dict[str, Any] | None = None
) -> dict[str, Any]:
    """A request in OpenAPI: a JSON body or the same fields as a form, and (`query`) the same fields in the query
    string. Form and query schemas have no null (a form cannot send one); `form_schemas`: the schemas of the fields
    a form sends otherwise than JSON does."""
    schema = model.model_json_schema()
    if query:  # a field the body lacks may come from the query string: no body field is required then
        schema = {k: v for k, v in schema.items() if k != "required"}
    form = _form(schema, form_schemas or {})
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
    return request_body(TranslateBody, query=True, form_schemas=FORM_SCHEMAS)


def upload_request(file_help: str) -> dict[str, Any]:
    """/translate_file's body: a multipart form of its `file` and of the /translate fields an upload takes."""
    form = _form(TranslateBody.model_json_schema(), FORM_SCHEMAS)["properties"]
    properties = {"file": {"type": "string", "format": "binary", "description": file_help}}
    properties.update({name: form[name] for name in UPLOAD_FIELDS})
    schema = {"type": "object", "required": ["file"], "properties": properties}
    return {"requestBody": {"required": True, "content": {"multipart/form-data": {"schema": schema}}}}


def _form(schema: dict[str, Any], form_schemas: dict[str, Any]) -> dict[str, Any]:
    """`schema` as a form sends it: no null, and the fields of `form_schemas` as they say."""
    form = _without_null(schema)
    form["properties"].update(form_schemas)
    return form


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


def json_body(required: list[str], properties: dict[str, Any], *, needed: bool = True) -> dict[str, Any]:
    """An OpenAPI request body of one JSON object (the DeepL, Google and OpenAI APIs' own, written by hand)."""
    schema = {"type": "object", "required": required, "properties": properties}
    return {"required": needed, "content": {"application/json": {"schema": schema}}}


def errors(*statuses: int) -> dict[int | str, dict[str, Any]]:
    descriptions = {
        400: "Malformed body, wrong types, unknown language, or a limit exceeded",
        403: "Missing or wrong API key",
        413: "Request body too large",
        503: "Queue full, model loading, or shutting down (see Retry-After)",
        504: "Timed out",
    }
    return {s: {"model": ErrorAnswer, "description": descriptions[s]} for s in statuses}
