"""mBART-50 (`model_type` mbart; facebook/mbart-large-50-many-to-many-mmt, -one-to-many-mmt, -many-to-one-mmt).

The model (export/mbart.py): pre-layer-norm as M2M100, with a final layer norm on both stacks, and a LayerNorm
after the embeddings (`layernorm_embedding`); learned positions offset by 2 (counted from the cache length, not
pad-aware); embeddings scaled by sqrt(d_model) inside the embedding module; the LM head tied to the shared
embedding, plus `final_logits_bias`; decoder start `</s>` (2).

Languages (`language_tokens` scheme): the source is `[src_lang] X </s>`, the target language the first generated
token, forced (`forced_bos_token_id`, set by the caller). Codes are fairseq's ML50 list (`en_XX`, `zh_CN`), tokens
of their own name; clients may send ISO/BCP-47 codes (`zh`, `zh-Hans`), resolved by onnxmt.languages.

The tokenizer: the official repositories ship `sentencepiece.bpe.model` and no `tokenizer.json`; transformers 5's
`MBart50Tokenizer` converts it into a `tokenizers` Unigram model with fairseq's ids (`<s> <pad> </s> <unk>`, the
pieces from the model's fourth on, the 52 codes, `<mask>` last). The export writes that conversion as the
directory's `tokenizer.json` (a build hook: transformers converts, onnxmt does not re-derive the ids), and the run
side reads it with the `tokenizers` library, as for NLLB.
"""

from __future__ import annotations

from pathlib import Path

from ..tokenization import JsonTokenizer
from .base import Architecture, read_json, register
from .m2m100 import M2M100

# transformers' tokenization_mbart50.FAIRSEQ_LANGUAGE_CODES (the tokenizer config's `language_codes: ML50`), in
# order: their ids follow the sentencepiece pieces (tests/architectures/test_registry.py compares the two lists).
ML50_CODES = (
    "ar_AR cs_CZ de_DE en_XX es_XX et_EE fi_FI fr_XX gu_IN hi_IN it_IT ja_XX kk_KZ ko_KR lt_LT lv_LV my_MM ne_NP "
    "nl_XX ro_RO ru_RU si_LK tr_TR vi_VN zh_CN af_ZA az_AZ bn_IN fa_IR he_IL hr_HR id_ID ka_GE km_KH mk_MK ml_IN "
    "mn_MN mr_IN pl_PL ps_AF pt_XX sv_SE sw_KE ta_IN te_IN th_TH tl_XX uk_UA ur_PK xh_ZA gl_ES sl_SI"
).split()
# The source files the export converts, either of which transformers reads (tokenizer.json first).
SOURCE_TOKENIZER_FILES = ("tokenizer.json", "sentencepiece.bpe.model")
_TOKENIZER_CLASSES = ("MBart50Tokenizer", "MBart50TokenizerFast")


@register("mbart")
class MBart50(M2M100):
    """M2M100's language scheme and BART-style sizes, with its own tokenizer, codes and export hooks."""

    name = "mbart"
    tokenizer_kind = "tokenizers"
    tokenizer_files = ("tokenizer_config.json",)
    optional_tokenizer_files = ("special_tokens_map.json",)
    build_hooks = "onnxmt.export.mbart"

    def for_source(self, source: Path) -> Architecture:
        """mBART-50 only: its config names MBart50Tokenizer, or its tokenizer config the ML50 codes. mBART-cc25 and
        its fine-tunes (MBartTokenizer) write the language code after the text, with other codes."""
        named = read_json(source / "config.json").get("tokenizer_class")
        tokenizer_config = read_json(source / "tokenizer_config.json")
        named = named or tokenizer_config.get("tokenizer_class")
        if named not in _TOKENIZER_CLASSES and tokenizer_config.get("language_codes") != "ML50":
            raise ValueError(
                f"{source}: only mBART-50 models are supported (tokenizer class MBart50Tokenizer), not {named}"
            )
        if not any((source / name).is_file() for name in SOURCE_TOKENIZER_FILES):
            needs = " or ".join(SOURCE_TOKENIZER_FILES)
            raise ValueError(f"{source}: no tokenizer; an mBART-50 model directory needs {needs}")
        return self

    def unk_id(self, source: Path) -> int | None:
        return 3  # fairseq's dictionary: <s> <pad> </s> <unk>

    def load_tokenizer(self, directory: Path) -> JsonTokenizer:
        return JsonTokenizer.from_dir(directory)

    def write_tokenizer(self, source: Path, staging: Path) -> list[str]:
        return list(self._hooks().write_tokenizer(source, staging))

    def language_tokens(self, source: Path) -> dict[str, str]:
        return {code: code for code in ML50_CODES}

    def default_source(self) -> str:
        return "en_XX"  # MBart50Tokenizer's when src_lang is not set
