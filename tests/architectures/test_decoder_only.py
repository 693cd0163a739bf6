"""architectures/decoder_only.py: the registry entries of HY-MT, Qwen3 and TranslateGemma (sizes, stop tokens,
deterministic generation defaults, language tables) and each family's translation request."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from onnxmt.architectures import get_architecture, supported
from onnxmt.architectures.decoder_only import HY_MT_EN, HY_MT_ZH, nearest_code, prompt_messages
from onnxmt.manifest import ModelDirError, check_generation_config
from tests.helpers.skips import importorskip

HY = {"prompt": "hy_mt", "names": {"en": "English", "fr": "French", "zh": "Chinese", "zh-Hant": "Traditional Chinese"}}
HY["names_zh"] = {"en": "英语", "fr": "法语", "zh": "中文", "zh-Hant": "繁体中文"}


def _read(directory: Path, name: str) -> dict:
    return json.loads((directory / name).read_text(encoding="utf-8"))


def test_the_three_families_are_registered() -> None:
    for model_type in ("hunyuan_v1_dense", "qwen3", "gemma3", "gemma3_text"):
        assert model_type in supported()
        assert get_architecture(model_type).kind == "decoder_only"
    assert get_architecture("marian").kind == "encoder_decoder"


@pytest.mark.parametrize(
    ("family", "model_type"),
    [("hy_mt", "hunyuan_v1_dense"), ("qwen3", "qwen3"), ("translategemma", "gemma3"), ("gemma3_text", "gemma3_text")],
)
def test_facts_and_tokens_come_from_the_real_config_fields(
    request: pytest.FixtureRequest, family: str, model_type: str
) -> None:
    directory = request.getfixturevalue(f"{family}_hf_dir")
    config, generation = _read(directory, "config.json"), _read(directory, "generation_config.json")
    assert config["model_type"] == model_type
    arch = get_architecture(model_type)
    facts = arch.facts(config)
    text = config.get("text_config") or config  # TranslateGemma: the text decoder's config inside the wrapper
    assert (facts["num_heads"], facts["num_kv_heads"], facts["head_dim"]) == (4, 2, 32)  # GQA, head_dim != 64 / 4
    assert facts["num_layers"] == text["num_hidden_layers"] and facts["vocab_size"] == text["vocab_size"]
    tokens = arch.tokens(directory, config, generation)
    assert tokens["eos_ids"] == generation["eos_token_id"] and len(tokens["eos_ids"]) == 2
    # The vendors sample; onnxmt's defaults are deterministic, the penalty kept.
    assert generation["do_sample"] is True
    with pytest.raises(ModelDirError, match="do_sample"):
        check_generation_config(generation, "generation_config.json")
    check_generation_config(arch.deterministic(generation), "generation_config.json")
    defaults = arch.generation(generation, config)
    assert "do_sample" not in defaults and "top_k" not in defaults
    assert defaults.get("repetition_penalty") == generation.get("repetition_penalty")
    languages = arch.languages(directory, None)
    assert languages["scheme"] == "chat_template" and languages["vendor_sampling"]["do_sample"] is True
    assert len(languages["names"]) >= 14


def test_gemma_ids_are_the_real_ones(translategemma_hf_dir: Path) -> None:
    from onnxmt.tokenization import JsonTokenizer

    tokenizer = JsonTokenizer.from_dir(translategemma_hf_dir)
    real = {"<pad>": 0, "<eos>": 1, "<bos>": 2, "<start_of_turn>": 105, "<end_of_turn>": 106}
    assert {token: tokenizer.token_id(token) for token in real} == real
    assert _read(translategemma_hf_dir, "generation_config.json")["eos_token_id"] == [1, 106]


def test_hy_mt_picks_the_chinese_template_when_either_side_is_chinese() -> None:
    for source, target in (("zh", "en"), ("en", "zh"), ("zh-Hant", "fr"), ("fr", "zh-Hant")):
        (message,), _ = prompt_messages(HY, "X", source, target)
        assert message["content"] == HY_MT_ZH.format(target=HY["names_zh"][target], text="X")
    (message,), variables = prompt_messages(HY, "X", "en", "fr")
    english = "Translate the following segment into French, without additional explanation.\n\nX"
    assert message == {"role": "user", "content": english}
    assert variables == {}
    chinese = "将以下文本翻译为英语，注意只需要输出翻译后的结果，不要额外解释：\n\nX"  # full-width punctuation
    assert prompt_messages(HY, "X", "zh", "en")[0][0]["content"] == chinese
    with pytest.raises(ValueError, match="valid: en, fr, zh, zh-Hant"):
        prompt_messages(HY, "X", "en", "xx")


def test_qwen3_thinking_off_and_its_instruction_changeable() -> None:
    qwen = {"prompt": "qwen3", "names": {"fr": "French"}, "instruction": HY_MT_EN}
    (message,), variables = prompt_messages(qwen, "Hi", "en", "fr")
    assert variables == {"enable_thinking": False}
    assert message["content"] == HY_MT_EN.format(target="French", text="Hi")
    custom = {**qwen, "instruction": "Into {target}:\n{text}"}
    assert prompt_messages(custom, "Hi", "en", "fr")[0][0]["content"] == "Into French:\nHi"


def test_translategemma_gets_its_structured_item_with_the_nearest_known_codes() -> None:
    names = {"en": "English", "de": "German", "pt-BR": "Portuguese", "zh": "Chinese", "zh-Hans": "Chinese"}
    gemma = {"prompt": "translategemma", "names": names}
    (message,), _ = prompt_messages(gemma, "Hi", "zh", "pt")
    assert message["content"] == [
        {"type": "text", "source_lang_code": "zh", "target_lang_code": "pt-BR", "text": "Hi"}
    ]  # `zh` stays `zh`; `pt` becomes the table's pt-BR
    assert nearest_code("de_AT", names) == "de" and nearest_code("zh_Hans", names) == "zh-Hans"
    with pytest.raises(ValueError, match="'xx' is not supported"):
        nearest_code("xx", names)


def test_translategemma_table_is_read_from_its_template(translategemma_hf_dir: Path) -> None:
    from onnxmt.testing.decoder_only import TRANSLATEGEMMA_LANGUAGES

    table = get_architecture("gemma3").languages(translategemma_hf_dir, None)["names"]
    assert table == TRANSLATEGEMMA_LANGUAGES


def test_facts_of_a_config_that_leaves_defaults_out() -> None:
    """TranslateGemma-4B's config.json names only what differs from Gemma 3's defaults in its text_config; export
    reads the sizes from the config transformers resolved (exporter: `model.config.to_dict()`)."""
    transformers = importorskip("transformers")
    text = {"hidden_size": 2560, "intermediate_size": 10240, "num_hidden_layers": 34, "sliding_window": 1024}
    resolved = transformers.Gemma3Config(text_config=text).to_dict()
    facts = get_architecture("gemma3").facts(resolved)
    assert (facts["num_heads"], facts["num_kv_heads"], facts["head_dim"]) == (8, 4, 256)
    assert (facts["vocab_size"], facts["num_layers"], facts["d_model"]) == (262208, 34, 2560)
    with pytest.raises(KeyError):
        get_architecture("gemma3").facts({"model_type": "gemma3", "text_config": text})


# A Gemma 3 chat model's template (its structure: BOS, turns of `<start_of_turn>{role}\n{content|trim}<end_of_turn>`,
# the assistant called `model`), with no TranslateGemma language table.
GEMMA3_CHAT_TEMPLATE = (
    "{{ bos_token }}{%- for message in messages -%}"
    "{%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}"
    "{{ '<start_of_turn>' + role + '\\n' + message['content'] | trim + '<end_of_turn>\\n' }}"
    "{%- endfor -%}{%- if add_generation_prompt -%}{{ '<start_of_turn>model\\n' }}{%- endif -%}"
)


def test_a_gemma3_chat_model_gets_the_plain_instruction(gemma3_text_hf_dir: Path, tmp_path: Path) -> None:
    import shutil

    from transformers import AutoTokenizer

    from onnxmt.architectures.decoder_only import render_prompt
    from onnxmt.tokenization.chat import ChatTemplate

    directory = tmp_path / "gemma3-chat"
    shutil.copytree(gemma3_text_hf_dir, directory)
    (directory / "chat_template.jinja").write_text(GEMMA3_CHAT_TEMPLATE, encoding="utf-8")
    languages = get_architecture("gemma3_text").languages(directory, None)
    assert languages["prompt"] == "instruction" and languages["names"]["de"] == "German"
    messages, variables = prompt_messages(languages, "Hi.", "en", "de")
    assert messages == [{"role": "user", "content": HY_MT_EN.format(target="German", text="Hi.")}] and not variables
    expected = AutoTokenizer.from_pretrained(directory).apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True
    )
    assert render_prompt(ChatTemplate.from_dir(directory), languages, "Hi.", "en", "de") == expected


def test_hy_mt_terminology_and_context_prompts() -> None:
    glossary = [("river", "河"), ("market", "市场")]
    (message,), _ = prompt_messages(HY, "The river market.", "en", "zh", glossary=glossary)
    assert message["content"] == (
        "参考下面的翻译：\nriver 翻译成 河\nmarket 翻译成 市场\n\n"
        "将以下文本翻译为中文，注意只需要输出翻译后的结果，不要额外解释：\nThe river market."
    )
    (message,), _ = prompt_messages(HY, "It closed.", "en", "fr", context="The market opened at six.")
    assert message["content"] == (
        "The market opened at six.\n"
        "参考上面的信息，把下面的文本翻译成法语，注意不需要翻译上文，也不要额外解释：\nIt closed."
    )
    with pytest.raises(ValueError, match="not both"):
        prompt_messages(HY, "x", "en", "fr", glossary=glossary, context="c")
    with pytest.raises(ValueError, match=r"prompt \(qwen3\) has no such template"):
        prompt_messages({"prompt": "qwen3", "names": {"fr": "French"}}, "x", "en", "fr", context="c")
