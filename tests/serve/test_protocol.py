"""serve/protocol.py: a /translate field declared once (FIELDS) is read from JSON, from a form and from
/translate_file's form, and documented in each of their OpenAPI schemas."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from starlette.testclient import TestClient

from onnxmt.serve.documents import UPLOAD_BODY, _upload
from onnxmt.serve.options import ServeOptions
from onnxmt.serve.protocol import FIELDS, UPLOAD_FIELDS, ApiError, TranslateRequest, parse_translate
from onnxmt.serve.schemas import TranslateBody, translate_request

# Each declared field: (its value in JSON, in a form, its value in the TranslateRequest). A field added to FIELDS
# needs a row here, and is then held to everything below.
SAMPLES: dict[str, tuple[Any, str, Any]] = {
    "q": ("Hello", "Hello", ["Hello"]),
    "format": ("html", "html", "html"),
    "alternatives": (1, "1", 1),
    "beams": (2, "2", 2),
    "source": ("en", "en", "en"),
    "target": ("zh", "zh", "zh"),
    "api_key": ("key", "key", "key"),
    "max_new_tokens": (7, "7", 7),
    "glossary": ([["river", "江"]], '[["river", "江"]]', (("river", "江"),)),
    "context": ("a story", "a story", "a story"),
}


def _attribute(name: str) -> str:
    return "texts" if name == "q" else name


def test_the_declaration_and_the_checked_request_have_the_same_fields() -> None:
    assert list(SAMPLES) == [field.name for field in FIELDS]
    attributes = {f.name for f in dataclasses.fields(TranslateRequest)} - {"batch"}
    assert attributes == {_attribute(field.name) for field in FIELDS}


@pytest.mark.parametrize("name", list(SAMPLES))
def test_a_declared_field_is_read_from_json_and_from_a_form(name: str) -> None:
    json_value, form_value, expected = SAMPLES[name]
    from_json = parse_translate({"q": "Hello", name: json_value}, ServeOptions(), form=False)
    from_form = parse_translate({"q": "Hello", name: form_value}, ServeOptions(), form=True)
    assert getattr(from_json, _attribute(name)) == getattr(from_form, _attribute(name)) == expected


def test_a_declared_field_is_checked_by_its_reader() -> None:
    with pytest.raises(ApiError, match="beams must be an integer"):
        parse_translate({"q": "Hello", "beams": "two"}, ServeOptions(), form=True)
    with pytest.raises(ApiError, match="alternatives 4 needs more beams"):
        parse_translate({"q": "Hello", "alternatives": 4}, ServeOptions(max_beams=4), form=False)


def test_an_upload_takes_the_declared_fields_it_declares() -> None:
    async def fields(request: Request) -> JSONResponse:
        kept, upload = await _upload(request)
        assert upload is not None and upload.filename == "a.txt"
        return JSONResponse(kept)

    app = Starlette(routes=[Route("/", fields, methods=["POST"])])
    data = {name: form for name, (_, form, _) in SAMPLES.items()}
    with TestClient(app) as client:
        kept = client.post("/", files={"file": ("a.txt", b"Hello")}, data=data).json()
    assert set(kept) == set(UPLOAD_FIELDS) and set(UPLOAD_FIELDS) < set(SAMPLES)
    parsed = parse_translate({**kept, "q": ""}, ServeOptions(), form=True)
    for name in UPLOAD_FIELDS:
        assert getattr(parsed, _attribute(name)) == SAMPLES[name][2]


def test_every_declared_field_is_in_the_openapi_schemas() -> None:
    json_body = TranslateBody.model_json_schema()["properties"]
    content = translate_request()["requestBody"]["content"]
    form = content["application/x-www-form-urlencoded"]["schema"]["properties"]
    query = {p["name"]: p["schema"] for p in translate_request()["parameters"]}
    upload = UPLOAD_BODY["requestBody"]["content"]["multipart/form-data"]["schema"]["properties"]
    for field in FIELDS:
        assert field.name in json_body and field.name in form and field.name in query
        assert json_body[field.name]["description"] == field.help
        assert (field.name in upload) is field.upload
    # A form sends a glossary as JSON text.
    assert form["glossary"]["type"] == query["glossary"]["type"] == upload["glossary"]["type"] == "string"
    assert set(upload) == {"file", *UPLOAD_FIELDS}
