"""Random decoder-only translators built offline: HY-MT1.5-1.8B (`hunyuan_v1_dense`), Qwen3-0.6B (`qwen3`) and
TranslateGemma-4B (`Gemma3ForConditionalGeneration`, or its text decoder alone as `gemma3_text`), each from the real
checkpoint's config.json with the sizes shrunk (layers, widths, vocabulary) and every other field kept: rope
settings (Hunyuan's NTK-alpha "dynamic" base, Gemma's local/global bases with linear scaling on global layers and
its sliding window), grouped-query heads, `head_dim` apart from hidden / heads, q/k norms, Gemma's
query_pre_attn_scalar, tied embeddings. The models are the real transformers classes, randomly initialised.

The tokenizers are small byte-level BPEs (Hunyuan, Qwen3) or a sentencepiece-style BPE with byte fallback
(Gemma), trained with the `tokenizers` library on generated text, with the families' special tokens spelled as the
real ones are. Their ids are the real ones for Gemma (pad 0, eos 1, bos 2, <start_of_turn> 105, <end_of_turn>
106); Hunyuan's (120000+) and Qwen3's (151643+) sit past a 120k/150k-row vocabulary the tiny models do not have, so
their special tokens get the first ids after the BPE's. The chat templates:

- Qwen3: Qwen3's published `chat_template` text (the hybrid-thinking ChatML template, verbatim);
- HY-MT: the Hunyuan dense template's structure as the HY-MT and Hy-MT2 repositories document its output
  (`<｜hy_begin▁of▁sentence｜>[system<｜hy_place▁holder▁no▁3｜>]<｜hy_User｜>user<｜hy_Assistant｜>`); the shipped file
  could not be read here, so this is a reconstruction with the same rendered bytes for a single user turn;
- TranslateGemma: the structure of its template (one structured user item with `source_lang_code`,
  `target_lang_code`, `text`; a language table; `raise_exception` on anything else), with a shortened language
  table: a reconstruction as well.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .builder import generate_corpus, write_json

# HY-MT1.5-1.8B's special tokens (U+FF5C bars, U+2581 spaces), as in its tokenizer.
HY_BOS = "<｜hy_begin▁of▁sentence｜>"
HY_USER = "<｜hy_User｜>"
HY_ASSISTANT = "<｜hy_Assistant｜>"
HY_EOS = "<｜hy_place▁holder▁no▁2｜>"  # ends the assistant turn: generation's eos
HY_SYSTEM_END = "<｜hy_place▁holder▁no▁3｜>"
HY_NO_GENERATION = "<｜hy_place▁holder▁no▁8｜>"
HY_PAD = "<｜hy_▁pad▁｜>"
HY_EOD = "<｜hy_end▁of▁sentence｜>"
HY_SPECIALS = (HY_BOS, HY_EOD, HY_PAD, HY_USER, HY_ASSISTANT, HY_EOS, HY_SYSTEM_END, HY_NO_GENERATION)

HY_MT_CHAT_TEMPLATE = (
    "{%- set ns = namespace(system_prompt='') %}\n"
    "{%- for message in messages %}\n"
    "    {%- if message['role'] == 'system' %}\n"
    "        {%- set ns.system_prompt = ns.system_prompt + message['content'] %}\n"
    "    {%- endif %}\n"
    "{%- endfor %}\n"
    "{{- bos_token }}\n"
    "{{- ns.system_prompt }}\n"
    "{%- if ns.system_prompt != '' %}\n"
    "    {{- '" + HY_SYSTEM_END + "' }}\n"
    "{%- endif %}\n"
    "{%- for message in messages %}\n"
    "    {%- if message['role'] == 'user' %}\n"
    "        {{- '" + HY_USER + "' + message['content'] }}\n"
    "    {%- elif message['role'] == 'assistant' %}\n"
    "        {{- '" + HY_ASSISTANT + "' + message['content'] + eos_token }}\n"
    "    {%- endif %}\n"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}\n"
    "    {{- '" + HY_ASSISTANT + "' }}\n"
    "{%- else %}\n"
    "    {{- '" + HY_NO_GENERATION + "' }}\n"
    "{%- endif %}\n"
)

# HY-MT1.5-7B and Hunyuan-MT-7B: another vocabulary and other turn tokens ("The 7B model uses a different vocabulary
# than other models", HY-MT finetune.py): `<|startoftext|>[system<|extra_4|>]user<|extra_0|>` -> `answer<|eos|>`.
HY7_BOS, HY7_USER_END, HY7_SYSTEM_END, HY7_EOS, HY7_PAD = (
    "<|startoftext|>", "<|extra_0|>", "<|extra_4|>", "<|eos|>", "<|pad|>"
)  # fmt: skip
HY7_SPECIALS = (HY7_BOS, HY7_EOS, HY7_PAD, HY7_USER_END, HY7_SYSTEM_END)
# Its template has no add_generation_prompt branch: the user turn's end is the assistant's start. Reconstructed from
# the rendered format the vendor documents, as HY_MT_CHAT_TEMPLATE is.
HY_MT_7B_CHAT_TEMPLATE = (
    "{%- set ns = namespace(system='') -%}\n"
    "{%- for message in messages -%}{%- if message['role'] == 'system' -%}"
    "{%- set ns.system = message['content'] -%}{%- endif -%}{%- endfor -%}\n"
    "{{- bos_token -}}\n"
    "{%- if ns.system != '' -%}{{- ns.system + '" + HY7_SYSTEM_END + "' -}}{%- endif -%}\n"
    "{%- for message in messages -%}\n"
    "{%- if message['role'] == 'user' -%}{{- message['content'] + '" + HY7_USER_END + "' -}}\n"
    "{%- elif message['role'] == 'assistant' -%}{{- message['content'] + eos_token -}}\n"
    "{%- endif -%}\n"
    "{%- endfor -%}\n"
)

# Qwen3's chat_template (Qwen/Qwen3-0.6B and its siblings), verbatim.
QWEN3_CHAT_TEMPLATE = r"""{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0].role == 'system' %}
        {{- messages[0].content + '\n\n' }}
    {%- endif %}
    {{- "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
    {%- if messages[0].role == 'system' %}
        {{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if ns.multi_step_tool and message.role == "user" and not(message.content.startswith('<tool_response>') and message.content.endswith('</tool_response>')) %}
        {%- set ns.multi_step_tool = false %}
        {%- set ns.last_query_index = index %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {%- set content = message.content %}
        {%- set reasoning_content = '' %}
        {%- if message.reasoning_content is defined and message.reasoning_content is not none %}
            {%- set reasoning_content = message.reasoning_content %}
        {%- else %}
            {%- if '</think>' in message.content %}
                {%- set content = message.content.split('</think>')[-1].lstrip('\n') %}
                {%- set reasoning_content = message.content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') %}
            {%- endif %}
        {%- endif %}
        {%- if loop.index0 > ns.last_query_index %}
            {%- if loop.last or (not loop.last and reasoning_content) %}
                {{- '<|im_start|>' + message.role + '\n<think>\n' + reasoning_content.strip('\n') + '\n</think>\n\n' + content.lstrip('\n') }}
            {%- else %}
                {{- '<|im_start|>' + message.role + '\n' + content }}
            {%- endif %}
        {%- else %}
            {{- '<|im_start|>' + message.role + '\n' + content }}
        {%- endif %}
        {%- if message.tool_calls %}
            {%- for tool_call in message.tool_calls %}
                {%- if (loop.first and content) or (not loop.first) %}
                    {{- '\n' }}
                {%- endif %}
                {%- if tool_call.function %}
                    {%- set tool_call = tool_call.function %}
                {%- endif %}
                {{- '<tool_call>\n{"name": "' }}
                {{- tool_call.name }}
                {{- '", "arguments": ' }}
                {%- if tool_call.arguments is string %}
                    {{- tool_call.arguments }}
                {%- else %}
                    {{- tool_call.arguments | tojson }}
                {%- endif %}
                {{- '}\n</tool_call>' }}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if loop.first or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- message.content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\n\n</think>\n\n' }}
    {%- endif %}
{%- endif %}"""  # noqa: E501
QWEN3_SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
QWEN3_ADDED = ("<think>", "</think>")  # added tokens, not special (Qwen3's tokenizer marks them so)

# TranslateGemma's language table, shortened: codes as the template knows them (ISO 639-1 and regional variants).
TRANSLATEGEMMA_LANGUAGES = {
    "en": "English", "de": "German", "de-DE": "German", "fr": "French", "es": "Spanish", "ja": "Japanese",
    "zh": "Chinese", "zh-Hans": "Chinese", "zh-Hant": "Chinese", "pt": "Portuguese", "pt-BR": "Portuguese",
    "ru": "Russian", "ko": "Korean", "it": "Italian",
}  # fmt: skip
_GEMMA_INSTRUCTION = (
    "You are a professional {{ source_lang }} ({{ source_code }}) to {{ target_lang }} ({{ target_code }}) "
    "translator. Your goal is to accurately convey the meaning and nuances of the original {{ source_lang }} text "
    "while adhering to {{ target_lang }} grammar, vocabulary, and cultural sensitivities.\n"
    "Produce only the {{ target_lang }} translation, without any additional explanations or commentary. Please "
    "translate the following {{ source_lang }} text into {{ target_lang }}:\n\n\n"
)
TRANSLATEGEMMA_CHAT_TEMPLATE = (
    "{%- set languages = " + json.dumps(TRANSLATEGEMMA_LANGUAGES, ensure_ascii=False) + " -%}\n"
    "{%- if messages[0]['role'] != 'user' -%}\n"
    "{{ raise_exception('Conversations must start with a user turn; only user and assistant roles are supported.') }}\n"
    "{%- endif -%}\n"
    "{{ bos_token }}\n"
    "{%- for message in messages -%}\n"
    "{%- if message['role'] == 'user' -%}\n"
    "{%- if message['content'] is string or message['content'] | length != 1 -%}\n"
    "{{ raise_exception('User content must be a list with exactly one item.') }}\n"
    "{%- endif -%}\n"
    "{%- set item = message['content'][0] -%}\n"
    "{%- set source_code = item['source_lang_code'] | replace('_', '-') -%}\n"
    "{%- set target_code = item['target_lang_code'] | replace('_', '-') -%}\n"
    "{%- if source_code not in languages -%}\n"
    "{{ raise_exception('Unsupported source language code: ' + source_code) }}\n"
    "{%- endif -%}\n"
    "{%- if target_code not in languages -%}\n"
    "{{ raise_exception('Unsupported target language code: ' + target_code) }}\n"
    "{%- endif -%}\n"
    "{%- set source_lang = languages[source_code] -%}\n"
    "{%- set target_lang = languages[target_code] -%}\n"
    "{%- if item['type'] != 'text' -%}\n"
    "{{ raise_exception('Only text items are supported here.') }}\n"
    "{%- endif -%}\n"
    "{{ '<start_of_turn>user\\n' }}" + _GEMMA_INSTRUCTION + "{{ item['text'] | trim }}{{ '<end_of_turn>\\n' }}\n"
    "{%- elif message['role'] == 'assistant' -%}\n"
    "{{ '<start_of_turn>model\\n' }}{{ message['content'] | trim }}{{ '<end_of_turn>\\n' }}\n"
    "{%- else -%}\n"
    "{{ raise_exception('Only user and assistant roles are supported.') }}\n"
    "{%- endif -%}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}\n"
    "{{ '<start_of_turn>model\\n' }}\n"
    "{%- endif -%}\n"
)
# Gemma 3's first ids, as its tokenizer has them: <start_of_turn> 105, <end_of_turn> 106 (the rest unused here).
GEMMA_SPECIALS = (
    "<pad>", "<eos>", "<bos>", "<unk>", "<mask>", "[@BOS@]",
    *(f"<unused{i}>" for i in range(99)),
    "<start_of_turn>", "<end_of_turn>",
)  # fmt: skip
GEMMA_IMAGE_TOKENS = ("<start_of_image>", "<end_of_image>")
GEMMA_IMAGE_SOFT_TOKEN = "<image_soft_token>"  # the last id, as in Gemma 3's vocabulary (262144)


# The test-model family of each real architecture the benchmarks build at full size (benchmarks/decoder_models.py):
# a family is named in its own modules only (tests/architectures/test_registry.py).
BENCHMARK_FAMILIES = {"hy-mt1.5-1.8b": "hy_mt", "qwen3-1.7b": "qwen3", "translategemma-4b": "gemma3_text"}


@dataclass(frozen=True, kw_only=True)
class DecoderOnlySpec:
    """A tiny random decoder-only translator; `family`: "hy_mt" (HY-MT1.5-1.8B), "hy_mt_7b" (HY-MT1.5-7B's
    vocabulary and turn tokens), "qwen3", "translategemma" or "gemma3_text"."""

    family: str
    hidden_size: int = 64
    layers: int = 2
    heads: int = 4
    kv_heads: int = 2
    head_dim: int = 32  # not hidden / heads, as in every real config of these families
    intermediate_size: int = 128
    bpe_vocab: int = 600
    sliding_window: int = 8  # Gemma: tiny, so that tests cross it
    max_position_embeddings: int = 1024
    # The embedding's rows, as the real checkpoint's (HY-MT1.5-1.8B: 120818), past the tokenizer's; None: as many
    # as the tokenizer needs (Gemma: rounded up past its image token).
    vocab_size: int | None = None
    init_std: float = 0.1
    seed: int = 0
    config_overrides: dict[str, Any] = field(default_factory=dict)


def build_decoder_only(output_dir: str | Path, spec: DecoderOnlySpec) -> Path:
    """Write a random model directory of `spec` as transformers saves the real checkpoint (config.json,
    generation_config.json, model.safetensors, tokenizer.json, tokenizer_config.json, chat_template.jinja)."""
    import torch
    from transformers import GenerationConfig

    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    builders = {"hy_mt": _hy_mt, "hy_mt_7b": _hy_mt, "qwen3": _qwen3, "translategemma": _gemma, "gemma3_text": _gemma}
    if spec.family not in builders:
        raise ValueError(f"unknown family {spec.family!r}; valid: {', '.join(builders)}")
    ids = _write_tokenizer(out, spec)
    if spec.vocab_size is not None:
        if spec.vocab_size < ids["vocab_size"]:
            raise ValueError(f"vocab_size {spec.vocab_size} is below the tokenizer's {ids['vocab_size']}")
        ids["vocab_size"] = spec.vocab_size
    torch.manual_seed(spec.seed)
    model, generation = builders[spec.family](spec, ids)
    model.eval()
    # transformers initialises norm weights to ones (Gemma's `1 + w` to zeros); a trained model's differ per
    # channel, which is what makes a q/k norm before the rotation differ from one after it (Hunyuan): spread them.
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "norm" in name:
                parameter.add_(torch.randn_like(parameter) * 0.3)
    model.generation_config = GenerationConfig(**generation)
    model.save_pretrained(out)
    return out


def _hy_mt(spec: DecoderOnlySpec, ids: dict[str, int]) -> tuple[Any, dict[str, Any]]:
    """HY-MT1.5-1.8B (or -7B): config.json's fields with the sizes shrunk."""
    from transformers import HunYuanDenseV1Config, HunYuanDenseV1ForCausalLM

    seven = spec.family == "hy_mt_7b"
    bos, eos, pad = (HY7_BOS, HY7_EOS, HY7_PAD) if seven else (HY_BOS, HY_EOS, HY_PAD)

    config = HunYuanDenseV1Config(
        **_config(
            spec,
            ids,
            hidden_act="silu",
            rms_norm_eps=1e-5,
            use_cache=True,
            tie_word_embeddings=True,
            rope_theta=10000.0,
            # "dynamic" with alpha: a static NTK-alpha base (families-decoder.md, trap 6).
            rope_scaling={"type": "dynamic", "alpha": 1000.0, "factor": 1.0},
            attention_bias=False,
            mlp_bias=False,
            bos_token_id=ids[bos],
            eos_token_id=ids[eos],
            pad_token_id=ids[pad],
        )
    )
    # 1.8B: the end of the assistant turn and of the document; 7B: `stop_token_ids: [127960]` (<|eos|>).
    stops = [ids[eos]] if seven else [ids[HY_EOS], ids[HY_EOD]]
    sampling = {"top_k": 20, "top_p": 0.6, "temperature": 0.7, "repetition_penalty": 1.05}
    return HunYuanDenseV1ForCausalLM(config), _generation(ids[bos], stops, ids[pad], **sampling)


def _qwen3(spec: DecoderOnlySpec, ids: dict[str, int]) -> tuple[Any, dict[str, Any]]:
    """Qwen3-0.6B: config.json's fields with the sizes shrunk."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(
        **_config(
            spec,
            ids,
            hidden_act="silu",
            rms_norm_eps=1e-6,
            tie_word_embeddings=True,
            rope_theta=1000000.0,
            attention_bias=False,
            use_sliding_window=False,
            sliding_window=None,
            bos_token_id=ids["<|endoftext|>"],
            eos_token_id=ids["<|im_end|>"],
        )
    )
    end = ids["<|endoftext|>"]
    generation = _generation(end, [ids["<|im_end|>"], end], end, temperature=0.6, top_k=20, top_p=0.95)
    return Qwen3ForCausalLM(config), generation


def _gemma(spec: DecoderOnlySpec, ids: dict[str, int]) -> tuple[Any, dict[str, Any]]:
    """TranslateGemma-4B (Gemma 3 4B's text config, a tiny SigLIP tower), or its text decoder alone."""
    from transformers import Gemma3Config, Gemma3ForCausalLM, Gemma3ForConditionalGeneration, Gemma3TextConfig

    text = Gemma3TextConfig(
        **_config(
            spec,
            ids,
            hidden_activation="gelu_pytorch_tanh",
            rms_norm_eps=1e-6,
            query_pre_attn_scalar=spec.head_dim // 2,  # 27B's is not head_dim: the scale must come from this field
            sliding_window=spec.sliding_window,
            rope_theta=1000000.0,
            rope_local_base_freq=10000.0,
            rope_scaling={"rope_type": "linear", "factor": 8.0},
            # Layer 1 of 2 global (the real 5 local : 1 global, shortened), so both kinds are exercised.
            layer_types=(["sliding_attention", "full_attention"] * spec.layers)[: spec.layers],
            final_logit_softcapping=None,
            attn_logit_softcapping=None,
            pad_token_id=0,
            eos_token_id=1,
            bos_token_id=2,
        )
    )
    generation = _generation(2, [1, 106], 0, cache_implementation="hybrid", top_k=64, top_p=0.95)
    if spec.family == "gemma3_text":
        return Gemma3ForCausalLM(text), generation
    vision = {
        "model_type": "siglip_vision_model", "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1,
        "num_attention_heads": 2, "image_size": 28, "patch_size": 14, "vision_use_head": False,
    }  # fmt: skip
    config = Gemma3Config(
        text_config=text.to_dict(),
        vision_config=vision,
        mm_tokens_per_image=4,
        boi_token_index=ids["<start_of_image>"],
        eoi_token_index=ids["<end_of_image>"],
        image_token_index=ids[GEMMA_IMAGE_SOFT_TOKEN],
        initializer_range=spec.init_std,
        tie_word_embeddings=True,
    )
    return Gemma3ForConditionalGeneration(config), generation


def _generation(bos: int, eos: list[int], pad: int, **fields: Any) -> dict[str, Any]:
    """generation_config.json as the family's vendor ships it: its special ids, and sampling on with the vendor's
    knobs (`fields`), which an export keeps and greedy and beam search ignore (architectures SAMPLING_FIELDS)."""
    return {"bos_token_id": bos, "eos_token_id": eos, "pad_token_id": pad, "do_sample": True, **fields}


def _config(spec: DecoderOnlySpec, ids: dict[str, int], **fields: Any) -> dict[str, Any]:
    """Config fields as the real config.json spells them (`rope_theta`, `rope_scaling`: keys transformers 5 still
    reads but its config classes no longer declare), the sizes the spec shrinks beside them, and the spec's
    `config_overrides` over both."""
    sizes = {
        "vocab_size": ids["vocab_size"],
        "hidden_size": spec.hidden_size,
        "intermediate_size": spec.intermediate_size,
        "num_hidden_layers": spec.layers,
        "num_attention_heads": spec.heads,
        "num_key_value_heads": spec.kv_heads,
        "head_dim": spec.head_dim,
        "max_position_embeddings": spec.max_position_embeddings,
        "initializer_range": spec.init_std,
    }
    return {**sizes, **fields, **spec.config_overrides}


def _write_tokenizer(out: Path, spec: DecoderOnlySpec) -> dict[str, int]:
    """tokenizer.json, tokenizer_config.json and chat_template.jinja; the special tokens' ids and the embedding's
    row count (`vocab_size`)."""
    english, chinese = generate_corpus(spec.seed, lines=1500)
    corpus = english + chinese
    gemma = spec.family in ("translategemma", "gemma3_text")
    if gemma:
        tokenizer = _sentencepiece_bpe(corpus, spec.bpe_vocab)
        tokenizer.add_special_tokens([*GEMMA_IMAGE_TOKENS, GEMMA_IMAGE_SOFT_TOKEN])
        roles = {"bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>", "unk_token": "<unk>"}
        template = TRANSLATEGEMMA_CHAT_TEMPLATE
    elif spec.family == "qwen3":
        tokenizer = _byte_level_bpe(corpus, spec.bpe_vocab, QWEN3_SPECIALS)
        tokenizer.add_tokens(list(QWEN3_ADDED))
        roles = {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}
        template = QWEN3_CHAT_TEMPLATE
    elif spec.family == "hy_mt_7b":
        tokenizer = _byte_level_bpe(corpus, spec.bpe_vocab, HY7_SPECIALS)
        roles = {"bos_token": HY7_BOS, "eos_token": HY7_EOS, "pad_token": HY7_PAD}
        template = HY_MT_7B_CHAT_TEMPLATE
    else:
        tokenizer = _byte_level_bpe(corpus, spec.bpe_vocab, HY_SPECIALS)
        roles = {"bos_token": HY_BOS, "eos_token": HY_EOS, "pad_token": HY_PAD}
        template = HY_MT_CHAT_TEMPLATE
    tokenizer.save(str(out / "tokenizer.json"))
    size = tokenizer.get_vocab_size(with_added_tokens=True)
    config: dict[str, Any] = {
        **roles,
        "add_bos_token": False,  # the chat template writes BOS (Gemma's tokenizer would add one outside it)
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": spec.max_position_embeddings,
        "tokenizer_class": "PreTrainedTokenizerFast",
    }
    if gemma:
        config["add_bos_token"] = True  # Gemma's tokenizer adds <bos> to plain text; the template writes its own
    write_json(out / "tokenizer_config.json", config)
    (out / "chat_template.jinja").write_text(template, encoding="utf-8")
    ids = {token: tokenizer.token_to_id(token) for token in tokenizer.get_vocab(with_added_tokens=True)}
    # Gemma 3 pads its embedding past the image token (262144 -> 262208); the others use the tokenizer's size.
    ids["vocab_size"] = -(-(size + 1) // 64) * 64 if gemma else size
    return ids


def _byte_level_bpe(corpus: list[str], size: int, specials: tuple[str, ...]) -> Any:
    """A byte-level BPE (Qwen3's and Hunyuan's kind), its special tokens added after the trained vocabulary."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=size, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    tokenizer.train_from_iterator(corpus, trainer)
    tokenizer.add_special_tokens(list(specials))
    return tokenizer


def _sentencepiece_bpe(corpus: list[str], size: int) -> Any:
    """Gemma's kind: spaces as U+2581, no pre-tokenizer, byte fallback; the special tokens first, at Gemma's ids."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, trainers

    tokenizer = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tokenizer.normalizer = normalizers.Replace(Regex(" "), "▁")
    tokenizer.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()])
    bytes_ = [f"<0x{b:02X}>" for b in range(256)]
    trainer = trainers.BpeTrainer(
        vocab_size=size + len(GEMMA_SPECIALS) + 256,
        special_tokens=[*GEMMA_SPECIALS, *bytes_],
        show_progress=False,
        max_token_length=8,
    )
    tokenizer.train_from_iterator(corpus, trainer)
    from tokenizers import AddedToken

    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in GEMMA_SPECIALS])
    return tokenizer
