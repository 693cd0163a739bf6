"""A document's source language reaches the sentence splitter through every surface: the library's document
functions, `onnxmt translate`, and the service's /translate (format html), /translate_file and /translate/stream.

On the tiny NLLB-200 model (many source languages, so the language comes from the request, not the model). Each
surface is checked twice, against expectations made without the documents code: the sentences the model is given
are the ones written below by hand, and the answer is the library's translation of each of them alone, joined as
the docs say (nothing between two Chinese or Japanese sentences, else the source's space)."""

from __future__ import annotations

import json
import time
import unicodedata
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from onnxmt import Translator
from onnxmt.cli import app
from onnxmt.documents import translate_document, translate_file, translate_string, translate_texts
from onnxmt.documents.stream import translate_stream
from onnxmt.documents.translate import translate_lines
from onnxmt.runtime.translator import Translator as DirectoryTranslator
from onnxmt.serve.app import create_app
from onnxmt.serve.options import ServeOptions

SHORT = {"max_new_tokens": 8}
# Source language -> (a paragraph, its sentences as a reader of the language cuts it, a target language): English
# rules cut the first two after their abbreviations too, and take the third for one sentence. The targets are
# where the random model's translations of these sentences are not empty: Latin then Chinese script, Chinese
# twice (joined with nothing between).
CASES = {
    "de": ("Das war im Okt. letzten Jahres. Es regnete.", ["Das war im Okt. letzten Jahres.", "Es regnete."], "en"),
    "es": ("La Sra. García llegó tarde. Nadie vino.", ["La Sra. García llegó tarde.", "Nadie vino."], "en"),
    "fr": ("Le film commence à 20 h. Nous arrivons tôt.", ["Le film commence à 20 h.", "Nous arrivons tôt."], "nl"),
}  # fmt: skip
LONG = "{0} {0} {0}"  # a line of three paragraphs: more tokens than the model's positions


@pytest.fixture(scope="module")
def nllb(tiny_nllb_onnx_dir: Path) -> Translator:
    return Translator(tiny_nllb_onnx_dir)


