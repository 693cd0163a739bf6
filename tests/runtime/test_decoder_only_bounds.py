"""What a request adds to a decoder-only prompt (HY-MT's glossary and context) is bounded, tested by doubling: a
glossary of N, 2N and 4N entries, a context of N, 2N and 4N characters. Under the bound the prompt, and its cost,
grow by what was added (twice as much for twice the entries); past it, in the library a ValueError naming the
prompt's tokens and the model's limit, raised before any of the prompt runs; in documents and `onnxmt translate`
a line cut into parts that fit, or a one-line error when the context alone leaves no room. The tiny HY-MT takes
1024 positions (its config's max_position_embeddings)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from onnxmt import Translator
from onnxmt.cli import app
from onnxmt.documents import translate_document
from onnxmt.runtime.options import RuntimeOptions
from tests.documents.test_prepare_growth import assert_linear

PAIR = {"source_lang": "en", "target_lang": "zh"}
NEW_TOKENS = 4
TEXT = "The river was quiet."
# A glossary's terms of one width, so that each pair costs the prompt the same tokens; 64 terms do not fit the
# tiny model's 1024 positions, 32 do.
TERMS = 16
CONTEXT = 700  # characters; 4 x 700 do not fit, 2 x 700 do
runner = CliRunner()


def glossary(n: int) -> list[tuple[str, str]]:
    return [(f"w{i:03d}", f"x{i:03d}") for i in range(n)]


def holding(n: int) -> str:
    """A text that holds the source terms of glossary(n)."""
    return " ".join(source for source, _ in glossary(n))


def context(chars: int) -> str:
    return ("word " * chars)[:chars]


@pytest.fixture(scope="module")
def translator(hy_mt_onnx_dir: Path) -> Translator:
    return Translator(hy_mt_onnx_dir, RuntimeOptions(threads=1))


def _prepared(translator: Translator, text: str, **request: Any) -> Any:
    return translator.prepare([text], **PAIR, max_new_tokens=NEW_TOKENS, **request)[0]


def _refused_before_running(translator: Translator, monkeypatch: pytest.MonkeyPatch, text: str, **request: Any):
    """The ValueError translating `text` with `request` raises; no graph call happens first."""

    def run(*_: Any) -> Any:
        raise AssertionError("a prompt past the model's positions reached the graph")

    monkeypatch.setattr(translator.graphs, "extend", run)
    try:
        with pytest.raises(ValueError) as refused:
            translator.translate([text], **PAIR, max_new_tokens=NEW_TOKENS, **request)
    finally:
        monkeypatch.undo()
    return str(refused.value)


def _shown(translator: Translator, text: str, **request: Any) -> int:
    """The length of the prompt `model_input` shows for `text` (it refuses nothing)."""
    return len(translator.model_input(text, **PAIR, **request).ids)


def _doubling(lengths: list[int]) -> list[int]:
    """`lengths`, the prompt lengths of a doubling series (N, 2N, 4N entries or characters), whose increments
    double as what was added does."""
    first, second = lengths[1] - lengths[0], lengths[2] - lengths[1]
    assert first > 0 and abs(second - 2 * first) <= 2, lengths
    return lengths


def test_a_glossary_grows_the_prompt_by_its_terms_up_to_the_models_positions(
    translator: Translator, monkeypatch: pytest.MonkeyPatch
) -> None:
    limit = translator.tokenizer.model_max_length
    assert limit == translator.manifest.model["max_positions"] == 1024
    text = holding(4 * TERMS)
    lengths = _doubling([_shown(translator, text, glossary=glossary(n)) for n in (TERMS, 2 * TERMS, 4 * TERMS)])
    assert lengths[1] <= limit < lengths[2]
    # Under the bound: prepared with the prompt model_input shows, its cost grown by the same tokens, translated.
    plain = _prepared(translator, text)
    sized = [_prepared(translator, text, glossary=glossary(n)) for n in (TERMS, 2 * TERMS)]
    assert [len(p.ids) for p in sized] == lengths[:2]
    assert [p.cost - plain.cost for p in sized] == [n - len(plain.ids) for n in lengths[:2]]
    got = translator.translate([text], **PAIR, max_new_tokens=NEW_TOKENS, glossary=glossary(2 * TERMS))[0]
    assert 0 < len(got.token_ids) <= NEW_TOKENS
    # 4N terms: past the model's positions, refused with the count, before any of it runs.
    message = _refused_before_running(translator, monkeypatch, text, glossary=glossary(4 * TERMS))
    assert f"has {lengths[2]} tokens" in message and f"at most {limit}" in message and "glossary" in message
    # Terms a text does not hold cost nothing: with a glossary of 4N entries, a text without them gets its plain
    # prompt.
    assert _prepared(translator, TEXT, glossary=glossary(4 * TERMS)).ids == _prepared(translator, TEXT).ids


def test_a_context_grows_the_prompt_by_its_characters_up_to_the_models_positions(
    translator: Translator, monkeypatch: pytest.MonkeyPatch
) -> None:
    limit = translator.tokenizer.model_max_length
    lengths = _doubling([_shown(translator, TEXT, context=context(n)) for n in (CONTEXT, 2 * CONTEXT, 4 * CONTEXT)])
    assert lengths[1] <= limit < lengths[2]
    plain = _prepared(translator, TEXT)
    sized = [_prepared(translator, TEXT, context=context(n)) for n in (CONTEXT, 2 * CONTEXT)]
    assert [len(p.ids) for p in sized] == lengths[:2]
    assert [p.cost - plain.cost for p in sized] == [n - len(plain.ids) for n in lengths[:2]]
    got = translator.translate([TEXT], **PAIR, max_new_tokens=NEW_TOKENS, context=context(2 * CONTEXT))[0]
    assert 0 < len(got.token_ids) <= NEW_TOKENS
    message = _refused_before_running(translator, monkeypatch, TEXT, context=context(4 * CONTEXT))
    assert f"has {lengths[2]} tokens" in message and f"at most {limit}" in message and "context" in message


def test_a_text_past_the_models_positions_is_refused_not_truncated(translator: Translator) -> None:
    """A decoder-only prompt is never truncated (its end is the turn the model answers): a text of N, 2N, 4N
    words fits until its prompt passes the model's positions, then is refused; `Translator.cost` says so too."""
    words = [" ".join([TEXT] * n) for n in (20, 40, 80)]
    lengths = _doubling([_shown(translator, w) for w in words])
    assert lengths[1] <= 1024 < lengths[2]
    assert translator.cost([words[1]], **PAIR, max_new_tokens=NEW_TOKENS) == lengths[1] + NEW_TOKENS
    with pytest.raises(ValueError, match=rf"has {lengths[2]} tokens .* at most 1024"):
        translator.cost([words[2]], **PAIR)


