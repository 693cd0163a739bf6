"""Random M2M100 and NLLB-200 models with their real tokenizers, built offline.

The metadata is the real checkpoints' (facebook/m2m100_418M, facebook/nllb-200-distilled-600M): config.json and
generation_config.json with only the sizes changed, tokenizer_config.json and special_tokens_map.json as the hub
has them (the 100 `__xx__` codes of M2M100, NLLB's 202 FLORES-200 codes). The tokenizers are transformers' own:
`M2M100Tokenizer` reads the `vocab.json` + `sentencepiece.bpe.model` written here (a BPE model trained on the
generated corpus, ids laid out like fairseq's dictionary: `<s> <pad> </s> <unk>`, then the pieces), and NLLB's
`tokenizer.json` is what `NllbTokenizer` writes after converting that sentencepiece model, laid out as the hub's:
the pieces, the 202 language codes, `<mask>` last, and two embedding rows past the tokenizer (config vocab_size
256,206 against 256,204 tokens in the real model).

`NllbSpec(vocab_size=...)` pads the sentencepiece model with pieces no text produces, so a benchmark model has the
real vocabulary's size and id layout (`NLLB_200_DISTILLED_600M`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, ClassVar

from .builder import spm_pieces, write_json
from .fairseq import EOS, TRANSFORMER_LARGE, FairseqSpec

# facebook/m2m100_418M (hub), sizes aside. Its config.json keeps generation keys (early_stopping, num_beams,
# max_length) from older transformers, as the hub file does.
M2M100_418M_CONFIG_EXTRAS = {"early_stopping": True, "num_beams": 5, "max_length": 200}
M2M100_418M_GENERATION_CONFIG = {
    "bos_token_id": 0,
    "decoder_start_token_id": 2,
    "early_stopping": True,
    "eos_token_id": 2,
    "max_length": 200,
    "num_beams": 5,
    "pad_token_id": 1,
}
M2M100_418M_TOKENIZER_CONFIG: dict[str, Any] = {
    "src_lang": None,
    "tgt_lang": None,
    "bos_token": "<s>",
    "eos_token": "</s>",
    "sep_token": "</s>",
    "unk_token": "<unk>",
    "pad_token": "<pad>",
    "language_codes": "m2m100",
    "sp_model_kwargs": {},
    "num_madeup_words": 8,
    "tokenizer_class": "M2M100Tokenizer",
    "model_max_length": 1024,
}
# facebook/nllb-200-distilled-600M (hub), sizes aside.
NLLB_CONFIG_EXTRAS = {"max_length": 200, "tokenizer_class": "NllbTokenizer"}
NLLB_GENERATION_CONFIG = {
    "bos_token_id": 0,
    "decoder_start_token_id": 2,
    "eos_token_id": 2,
    "max_length": 200,
    "pad_token_id": 1,
}
_MASK = {"content": "<mask>", "lstrip": True, "normalized": True, "rstrip": False, "single_word": False}
NLLB_TOKENIZER_CONFIG: dict[str, Any] = {
    "bos_token": "<s>",
    "cls_token": "<s>",
    "eos_token": "</s>",
    "mask_token": {"__type": "AddedToken", **_MASK},
    "model_max_length": 1024,
    "pad_token": "<pad>",
    "sep_token": "</s>",
    "sp_model_kwargs": {},
    "src_lang": None,
    "tgt_lang": None,
    "tokenizer_class": "NllbTokenizer",
    "unk_token": "<unk>",
}
_SPECIAL = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>", "sep_token": "</s>"}
# Embedding rows the real NLLB-200 checkpoints have past their tokenizer's 256,204 tokens.
NLLB_UNUSED_ROWS = 2


@dataclass(frozen=True, kw_only=True)
class M2M100Spec(FairseqSpec):
    """A random M2M100 model with facebook/m2m100_418M's metadata; the defaults are tiny, for tests."""

    spm_type: ClassVar[str] = "bpe"
    config_extras: ClassVar[dict[str, Any]] = M2M100_418M_CONFIG_EXTRAS

    def write_tokenizer_files(self, out: Path, spm_model: bytes) -> int:
        """vocab.json, sentencepiece.bpe.model and the configs of M2M100; returns the model's vocab size."""
        from transformers.models.m2m_100.tokenization_m2m_100 import FAIRSEQ_LANGUAGE_CODES

        (out / "sentencepiece.bpe.model").write_bytes(spm_model)
        vocab = {"<s>": 0, "<pad>": 1, "</s>": EOS, "<unk>": 3}
        for piece in spm_pieces(spm_model):
            vocab.setdefault(piece, len(vocab))
        write_json(out / "vocab.json", vocab)
        codes = FAIRSEQ_LANGUAGE_CODES["m2m100"]
        write_json(out / "tokenizer_config.json", M2M100_418M_TOKENIZER_CONFIG)
        special = {**_SPECIAL, "additional_special_tokens": [f"__{c}__" for c in codes]}
        write_json(out / "special_tokens_map.json", special)
        # The embedding covers the vocab, the language tokens and the 8 "madeup words" fairseq pads with.
        return len(vocab) + len(codes) + 8

    def model(self, vocab_size: int) -> Any:
        from transformers import M2M100Config, M2M100ForConditionalGeneration

        return M2M100ForConditionalGeneration(M2M100Config(**self.fairseq_arguments(vocab_size)))

    def raise_eos(self, model: Any) -> None:
        # No final_logits_bias in M2M100: the eos logit is raised through the final layer norm's bias instead,
        # along the (tied) eos embedding: eos gains exactly eos_bias, other tokens a random fraction of it.
        eos = model.model.shared.weight[EOS]
        model.model.decoder.layer_norm.bias += self.eos_bias * eos / eos.dot(eos)

    def generation_config(self, vocab_size: int) -> dict[str, Any]:
        return M2M100_418M_GENERATION_CONFIG


