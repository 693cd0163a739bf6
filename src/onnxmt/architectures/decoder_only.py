"""Decoder-only translators: HY-MT (`hunyuan_v1_dense`), TranslateGemma (`gemma3`, whose text decoder alone is
exported; also plain `gemma3_text`) and Qwen3 (`qwen3`).

The model is its decoder with a KV cache (export/decoder_only.py); the prompt, the model's own chat template around
the family's translation request, replaces the encoder. Each family says here what the request is:

- HY-MT: the model card's user turn, no system message, the generation prompt on: the Chinese template with Chinese
  language names when the source or the target is Chinese (zh, zh-Hant), the English template with English names
  otherwise; its terminology and context templates when a request carries a glossary or a context;
- TranslateGemma: its structured user content (`source_lang_code`, `target_lang_code`, `text`), which its template
  turns into its instruction; a client's code passed as given when the template's table knows it, else the nearest
  one it knows;
- Qwen3: HY-MT's English sentence as the user turn (a directory's `instruction` may change it), thinking off;
- a Gemma 3 chat model whose template has no TranslateGemma table: that instruction as the user turn.

Stop tokens are every eos id of the generation config (HY-MT: `<｜hy_place▁holder▁no▁2｜>`; Qwen3: `<|im_end|>`,
`<|endoftext|>`; Gemma: `<eos>`, `<end_of_turn>`). The vendors' generation configs sample (do_sample with
temperature, top-k, top-p): onnxmt's default is deterministic, greedy or beam, so those are set aside at export
and kept in the manifest's languages section as `vendor_sampling`; the repetition penalty (HY-MT's 1.05) stays, and
applies over the prompt too, as transformers applies it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..tokenization import JsonTokenizer
from ..tokenization.chat import CHAT_TEMPLATE_FILE, ChatTemplate
from .base import PARAGRAPH, Architecture, read_json, register

# The sampling knobs a vendor's generation config sets, ignored by transformers when do_sample is off.
SAMPLING_FIELDS = ("do_sample", "temperature", "top_k", "top_p", "min_p", "typical_p")

# HY-MT's 33 languages and 5 dialects (HY-MT README), code -> (English name, Chinese name).
HY_MT_LANGUAGES = {
    "zh": ("Chinese", "中文"), "en": ("English", "英语"), "fr": ("French", "法语"),
    "pt": ("Portuguese", "葡萄牙语"), "es": ("Spanish", "西班牙语"), "ja": ("Japanese", "日语"),
    "tr": ("Turkish", "土耳其语"), "ru": ("Russian", "俄语"), "ar": ("Arabic", "阿拉伯语"),
    "ko": ("Korean", "韩语"), "th": ("Thai", "泰语"), "it": ("Italian", "意大利语"),
    "de": ("German", "德语"), "vi": ("Vietnamese", "越南语"), "ms": ("Malay", "马来语"),
    "id": ("Indonesian", "印尼语"), "tl": ("Filipino", "菲律宾语"), "hi": ("Hindi", "印地语"),
    "zh-Hant": ("Traditional Chinese", "繁体中文"), "pl": ("Polish", "波兰语"), "cs": ("Czech", "捷克语"),
    "nl": ("Dutch", "荷兰语"), "km": ("Khmer", "高棉语"), "my": ("Burmese", "缅甸语"),
    "fa": ("Persian", "波斯语"), "gu": ("Gujarati", "古吉拉特语"), "ur": ("Urdu", "乌尔都语"),
    "te": ("Telugu", "泰卢固语"), "mr": ("Marathi", "马拉地语"), "he": ("Hebrew", "希伯来语"),
    "bn": ("Bengali", "孟加拉语"), "ta": ("Tamil", "泰米尔语"), "uk": ("Ukrainian", "乌克兰语"),
    "bo": ("Tibetan", "藏语"), "kk": ("Kazakh", "哈萨克语"), "mn": ("Mongolian", "蒙古语"),
    "ug": ("Uyghur", "维吾尔语"), "yue": ("Cantonese", "粤语"),
}  # fmt: skip
HY_MT_ZH = "将以下文本翻译为{target}，注意只需要输出翻译后的结果，不要额外解释：\n\n{text}"
HY_MT_EN = "Translate the following segment into {target}, without additional explanation.\n\n{text}"
# The model card's terminology and context templates (Chinese only, Chinese language names); a glossary's pairs one
# a line. The card's context block shows an empty line after the text, which may be the block's own: not written.
HY_MT_TERMS = (
    "参考下面的翻译：\n{terms}\n\n将以下文本翻译为{target}，注意只需要输出翻译后的结果，不要额外解释：\n{text}"
)
HY_MT_TERM = "{source} 翻译成 {target}"
HY_MT_CONTEXT = "{context}\n参考上面的信息，把下面的文本翻译成{target}，注意不需要翻译上文，也不要额外解释：\n{text}"
CHINESE = ("zh", "zh-Hant")
# Each family's request, as `onnxmt inspect` states it.
PROMPT_RULES = {
    "hy_mt": f"user turn {HY_MT_ZH!r} with the Chinese target name when the source or the target is zh/zh-Hant, "
    f"else {HY_MT_EN!r} with the English name; no system message; generation prompt on",
    "translategemma": "one structured user item {type: text, source_lang_code, target_lang_code, text}, the codes "
    "as given when the template's table knows them, else the nearest it knows; generation prompt on",
    "qwen3": "the directory's instruction (default: HY-MT's English sentence) as the user turn; thinking off "
    "(enable_thinking=False); generation prompt on",
    "instruction": "the directory's instruction (default: HY-MT's English sentence) as the user turn; generation "
    "prompt on (a Gemma 3 chat model without TranslateGemma's language table)",
}
# TranslateGemma's template holds its language table as `{%- set languages = {...} -%}`.
_GEMMA_TABLE = re.compile(r"\{%-?\s*set\s+languages\s*=.*?-?%\}", re.S)


class DecoderOnly(Architecture):
    """What the three families share: sizes from the (text) config, the tokenizer.json and chat template, stop
    tokens from the generation config, deterministic generation defaults."""

    kind = "decoder_only"
    # Trained and prompted on documents (HY-MT's context prompt, TranslateGemma's 2K-token context): a paragraph
    # is translated whole, its sentences seeing each other, rather than cut into sentences.
    text_unit = PARAGRAPH
    prompt = ""  # the family's request format: hy_mt, translategemma, qwen3
    tokenizer_kind = "chat"
    tokenizer_files: tuple[str, ...] = ("tokenizer.json", "tokenizer_config.json")
    optional_tokenizer_files = (CHAT_TEMPLATE_FILE, "special_tokens_map.json")
    build_hooks = "onnxmt.export.decoder_only"

    def facts(self, config: dict[str, Any]) -> dict[str, Any]:
        text = config.get("text_config") or config
        heads = text["num_attention_heads"]
        return {
            "d_model": text["hidden_size"],
            "encoder_layers": 0,
            "num_layers": text["num_hidden_layers"],
            "num_heads": heads,
            "num_kv_heads": text.get("num_key_value_heads") or heads,
            "head_dim": text.get("head_dim") or text["hidden_size"] // heads,
            "vocab_size": text["vocab_size"],
            "max_positions": text["max_position_embeddings"],
        }

    def tokens(self, source: Path, config: dict[str, Any], generation_config: dict[str, Any]) -> dict[str, Any]:
        text = config.get("text_config") or {}

        def pick(key: str) -> Any:
            for where in (generation_config, config, text):
                if where.get(key) is not None:
                    return where[key]
            return None

        eos = pick("eos_token_id")
        eos_ids = eos if isinstance(eos, list) else [eos]
        # No decoder start: the prompt is the start. The field holds the BOS the template writes (or eos).
        bos = pick("bos_token_id")
        return {
            "decoder_start": bos if bos is not None else eos_ids[0],
            "eos": eos_ids[0],
            "eos_ids": eos_ids,
            "pad": pick("pad_token_id"),
            "unk": None,
        }

    def deterministic(self, generation_config: dict[str, Any]) -> dict[str, Any]:
        """The generation config without its sampling knobs (module docstring)."""
        return {k: v for k, v in generation_config.items() if k not in SAMPLING_FIELDS}

    def generation(self, generation_config: dict[str, Any], config: dict[str, Any]) -> dict[str, Any]:
        from ..manifest import generation_defaults

        # config.json's max_position_embeddings is not a generation length: only the generation config's counts.
        return generation_defaults(self.deterministic(generation_config), {})

    def load_tokenizer(self, directory: Path) -> JsonTokenizer:
        return JsonTokenizer.from_dir(directory)

    def languages(self, source: Path, default_target: str | None) -> dict[str, Any]:
        sampling = {k: v for k, v in read_json(source / "generation_config.json").items() if k in SAMPLING_FIELDS}
        section = {
            "scheme": "chat_template",
            "prompt": self.prompt,
            "source": None,
            "target": None,
            "target_tokens": {},
            "default_target": default_target,
            "vendor_sampling": sampling,
        }
        return {**section, **self.language_table(source)}

    def language_table(self, source: Path) -> dict[str, Any]:
        raise NotImplementedError


def _english_names() -> dict[str, str]:
    return {code: en for code, (en, _) in HY_MT_LANGUAGES.items()}


@register("hunyuan_v1_dense")
class HyMt(DecoderOnly):
    name = "hunyuan_v1_dense"
    prompt = "hy_mt"

    def language_table(self, source: Path) -> dict[str, Any]:
        return {
            "names": _english_names(),
            "names_zh": {code: zh for code, (_, zh) in HY_MT_LANGUAGES.items()},
        }


@register("qwen3")
class Qwen3(DecoderOnly):
    name = "qwen3"
    prompt = "qwen3"

    def language_table(self, source: Path) -> dict[str, Any]:
        return {"names": _english_names(), "instruction": HY_MT_EN}


@register("gemma3", variants=())
class TranslateGemma(DecoderOnly):
    name = "gemma3"
    prompt = "translategemma"

    def language_table(self, source: Path) -> dict[str, Any]:
        """The template's own table, evaluated by jinja2 (a jinja literal need not be JSON)."""
        import json

        from ..tokenization.chat import compile_template

        match = _GEMMA_TABLE.search(ChatTemplate.from_dir(source).source)
        if match is None:  # a Gemma 3 chat model, not TranslateGemma: the plain instruction as the user turn
            return {"prompt": "instruction", "names": _english_names(), "instruction": HY_MT_EN}
        return {"names": json.loads(compile_template(match.group(0) + "{{ languages | tojson }}").render())}


