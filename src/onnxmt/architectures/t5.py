"""T5 (`model_type` t5: t5, flan-T5, MADLAD-400) and mT5 (`model_type` mt5).

The model (export/t5.py): relative position buckets instead of positions, RMSNorm, no attention biases nor score
scaling, a relu or gated-gelu FFN, heads of `d_kv`; decoder start 0 (pad for T5, `<unk>` for MADLAD).

Languages (`target_token_prefix` scheme, text written before the source text):
- MADLAD-400: a `<2xx>` token first in the source (`<2zh> I love pizza!`), one per language its vocabulary has;
  any source language.
- T5 and flan-T5: the task prefixes of the config's `task_specific_params` (`translate English to German: `), one
  per `translation_<src>_to_<tgt>` entry, from their one source language.

The tokenizer is the model's `tokenizer.json` (t5-small, flan-T5 and MADLAD ship one), on the `tokenizers` library.
mT5's repositories ship only `spiece.model`: its export writes transformers' `T5Tokenizer` conversion of it as the
directory's `tokenizer.json` (a build hook, as for mBART-50), and the run side reads that as for the others.
Where the configs name no length (MADLAD-400 and mT5 ship only ids), the manifest names none either: the runtime
then stops at transformers' default, 20 new tokens (runtime/search.py), as `generate()` does; `onnxmt inspect`
says so, and the service gives such a model a longer default (`--fallback-max-new-tokens`).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from ..tokenization import JsonTokenizer
from .base import Architecture, check_default_target, read_json, register
from .schemes import TargetTokenPrefix

_LANGUAGE_TOKEN = re.compile(r"^<2([A-Za-z][A-Za-z0-9_-]*)>$")  # MADLAD's <2zh>, <2zh_Latn>
_TASK = re.compile(r"^translation_([a-z]+)_to_([a-z]+)$")  # T5's task_specific_params keys
# A T5 model has no position table: the most tokens onnxmt lets it read or write when its config names none.
DEFAULT_POSITIONS = 512


@register("t5")
class T5(Architecture):
    name = "t5"
    tokenizer_kind = "tokenizers"
    tokenizer_files: tuple[str, ...] = ("tokenizer.json", "tokenizer_config.json")
    optional_tokenizer_files = ("special_tokens_map.json",)
    build_hooks = "onnxmt.export.t5"

    def facts(self, config: dict[str, Any]) -> dict[str, Any]:
        return {
            "d_model": config["d_model"],
            "encoder_layers": config["num_layers"],
            "num_layers": config.get("num_decoder_layers") or config["num_layers"],
            "num_heads": config["num_heads"],
            "head_dim": config["d_kv"],
            "vocab_size": config["vocab_size"],
            "max_positions": config.get("n_positions") or DEFAULT_POSITIONS,
        }

    def unk_id(self, source: Path) -> int | None:
        pieces = _pieces(read_json(source / "tokenizer.json"))
        return pieces.index("<unk>") if "<unk>" in pieces else None

    def load_tokenizer(self, directory: Path) -> JsonTokenizer:
        return JsonTokenizer.from_dir(directory)

    def languages(self, source: Path, default_target: str | None) -> dict[str, Any]:
        tokens = self.language_tokens(source)
        sources = {
            match.group(1)
            for key in (read_json(source / "config.json").get("task_specific_params") or {})
            if (match := _TASK.match(key))
        }
        check_default_target(default_target, tokens, "none (no translation prefix or language token)")
        return {
            "scheme": TargetTokenPrefix.name,
            "source": sources.pop() if len(sources) == 1 else None,
            "target": None,
            "target_tokens": tokens,
            "default_target": default_target,
        }

    def language_tokens(self, source: Path) -> dict[str, str]:
        """MADLAD's `<2xx>` tokens, else T5's translation prefixes (without their last space, which the scheme
        writes between the prefix and the text)."""
        tokenizer = read_json(source / "tokenizer.json")
        added = [t.get("content", "") for t in tokenizer.get("added_tokens", [])]
        found = {m.group(1): token for token in (*_pieces(tokenizer), *added) if (m := _LANGUAGE_TOKEN.match(token))}
        if found:
            return found
        prefixes = {}
        for key, task in (read_json(source / "config.json").get("task_specific_params") or {}).items():
            match = _TASK.match(key)
            prefix = task.get("prefix") if isinstance(task, dict) else None
            if match and isinstance(prefix, str) and prefix.endswith(" "):
                prefixes[match.group(2)] = prefix[:-1]
        return prefixes


def _pieces(tokenizer: dict[str, Any]) -> list[str]:
    """A tokenizer.json's model vocabulary in id order (a unigram model's [piece, score] list, or a token -> id map)."""
    vocab = tokenizer.get("model", {}).get("vocab", [])
    return [entry[0] for entry in vocab] if isinstance(vocab, list) else sorted(vocab, key=vocab.__getitem__)


# The source files mT5's tokenizer.json is made from, either of which T5Tokenizer reads (tokenizer.json first).
MT5_SOURCE_TOKENIZER_FILES = ("tokenizer.json", "spiece.model")


@register("mt5")
class MT5(T5):
    """mT5 (google/mt5-*, MT5ForConditionalGeneration): T5 v1.1's model (gated-gelu, untied head) under a model_type
    of its own, with only a sentencepiece model for a tokenizer (pad 0, eos 1, unk 2, no extra ids)."""

    name = "mt5"
    tokenizer_files = ("tokenizer_config.json",)
    optional_tokenizer_files = ("special_tokens_map.json",)

    def for_source(self, source: Path) -> Architecture:
        if not any((source / name).is_file() for name in MT5_SOURCE_TOKENIZER_FILES):
            needs = " or ".join(MT5_SOURCE_TOKENIZER_FILES)
            raise ValueError(f"{source}: no tokenizer; an mT5 model directory needs {needs}")
        return self

    def unk_id(self, source: Path) -> int | None:
        return 2  # T5Tokenizer's unigram model has unk_id 2 whatever the sentencepiece model says

    def write_tokenizer(self, source: Path, staging: Path) -> list[str]:
        return list(self._hooks().write_tokenizer(source, staging))