@dataclass(frozen=True, kw_only=True)
class NllbSpec(M2M100Spec):
    """A random NLLB-200 model (an M2M100 with NLLB's tokenizer.json and metadata); the defaults are tiny."""

    legacy_behaviour: bool = False  # the source language token after the eos
    config_extras: ClassVar[dict[str, Any]] = NLLB_CONFIG_EXTRAS

    def write_tokenizer_files(self, out: Path, spm_model: bytes) -> int:
        return _nllb_tokenizer(out, spm_model, self.legacy_behaviour) + NLLB_UNUSED_ROWS

    def generation_config(self, vocab_size: int) -> dict[str, Any]:
        return NLLB_GENERATION_CONFIG


# facebook/nllb-200-distilled-600M's architecture: the benchmark's model (random weights).
NLLB_200_DISTILLED_600M = NllbSpec(**TRANSFORMER_LARGE, vocab_size=256206)
# facebook/nllb-200-1.3B's (and nllb-200-distilled-1.3B's) architecture: twice the layers, twice the FFN; 5.5 GB in
# fp32, so its graphs pass protobuf's 2 GB before their weights move to weights.bin.
NLLB_200_1_3B = replace(NLLB_200_DISTILLED_600M, encoder_layers=24, decoder_layers=24, ffn_dim=8192)
# facebook/nllb-200-3.3B's: 1.3B's layers at d_model 2048; 13.2 GB in fp32.
NLLB_200_3_3B = replace(NLLB_200_1_3B, d_model=2048)


def _nllb_tokenizer(out: Path, spm_model: bytes, legacy_behaviour: bool) -> int:
    """tokenizer.json (NllbTokenizer's conversion of the sentencepiece model) and the configs of NLLB-200; returns
    the tokenizer's size. The language codes follow the pieces and `<mask>` comes last, as on the hub."""
    import tempfile

    from transformers import NllbTokenizer
    from transformers.models.nllb.tokenization_nllb import FAIRSEQ_LANGUAGE_CODES
    from transformers.tokenization_python import AddedToken

    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "sentencepiece.bpe.model").write_bytes(spm_model)
        config = {k: v for k, v in NLLB_TOKENIZER_CONFIG.items() if k != "mask_token"}
        write_json(Path(tmp) / "tokenizer_config.json", config)
        # Given at construction, <mask> would take the first id after the pieces; added afterwards, it is last.
        tokenizer = NllbTokenizer.from_pretrained(
            tmp, extra_special_tokens=list(FAIRSEQ_LANGUAGE_CODES), mask_token=None
        )
        mask = {k: bool(v) for k, v in _MASK.items() if k != "content"}
        tokenizer.add_special_tokens({"mask_token": AddedToken(str(_MASK["content"]), special=True, **mask)})
        tokenizer.save_pretrained(tmp)
        (out / "tokenizer.json").write_bytes((Path(tmp) / "tokenizer.json").read_bytes())
    (out / "sentencepiece.bpe.model").write_bytes(spm_model)
    config = {**NLLB_TOKENIZER_CONFIG, **({"legacy_behaviour": True} if legacy_behaviour else {})}
    write_json(out / "tokenizer_config.json", config)
    special = {**_SPECIAL, "cls_token": "<s>", "mask_token": _MASK}
    write_json(out / "special_tokens_map.json", {**special, "additional_special_tokens": list(FAIRSEQ_LANGUAGE_CODES)})
    return len(tokenizer)
