"""Randomly initialised M2M100 and NLLB-200 models with their real tokenizers, built offline.

The metadata is the real checkpoints' (facebook/m2m100_418M, facebook/nllb-200-distilled-600M): config.json and
generation_config.json with only the sizes changed, tokenizer_config.json and special_tokens_map.json as the hub
has them (the 100 `__xx__` codes of M2M100, NLLB's 202 FLORES-200 codes). The tokenizers are transformers' own:
`M2M100Tokenizer` reads the `vocab.json` + `sentencepiece.bpe.model` written here (a BPE model trained on the
generated corpus, ids laid out like fairseq's dictionary: `<s> <pad> </s> <unk>`, then the pieces), and NLLB's
`tokenizer.json` is what `NllbTokenizer` writes after converting that sentencepiece model.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .random_model import generate_corpus, train_spm

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


@dataclass(frozen=True)
class RandomM2M100Spec:
    """A random M2M100 (`nllb=False`) or NLLB-200 (`nllb=True`) model; the defaults are tiny, for tests."""

    nllb: bool = False
    d_model: int = 32
    encoder_layers: int = 2
    decoder_layers: int = 2
    attention_heads: int = 4
    ffn_dim: int = 64
    max_position_embeddings: int = 64
    pieces: int = 400
    init_std: float = 0.2
    eos_bias: float = 0.0  # added to the eos logit (through the final layer norm's bias), so outputs can end early
    legacy_behaviour: bool = False  # NLLB only: the source language token after the eos
    seed: int = 0


def _write_json(path: Path, data: Any) -> None:
    path.write_text(json.dumps(data, ensure_ascii=False, indent=1), encoding="utf-8")


def _m2m100_tokenizer(out: Path, spm_model: bytes) -> int:
    """vocab.json, sentencepiece.bpe.model and the configs of M2M100; returns the model's vocab size."""
    import sentencepiece as spm
    from transformers.models.m2m_100.tokenization_m2m_100 import FAIRSEQ_LANGUAGE_CODES

    (out / "sentencepiece.bpe.model").write_bytes(spm_model)
    sp = spm.SentencePieceProcessor(model_proto=spm_model)
    vocab = {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3}
    for i in range(sp.get_piece_size()):
        if not (sp.is_control(i) or sp.is_unknown(i)):
            vocab.setdefault(sp.id_to_piece(i), len(vocab))
    _write_json(out / "vocab.json", vocab)
    codes = FAIRSEQ_LANGUAGE_CODES["m2m100"]
    _write_json(out / "tokenizer_config.json", M2M100_418M_TOKENIZER_CONFIG)
    _write_json(out / "special_tokens_map.json", {**_SPECIAL, "additional_special_tokens": [f"__{c}__" for c in codes]})
    # The embedding covers the vocab, the language tokens and the 8 "madeup words" fairseq pads with.
    return len(vocab) + len(codes) + 8


def _nllb_tokenizer(out: Path, spm_model: bytes, legacy_behaviour: bool) -> int:
    """tokenizer.json (NllbTokenizer's conversion of the sentencepiece model) and the configs of NLLB-200."""
    import tempfile

    from transformers import NllbTokenizer
    from transformers.models.nllb.tokenization_nllb import FAIRSEQ_LANGUAGE_CODES

    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "sentencepiece.bpe.model").write_bytes(spm_model)
        _write_json(Path(tmp) / "tokenizer_config.json", NLLB_TOKENIZER_CONFIG)
        tokenizer = NllbTokenizer.from_pretrained(tmp, extra_special_tokens=list(FAIRSEQ_LANGUAGE_CODES))
        tokenizer.save_pretrained(tmp)
        (out / "tokenizer.json").write_bytes((Path(tmp) / "tokenizer.json").read_bytes())
    (out / "sentencepiece.bpe.model").write_bytes(spm_model)
    config = {**NLLB_TOKENIZER_CONFIG, **({"legacy_behaviour": True} if legacy_behaviour else {})}
    _write_json(out / "tokenizer_config.json", config)
    special = {**_SPECIAL, "cls_token": "<s>", "mask_token": _MASK}
    _write_json(out / "special_tokens_map.json", {**special, "additional_special_tokens": list(FAIRSEQ_LANGUAGE_CODES)})
    return len(tokenizer)


def build_random_m2m100(output_dir: str | Path, spec: RandomM2M100Spec = RandomM2M100Spec()) -> Path:
    """Write a random M2M100 or NLLB-200 model directory and return its path."""
    import torch
    from transformers import GenerationConfig, M2M100Config, M2M100ForConditionalGeneration

    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    english, chinese = generate_corpus(spec.seed)
    spm_model = train_spm(english + chinese, spec.pieces, model_type="bpe")
    if spec.nllb:
        vocab_size = _nllb_tokenizer(out, spm_model, spec.legacy_behaviour)
    else:
        vocab_size = _m2m100_tokenizer(out, spm_model)
    config = M2M100Config(
        vocab_size=vocab_size,
        d_model=spec.d_model,
        encoder_layers=spec.encoder_layers,
        decoder_layers=spec.decoder_layers,
        encoder_attention_heads=spec.attention_heads,
        decoder_attention_heads=spec.attention_heads,
        encoder_ffn_dim=spec.ffn_dim,
        decoder_ffn_dim=spec.ffn_dim,
        max_position_embeddings=spec.max_position_embeddings,
        activation_function="relu",
        scale_embedding=True,
        pad_token_id=1,
        bos_token_id=0,
        eos_token_id=2,
        decoder_start_token_id=2,
        init_std=spec.init_std,
        dropout=0.0,
        attention_dropout=0.0,
        activation_dropout=0.0,
        encoder_layerdrop=0.0,
        decoder_layerdrop=0.0,
    )
    torch.manual_seed(spec.seed)
    model = M2M100ForConditionalGeneration(config).eval()
    with torch.no_grad():
        # No final_logits_bias in M2M100: the eos logit is raised through the final layer norm's bias instead,
        # along the (tied) eos embedding: eos gains exactly eos_bias, other tokens a random fraction of it.
        eos = model.model.shared.weight[2]
        model.model.decoder.layer_norm.bias += spec.eos_bias * eos / eos.dot(eos)
    generation = NLLB_GENERATION_CONFIG if spec.nllb else M2M100_418M_GENERATION_CONFIG
    model.generation_config = GenerationConfig(**{**generation, "max_length": spec.max_position_embeddings})
    model.save_pretrained(out)
    config_path = out / "config.json"
    saved = json.loads(config_path.read_text(encoding="utf-8"))
    extras = NLLB_CONFIG_EXTRAS if spec.nllb else M2M100_418M_CONFIG_EXTRAS
    saved.update({**extras, "max_length": spec.max_position_embeddings})
    config_path.write_text(json.dumps(saved, indent=2), encoding="utf-8")
    return out
