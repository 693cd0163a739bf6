"""Random mBART-50 models with the metadata of the real facebook/mbart-large-50-many-to-many-mmt, built offline.

The metadata is the real checkpoint's: config.json with only the sizes changed (its generation keys, its
`tokenizer_class` MBart50Tokenizer), generation_config.json (beams 5, max 200, early stopping, forced eos 2),
tokenizer_config.json and special_tokens_map.json as the hub has them, and a `sentencepiece.bpe.model` as the only
tokenizer file (no tokenizer.json, as in the hub's snapshots). The tokenizer is transformers' own `MBart50Tokenizer`
reading that model: fairseq's ids (`<s> <pad> </s> <unk>`, the pieces, the 52 language codes, `<mask>` last), so
the embedding has the sentencepiece model's size plus 54 rows, as the real one (250,000 + 54 = 250,054).

`MBart50Spec(vocab_size=...)` pads the sentencepiece model with pieces no text produces, so that a benchmark model
has the real vocabulary's size (`MBART_LARGE_50`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from .fairseq import EOS, TRANSFORMER_LARGE, FairseqSpec

# facebook/mbart-large-50-many-to-many-mmt (hub), sizes aside: the config keys MBartConfig does not write itself.
MBART_50_CONFIG_EXTRAS: dict[str, Any] = {
    "add_bias_logits": False,
    "add_final_layer_norm": True,
    "early_stopping": True,
    "forced_eos_token_id": 2,
    "max_length": 200,
    "normalize_before": True,
    "normalize_embedding": True,
    "num_beams": 5,
    "output_past": True,
    "static_position_embeddings": False,
    "tokenizer_class": "MBart50Tokenizer",
}
MBART_50_GENERATION_CONFIG = {
    "bos_token_id": 0,
    "decoder_start_token_id": 2,
    "early_stopping": True,
    "eos_token_id": 2,
    "forced_eos_token_id": 2,
    "max_length": 200,
    "num_beams": 5,
    "pad_token_id": 1,
}
# The hub's tokenizer_config.json and special_tokens_map.json, byte for byte (the paths are the uploader's).
MBART_50_TOKENIZER_CONFIG = (
    '{"src_lang": null, "tgt_lang": null, "eos_token": "</s>", "unk_token": "<unk>", "sep_token": "</s>", '
    '"cls_token": "<s>", "pad_token": "<pad>", "mask_token": {"content": "<mask>", "single_word": false, '
    '"lstrip": true, "rstrip": false, "normalized": true, "__type": "AddedToken"}, "bos_token": "<s>", '
    '"tokenizer_file": null, "language_codes": "ML50", "special_tokens_map_file": '
    '"/home/suraj/projects/mbart-50/mbart-50/special_tokens_map.json", "name_or_path": '
    '"/home/suraj/projects/mbart-50/hf_models/mbart-50-large-many-to-many/"}'
)
_ML50 = (
    "ar_AR cs_CZ de_DE en_XX es_XX et_EE fi_FI fr_XX gu_IN hi_IN it_IT ja_XX kk_KZ ko_KR lt_LT lv_LV my_MM ne_NP "
    "nl_XX ro_RO ru_RU si_LK tr_TR vi_VN zh_CN af_ZA az_AZ bn_IN fa_IR he_IL hr_HR id_ID ka_GE km_KH mk_MK ml_IN "
    "mn_MN mr_IN pl_PL ps_AF pt_XX sv_SE sw_KE ta_IN te_IN th_TH tl_XX uk_UA ur_PK xh_ZA gl_ES sl_SI"
).split()
MBART_50_SPECIAL_TOKENS_MAP = (
    '{"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "sep_token": "</s>", "pad_token": "<pad>", '
    '"cls_token": "<s>", "mask_token": "<mask>", "additional_special_tokens": ['
    + ", ".join(f'"{code}"' for code in _ML50)
    + "]}"
)


@dataclass(frozen=True, kw_only=True)
class MBart50Spec(FairseqSpec):
    """A random mBART-50 many-to-many model with facebook/mbart-large-50-many-to-many-mmt's metadata; the defaults
    are tiny, for tests."""

    config_extras: ClassVar[dict[str, Any]] = MBART_50_CONFIG_EXTRAS

    def write_tokenizer_files(self, out: Path, spm_model: bytes) -> int:
        """sentencepiece.bpe.model and the hub's configs; the size of the tokenizer transformers makes of them."""
        from transformers import MBart50Tokenizer

        (out / "sentencepiece.bpe.model").write_bytes(spm_model)
        (out / "tokenizer_config.json").write_text(MBART_50_TOKENIZER_CONFIG, encoding="utf-8")
        (out / "special_tokens_map.json").write_text(MBART_50_SPECIAL_TOKENS_MAP, encoding="utf-8")
        return len(MBart50Tokenizer.from_pretrained(str(out)))

    def model(self, vocab_size: int) -> Any:
        from transformers import MBartConfig, MBartForConditionalGeneration

        config = MBartConfig(**self.fairseq_arguments(vocab_size), forced_eos_token_id=EOS)
        return MBartForConditionalGeneration(config)

    def raise_eos(self, model: Any) -> None:
        model.final_logits_bias[0, EOS] += self.eos_bias

    def generation_config(self, vocab_size: int) -> dict[str, Any]:
        return MBART_50_GENERATION_CONFIG


# facebook/mbart-large-50-many-to-many-mmt's architecture (611M): the benchmark's model (random weights).
MBART_LARGE_50 = MBart50Spec(**TRANSFORMER_LARGE, vocab_size=250054)
