"""tokenization/chat.py: each family's chat template rendered torch-free equals transformers' apply_chat_template,
as text and as ids, for several language pairs; the template's BOS is not added twice; its errors are jinja2's."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jinja2
import pytest

from onnxmt.architectures import get_architecture
from onnxmt.architectures.decoder_only import prompt_messages, render_prompt
from onnxmt.tokenization import JsonTokenizer
from onnxmt.tokenization.chat import ChatTemplate
from tests.helpers.skips import importorskip

importorskip("transformers")

PAIRS = {
    "hy_mt": [("en", "zh"), ("zh", "en"), ("en", "fr"), ("de", "zh-Hant"), ("ja", "yue")],
    "hy_mt_7b": [("en", "zh"), ("fr", "en")],
    "qwen3": [("en", "zh"), ("en", "fr"), ("de", "ja")],
    "translategemma": [("en", "de"), ("en", "zh"), ("zh", "en"), ("pt", "fr"), ("de-AT", "zh_Hans")],
}
TEXTS = ("Hello world.", "  A text with spaces around it, trimmed by Gemma's template.  ", "多语言")


def _family_dir(request: pytest.FixtureRequest, family: str) -> Path:
    return request.getfixturevalue(f"{family}_hf_dir")


def _languages(directory: Path) -> dict[str, Any]:
    import json

    config = json.loads((directory / "config.json").read_text(encoding="utf-8"))
    return get_architecture(config["model_type"]).languages(directory, None)


@pytest.mark.parametrize("family", sorted(PAIRS))
def test_prompts_render_and_tokenize_as_transformers(request: pytest.FixtureRequest, family: str) -> None:
    from transformers import AutoTokenizer

    directory = _family_dir(request, family)
    hf = AutoTokenizer.from_pretrained(directory)
    template, tokenizer, languages = (
        ChatTemplate.from_dir(directory),
        JsonTokenizer.from_dir(directory),
        _languages(directory),
    )
    for source, target in PAIRS[family]:
        for text in TEXTS:
            messages, variables = prompt_messages(languages, text, source, target)
            expected = hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, **variables)
            rendered = render_prompt(template, languages, text, source, target)
            assert rendered == expected
            ids = hf.apply_chat_template(messages, tokenize=True, add_generation_prompt=True, **variables)
            ids = ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids
            assert tokenizer.prompt_ids(rendered) == list(ids)


@pytest.mark.parametrize("family", ["hy_mt", "hy_mt_7b", "translategemma"])
def test_the_template_writes_bos_once(request: pytest.FixtureRequest, family: str) -> None:
    directory = _family_dir(request, family)
    template, tokenizer = ChatTemplate.from_dir(directory), JsonTokenizer.from_dir(directory)
    bos = tokenizer.token_id(template.special_tokens["bos_token"])
    ids = tokenizer.prompt_ids(render_prompt(template, _languages(directory), "Hello.", "en", "zh"))
    assert ids[0] == bos and ids.count(bos) == 1


@pytest.mark.parametrize("generation_prompt", [True, False])
@pytest.mark.parametrize("thinking", [None, True, False])
def test_other_template_variables_match_transformers(
    qwen3_hf_dir: Path, hy_mt_hf_dir: Path, generation_prompt: bool, thinking: bool | None
) -> None:
    """add_generation_prompt both ways (HY-MT's README passes False, Hy-MT2's True), Qwen3's thinking switch, a
    system message and a finished turn."""
    from transformers import AutoTokenizer

    variables = {} if thinking is None else {"enable_thinking": thinking}
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Translate: hello"},
        {"role": "assistant", "content": "<think>\nok\n</think>\n\nbonjour"},
        {"role": "user", "content": "Translate: good night"},
    ]
    for directory in (qwen3_hf_dir, hy_mt_hf_dir):
        expected = AutoTokenizer.from_pretrained(directory).apply_chat_template(
            messages, tokenize=False, add_generation_prompt=generation_prompt, **variables
        )
        assert ChatTemplate.from_dir(directory).render(messages, generation_prompt, **variables) == expected


def test_template_errors_are_jinja2s(translategemma_hf_dir: Path) -> None:
    template = ChatTemplate.from_dir(translategemma_hf_dir)
    with pytest.raises(jinja2.TemplateError, match="exactly one item"):
        template.render([{"role": "user", "content": "plain text"}])
    item = {"type": "text", "source_lang_code": "xx", "target_lang_code": "de", "text": "Hi"}
    with pytest.raises(jinja2.TemplateError, match="Unsupported source language code: xx"):
        template.render([{"role": "user", "content": [item]}])


def test_the_sandbox_refuses_attribute_escapes(qwen3_hf_dir: Path) -> None:
    """A template is data from a model directory: it runs sandboxed, as in transformers."""
    evil = ChatTemplate("{{ messages.__class__.__mro__ }}", {})
    with pytest.raises(jinja2.exceptions.SecurityError):
        evil.render([{"role": "user", "content": "x"}])
