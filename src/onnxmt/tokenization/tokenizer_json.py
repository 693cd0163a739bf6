"""A model's own `tokenizer.json`, run by the `tokenizers` library (what transformers 5 runs for NLLB), torch-free.

Encoding mirrors `tokenizer(text, truncation=True).input_ids` with the special ids the language scheme asks for
(architectures/schemes.py) instead of the post-processor saved in the file, which holds one source language
only; decoding mirrors `tokenizer.decode(ids, skip_special_tokens=True)`, including transformers 5's refusal to
"clean up tokenization spaces" for BPE models.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..manifest import ModelDirError
from .base import UNLIMITED, Truncating, clean_up_tokenization, read_json_object

_DEFAULT_MAX_LENGTH = UNLIMITED  # transformers' when tokenizer_config.json names none


class JsonTokenizer(Truncating):
    """Encode source text and decode target ids exactly as transformers' tokenizers-backed tokenizer does."""

    def __init__(self, tokenizer: Any, config: dict[str, Any]) -> None:
        self._tokenizer = tokenizer
        tokenizer.no_truncation()
        tokenizer.no_padding()
        value = config.get("model_max_length", _DEFAULT_MAX_LENGTH)
        self.model_max_length = UNLIMITED if value is None else int(value)
        self.truncation_side: str = config.get("truncation_side", "right")
        bpe = type(tokenizer.model).__name__ == "BPE"
        forced = bool(config.get("clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output"))
        self._clean_up_spaces = bool(config.get("clean_up_tokenization_spaces", False)) and (not bpe or forced)
        eos = config.get("eos_token", "</s>")
        self.eos_id = self.token_id(eos["content"] if isinstance(eos, dict) else str(eos))
        self._warned_truncation = False

    @classmethod
    def from_dir(cls, directory: str | Path, files: dict[str, str] | None = None) -> JsonTokenizer:
        from tokenizers import Tokenizer

        directory = Path(directory)
        names = {"tokenizer": "tokenizer.json", "config": "tokenizer_config.json", **(files or {})}
        path = directory / names["tokenizer"]
        if not path.is_file():
            raise ModelDirError(f"{path}: file not found")
        try:
            tokenizer = Tokenizer.from_file(str(path))
        except Exception as e:  # the Rust side raises its own Exception type
            raise ModelDirError(f"{path}: not a valid tokenizer.json ({e})") from e
        return cls(tokenizer, read_json_object(directory / names["config"]))

    def token_id(self, token: str) -> int:
        index = self._tokenizer.token_to_id(token)
        if index is None:
            raise KeyError(token)
        return int(index)

    def _ids(self, text: str, target_token: str | None) -> list[int]:
        # Models with a tokenizer.json are told their languages by prefix and the forced first token.
        if target_token is not None:
            raise ValueError(f"target token {target_token!r} given, but this model takes no target token in its text")
        return list(self._tokenizer.encode(text, add_special_tokens=False).ids)

    def prompt_ids(self, text: str) -> list[int]:
        """The ids of a rendered chat prompt: no special ids added (the template wrote them) and not truncated, as
        transformers' `apply_chat_template(tokenize=True)` encodes it."""
        return list(self._tokenizer.encode(text, add_special_tokens=False).ids)

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [self.encode(text) for text in texts]

    def decode(self, ids: Sequence[int]) -> str:
        text = self._tokenizer.decode([int(i) for i in ids], skip_special_tokens=True)
        return clean_up_tokenization(text) if self._clean_up_spaces else text

    def decode_batch(self, batch: Sequence[Sequence[int]]) -> list[str]:
        return [self.decode(ids) for ids in batch]