@register("gemma3_text")
class Gemma3Text(TranslateGemma):
    name = "gemma3_text"


def prompt_messages(
    languages: dict[str, Any],
    text: str,
    source: str | None,
    target: str,
    *,
    glossary: Sequence[tuple[str, str]] = (),
    context: str | None = None,
) -> tuple[list[Any], dict[str, Any]]:
    """The chat messages and template variables of a translation request, by the family's rule (module docstring);
    HY-MT's terminology prompt for the pairs of a `glossary` of (source term, target term) whose source term is in
    the text (none: the plain prompt), its context prompt for a `context`. ValueError naming the valid codes for a
    language the family's table does not have."""
    names: dict[str, str] = languages.get("names", {})
    family = languages.get("prompt")
    check_request(family, glossary, context)
    glossary = terms_in(glossary, text)
    if family == "translategemma":
        if source is None:
            raise ValueError(f"TranslateGemma needs a source language; valid: {', '.join(sorted(names))}")
        src, tgt = nearest_code(source, names), nearest_code(target, names)
        item = {"type": "text", "source_lang_code": src, "target_lang_code": tgt, "text": text}
        return [{"role": "user", "content": [item]}], {}
    if target not in names:
        raise ValueError(f"target language {target!r} is not supported; valid: {', '.join(sorted(names))}")
    if family == "hy_mt":
        zh = languages["names_zh"][target]
        if glossary:
            terms = "\n".join(HY_MT_TERM.format(source=s, target=t) for s, t in glossary)
            return [{"role": "user", "content": HY_MT_TERMS.format(terms=terms, target=zh, text=text)}], {}
        if context is not None:
            return [{"role": "user", "content": HY_MT_CONTEXT.format(context=context, target=zh, text=text)}], {}
        if source in CHINESE or target in CHINESE:
            user = HY_MT_ZH.format(target=zh, text=text)
        else:
            user = HY_MT_EN.format(target=names[target], text=text)
        return [{"role": "user", "content": user}], {}
    if family in ("qwen3", "instruction"):
        user = str(languages.get("instruction", HY_MT_EN)).format(target=names[target], text=text)
        return [{"role": "user", "content": user}], {"enable_thinking": False} if family == "qwen3" else {}
    raise ValueError(f"unknown prompt family {family!r}; valid: {', '.join(PROMPT_RULES)}")


