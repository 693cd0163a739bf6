"""MarianMT (Helsinki-NLP/opus-mt-*): post-layer-norm, static sinusoidal positions from 0, scaled embeddings, a
tied LM head plus `final_logits_bias`, decoder start = pad. Multi-target models are told the target language by a
`>>xx<<` token written before the source text; the tokenizer is sentencepiece + `vocab.json` (no tokenizer.json)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..tokenization import MarianTokenizer
from .base import Architecture, check_default_target, read_json, register
from .schemes import TargetTokenPrefix

MARIAN_TOKENIZER_FILES = ("source.spm", "target.spm", "vocab.json", "tokenizer_config.json")
OPTIONAL_TOKENIZER_FILES = ("target_vocab.json", "special_tokens_map.json")


def bart_facts(config: dict[str, Any]) -> dict[str, Any]:
    """The sizes the runtime needs, from a Marian/BART-style config.json (M2M100's has the same keys)."""
    heads = config["decoder_attention_heads"]
    return {
        "d_model": config["d_model"],
        "encoder_layers": config["encoder_layers"],
        "num_layers": config["decoder_layers"],
        "num_heads": heads,
        "head_dim": config["d_model"] // heads,
        "vocab_size": config.get("decoder_vocab_size") or config["vocab_size"],
        "max_positions": config["max_position_embeddings"],
    }


def marian_target_tokens(vocab: Any) -> dict[str, str]:
    """`{"cmn_Hans": ">>cmn_Hans<<", ...}`: the target-language tokens of a multi-target Marian vocab."""
    return {t[2:-2]: t for t in vocab if t.startswith(">>") and t.endswith("<<")}


# Every manifest before format 3 is Marian's: they name no tokenizer kind and no language scheme.
@register("marian", legacy=True)
class Marian(Architecture):
    name = "marian"
    tokenizer_kind = "marian"
    tokenizer_files = MARIAN_TOKENIZER_FILES
    # target_vocab.json exists only for models with separate source/target vocabularies.
    optional_tokenizer_files = OPTIONAL_TOKENIZER_FILES
    build_hooks = "onnxmt.export.marian"
    reads_optimum = True  # the opus-mt directories Optimum and onnx-community publish (tests/test_layout_optimum.py)

    def load_tokenizer(self, directory: Path) -> MarianTokenizer:
        return MarianTokenizer.from_dir(directory)

    def facts(self, config: dict[str, Any]) -> dict[str, Any]:
        return bart_facts(config)

    def unk_id(self, source: Path) -> int | None:
        unk = read_json(source / "tokenizer_config.json").get("unk_token", "<unk>")
        return read_json(source / "vocab.json").get(unk if isinstance(unk, str) else "<unk>")

    def languages(self, source: Path, default_target: str | None) -> dict[str, Any]:
        tokenizer_config = read_json(source / "tokenizer_config.json")
        target_tokens = marian_target_tokens(read_json(source / "vocab.json"))
        check_default_target(default_target, target_tokens, "none (single-target model)")
        return {
            "scheme": TargetTokenPrefix.name,
            "source": tokenizer_config.get("source_lang"),
            "target": tokenizer_config.get("target_lang"),
            "target_tokens": target_tokens,
            "default_target": default_target,
        }

    def tokenizer_section(self, source: Path, files: list[str], facts: dict[str, Any]) -> dict[str, Any]:
        separate = bool(read_json(source / "tokenizer_config.json").get("separate_vocabs", False))
        return {**super().tokenizer_section(source, files, facts), "separate_vocabs": separate}