@pytest.fixture
def given(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """The texts of every `Translator.prepare` call from now on: what the model is given to translate."""
    calls: list[list[str]] = []
    real = DirectoryTranslator.prepare  # the class the CLI's and the service's Translators are

    def prepare(self: DirectoryTranslator, texts: Any, *args: Any, **kwargs: Any) -> Any:
        calls.append(list(texts))
        return real(self, texts, *args, **kwargs)

    monkeypatch.setattr(DirectoryTranslator, "prepare", prepare)
    return calls


def wide(char: str) -> bool:
    return unicodedata.east_asian_width(char) in ("W", "F")


def expected(nllb: Translator, lang: str, times: int = 1) -> str:
    """The paragraph's translation (`times` over, one after the other): its sentences translated alone, joined by
    a space unless both sides of it are Chinese or Japanese."""
    _, sentences, target = CASES[lang]
    parts = [nllb.translate([s], source_lang=lang, target_lang=target, **SHORT)[0].text for s in sentences] * times
    assert all(parts), "an empty translation would hide a separator"
    out = parts[0]
    for part in parts[1:]:
        out += ("" if wide(out[-1]) and wide(part[0]) else " ") + part
    return out


def test_the_premise_english_rules_would_give_the_model_other_sentences(nllb: Translator) -> None:
    from onnxmt.documents.translate import plan_document

    for lang, (text, sentences, target) in CASES.items():
        assert plan_document(nllb, text, source_lang="en", target_lang=target).sentences != sentences, lang
        assert plan_document(nllb, text, source_lang=lang, target_lang=target).sentences == sentences, lang
        english = translate_document(nllb, text, source_lang="en", target_lang=target, **SHORT)
        assert english != expected(nllb, lang), lang


@pytest.mark.parametrize("lang", CASES)
def test_library_surfaces(lang: str, nllb: Translator, given: list[list[str]], tmp_path: Path) -> None:
    text, sentences, target = CASES[lang]
    pair = {"source_lang": lang, "target_lang": target, **SHORT}
    want, long = expected(nllb, lang), expected(nllb, lang, 3)
    given.clear()
    assert translate_document(nllb, text, **pair) == want
    assert translate_texts(nllb, [text, text], **pair) == [want, want]
    assert translate_string(nllb, f"<p>{text}</p>", "html", **pair) == f"<p>{want}</p>"
    assert translate_string(nllb, f"# {text}\n", "markdown", **pair) == f"# {want}\n"
    (tmp_path / "in.md").write_text(f"{text}\n", encoding="utf-8")
    translate_file(nllb, tmp_path / "in.md", tmp_path / "out.md", **pair)
    assert (tmp_path / "out.md").read_text(encoding="utf-8") == f"{want}\n"
    assert "".join(translate_stream(nllb, text, **pair)) == want
    # Plain text: a line is one text, but a line too long for the model is cut into sentences too.
    assert list(translate_lines(nllb, [LONG.format(text)], **pair)) == [long]
    assert given == [sentences, sentences * 2, sentences, sentences, sentences, sentences, sentences * 3]


@pytest.mark.parametrize("lang", CASES)
def test_the_command_line(lang: str, nllb: Translator, given: list[list[str]], tiny_nllb_onnx_dir: Path) -> None:
    text, sentences, target = CASES[lang]
    want, long = expected(nllb, lang), expected(nllb, lang, 3)
    given.clear()
    command = ["translate", "-m", str(tiny_nllb_onnx_dir), "--source-lang", lang, "--target-lang", target]
    result = CliRunner().invoke(app, [*command, "--max-new-tokens", "8", "--format", "markdown", text])
    assert result.exit_code == 0, result.output
    assert result.stdout == want + "\n"
    lines = CliRunner().invoke(app, [*command, "--max-new-tokens", "8", LONG.format(text)])  # plain text
    assert lines.exit_code == 0, lines.output
    assert lines.stdout == long + "\n"
    assert given == [sentences, sentences * 3]


@pytest.fixture(scope="module")
def client(tiny_nllb_onnx_dir: Path) -> Iterator[TestClient]:
    """The service on the NLLB model, in this process (so that `given` sees what its model is given); no
    translation cache, so that every sentence reaches the model."""
    with TestClient(create_app(tiny_nllb_onnx_dir, ServeOptions(cache_size=0))) as client:
        deadline = time.monotonic() + 60
        while client.get("/ready").status_code != 200 and time.monotonic() < deadline:
            time.sleep(0.05)
        yield client


def events(body: str) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for block in body.strip().split("\n\n"):
        lines = dict(line.split(": ", 1) for line in block.splitlines())
        out.append((lines.get("event", "message"), json.loads(lines["data"])))
    return out


@pytest.mark.parametrize("lang", CASES)
def test_the_services_surfaces(lang: str, nllb: Translator, given: list[list[str]], client: TestClient) -> None:
    text, sentences, target = CASES[lang]
    fields = {"source": lang, "target": target, **SHORT}
    want, long = expected(nllb, lang), expected(nllb, lang, 3)
    given.clear()
    html = client.post("/translate", json={"q": f"<p>{text}</p>", "format": "html", **fields})
    assert html.status_code == 200, html.text
    assert html.json()["translatedText"] == f"<p>{want}</p>"
    upload = client.post(
        "/translate_file",
        files={"file": ("in.md", f"{text}\n".encode())},
        data={k: str(v) for k, v in fields.items()},
    )
    assert upload.status_code == 200, upload.text
    name = upload.json()["translatedFileUrl"].split("/download_file/")[1]
    assert client.get(f"/download_file/{name}").text == f"{want}\n"
    lines = client.post(
        "/translate_file",
        files={"file": ("in.txt", f"{LONG.format(text)}\n".encode())},
        data={k: str(v) for k, v in fields.items()},
    )
    name = lines.json()["translatedFileUrl"].split("/download_file/")[1]
    assert client.get(f"/download_file/{name}").text == f"{long}\n"
    stream = client.post("/translate/stream", json={"q": text, **fields})
    assert stream.status_code == 200, stream.text
    sent = events(stream.text)
    assert sent[-1] == ("done", {"translatedText": want})
    assert "".join(data["translatedText"] for kind, data in sent if kind == "message") == want
    # The stream's first sentence is sent alone (soonest), the rest in one request.
    assert given == [sentences, sentences, sentences * 3, sentences[:1], sentences[1:]]