def check_request(family: str | None, glossary: Sequence[tuple[str, str]], context: str | None) -> None:
    """ValueError unless the family has a prompt for the glossary or context given (HY-MT's model card has one
    for each, not for both at once)."""
    if not glossary and context is None:
        return
    if family != "hy_mt":
        what = "a glossary" if glossary else "a context"
        raise ValueError(
            f"{what} goes into HY-MT's terminology or context prompt (its model card's templates); this model's "
            f"prompt ({family or 'not a chat template'}) has no such template"
        )
    if glossary and context is not None:
        raise ValueError("HY-MT's model card has a terminology prompt and a context prompt, not both at once")


def terms_in(glossary: Sequence[tuple[str, str]], text: str) -> tuple[tuple[str, str], ...]:
    """The pairs of `glossary` whose source term occurs in `text`, ignoring case: a text's prompt carries only
    the terms it needs, so a long glossary costs nothing where it does not apply."""
    folded = text.casefold()
    return tuple((s, t) for s, t in glossary if s.casefold() in folded)


def glossary_pairs(glossary: Any) -> tuple[tuple[str, str], ...]:
    """A glossary as (source term, target term) pairs: from pairs (a list of [source, target]) or a mapping
    {source: target}. ValueError for anything else, or a term that is empty or holds a line break (the
    terminology prompt has one pair a line)."""
    if not glossary:
        return ()
    if isinstance(glossary, Mapping):
        pairs = list(glossary.items())
    elif isinstance(glossary, (str, bytes)) or not isinstance(glossary, Sequence):
        raise ValueError("a glossary is a list of [source term, target term] pairs or a {source: target} mapping")
    else:
        pairs = list(glossary)
    out = []
    for i, pair in enumerate(pairs):
        if isinstance(pair, (str, bytes)) or not isinstance(pair, Sequence) or len(pair) != 2:
            raise ValueError(f"glossary entry {i + 1} is not a [source term, target term] pair")
        for term in pair:
            if not isinstance(term, str) or not term.strip():
                raise ValueError(f"glossary entry {i + 1}: each term must be a non-empty string")
            if "\n" in term or "\r" in term:
                raise ValueError(f"glossary entry {i + 1}: a term must be one line")
        out.append((pair[0].strip(), pair[1].strip()))
    return tuple(out)


def nearest_code(code: str, names: dict[str, str]) -> str:
    """`code` if the table knows it, else the nearest it knows: the same language with a region or script
    (`pt` -> `pt-BR`), or the bare language (`de-AT` -> `de`); ValueError naming the valid codes."""
    code = code.replace("_", "-")
    if code in names:
        return code
    base = code.split("-")[0]
    if base in names:
        return base
    for known in sorted(names):
        if known.split("-")[0] == base:
            return known
    raise ValueError(f"language {code!r} is not supported; valid: {', '.join(sorted(names))}")


def render_prompt(
    template: ChatTemplate, languages: dict[str, Any], text: str, source: str | None, target: str, **request: Any
) -> str:
    """The prompt text a translation request becomes: the family's messages (`request`: prompt_messages' glossary,
    context) through the model's template."""
    messages, variables = prompt_messages(languages, text, source, target, **request)
    return template.render(messages, add_generation_prompt=True, **variables)
