"""Pydantic models of the API's bodies, for the OpenAPI document (/docs). The handlers read bodies themselves
(`protocol.parse_translate`), because LibreTranslate clients send JSON or forms and expect its error shape."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field


class TranslateBody(BaseModel):
    q: str | list[str] = Field(description="Text, or a list of texts for a batch.", examples=["Hello world"])
    source: str | None = Field(None, description='Source language code, or "auto".', examples=["en"])
    target: str | None = Field(None, description="Target language code (see /languages).", examples=["zh"])
    format: str | None = Field(None, description='Only "text" is supported.', examples=["text"])
    api_key: str | None = Field(None, description="Needed when the server has API keys.")
    alternatives: int | None = Field(None, ge=0, description="Number of alternative translations to return too.")
    beams: int | None = Field(None, ge=1, description="onnxmt: beam size (1 is greedy; default: the model's).")
    max_new_tokens: int | None = Field(None, ge=1, description="onnxmt: most tokens to generate per text.")


class TranslateAnswer(BaseModel):
    translatedText: str | list[str]  # LibreTranslate's names
    alternatives: list[str] | list[list[str]] | None = None
    detectedLanguage: dict[str, Any] | list[dict[str, Any]] | None = None


class DetectBody(BaseModel):
    q: str = Field(description="Text whose language to detect.", examples=["Hello world"])
    api_key: str | None = Field(None, description="Needed when the server has API keys.")


class DetectedLanguage(BaseModel):
    language: str = Field(description="A code of /languages, or the detector's ISO 639-1 code.", examples=["en"])
    confidence: float = Field(description="0 to 100.", examples=[99.5])


class ErrorAnswer(BaseModel):
    error: str


class Language(BaseModel):
    code: str
    name: str
    targets: list[str]


def request_body(model: type[BaseModel] = TranslateBody) -> dict[str, Any]:
    """A request body in OpenAPI: JSON, or the same fields as a form."""
    schema = model.model_json_schema()
    return {
        "requestBody": {
            "required": True,
            "content": {
                "application/json": {"schema": schema},
                "application/x-www-form-urlencoded": {"schema": schema},
                "multipart/form-data": {"schema": schema},
            },
        }
    }


def errors(*statuses: int) -> dict[int | str, dict[str, Any]]:
    descriptions = {
        400: "Malformed body, wrong types, unknown language, or a limit exceeded",
        403: "Missing or wrong API key",
        413: "Request body too large",
        503: "Queue full, model loading, or shutting down (see Retry-After)",
        504: "Timed out",
    }
    return {s: {"model": ErrorAnswer, "description": descriptions[s]} for s in statuses}