def test_preparing_a_glossary_is_linear_in_its_entries(translator: Translator) -> None:
    """A glossary of many entries a text does not hold: the prompt stays the plain one, and preparing it takes
    time in proportion to the entries (each compared with the text once)."""
    big = glossary(1000) * 100
    assert _prepared(translator, TEXT, glossary=big).ids == _prepared(translator, TEXT).ids
    assert_linear(lambda g: translator.prepare([TEXT, "Good?"], **PAIR, glossary=g), lambda n: big[:n], 50_000)


def test_documents_cut_a_line_to_fit_and_refuse_a_context_that_leaves_no_room(translator: Translator) -> None:
    """A line whose terms make its prompt too long is cut into parts that each fit (each with its own terms); a
    context whose prompt alone passes the model's positions is a one-line ValueError, at once, where each
    character would otherwise become a text of its own under the whole context."""
    from onnxmt.documents.translate import plan_document

    limit = translator.tokenizer.model_max_length
    text = holding(4 * TERMS)
    plan = plan_document(translator, text, **PAIR, glossary=glossary(4 * TERMS))
    assert len(plan.sentences) > 1 and all(len(ids) <= limit for ids in plan.ids)
    assert " ".join(plan.sentences) == text
    out = translate_document(translator, "Good?", **PAIR, context=context(2 * CONTEXT), max_new_tokens=NEW_TOKENS)
    assert out
    with pytest.raises(ValueError, match=r"chat template with its context\) has \d+ tokens; .* at most 1024"):
        translate_document(translator, "Good? Yes.", **PAIR, context=context(4 * CONTEXT), max_new_tokens=2)


def test_the_command_line_cuts_a_glossary_line_and_refuses_a_long_context(hy_mt_onnx_dir: Path, tmp_path: Path):
    base = ["translate", "-m", str(hy_mt_onnx_dir), "--source-lang", "en", "--target-lang", "zh"]
    base += ["--max-new-tokens", str(NEW_TOKENS)]
    terms = tmp_path / "terms.tsv"
    terms.write_text("".join(f"{s}\t{t}\n" for s, t in glossary(4 * TERMS)), encoding="utf-8")
    shown = runner.invoke(app, [*base, "--glossary", str(terms), "--show-prompt", holding(4 * TERMS)])
    assert shown.exit_code == 0, shown.output
    counts = [int(n) for n in re.findall(r"^--- text \d+: (\d+) ids", shown.stdout, re.M)]
    assert len(counts) > 1 and max(counts) <= 1024
    fits = runner.invoke(app, [*base, "--context", context(2 * CONTEXT), TEXT])
    assert fits.exit_code == 0 and fits.stdout.strip(), fits.output
    refused = runner.invoke(app, [*base, "--context", context(4 * CONTEXT), TEXT])
    assert refused.exit_code == 2 and "no text fits: shorten the context" in refused.output, refused.output
