"""What the run side's tokenizers share: transformers' truncation, its clean-up of tokenization spaces, and reading
the JSON files a tokenizer comes with. Torch-free, as every tokenizer here."""

from __future__ import annotations

import json
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..manifest import ModelDirError

# transformers stores "no limit" as VERY_LARGE_INTEGER and skips truncation above LARGE_INTEGER.
UNLIMITED = int(1e30)
LARGE = int(1e20)


class Truncating:
    """`encode` with truncation as transformers' `truncation=True` does it, shared by the run side's tokenizers:
    they set `model_max_length`, `truncation_side`, `eos_id` and `_warned_truncation`, and implement `_ids`."""

    model_max_length: int
    truncation_side: str
    eos_id: int
    _warned_truncation: bool

    def encode(
        self,
        text: str,
        target_token: str | None = None,
        *,
        prefix: Sequence[int] = (),
        suffix: Sequence[int] | None = None,
    ) -> list[int]:
        """Ids of `text` between `prefix` and `suffix` (default: eos), truncated so that all fit in
        model_max_length; `target_token`: a language token written before the text, for models told their target
        language so (Marian's `>>cmn_Hans<<`)."""
        ids = self._ids(text, target_token)
        suffix = [self.eos_id] if suffix is None else list(suffix)
        return [*prefix, *self._truncate(ids, len(prefix) + len(suffix)), *suffix]

    def _ids(self, text: str, target_token: str | None) -> list[int]:
        """The ids of `text` alone, no special ids added."""
        raise NotImplementedError

    def _truncate(self, ids: list[int], specials: int = 1) -> list[int]:
        # truncation=True keeps model_max_length ids including the special ids added afterwards.
        excess = len(ids) + specials - self.model_max_length
        if self.model_max_length > LARGE or self.model_max_length <= 0 or excess <= 0:
            return ids
        if not self._warned_truncation:
            self._warned_truncation = True
            warnings.warn(
                f"input of {len(ids) + specials} tokens truncated to model_max_length={self.model_max_length} "
                "(warned once per tokenizer)",
                stacklevel=3,
            )
        return ids[excess:] if self.truncation_side == "left" else ids[:-excess]


def check_unicode(texts: Sequence[str]) -> None:
    """ValueError naming the first text that holds a lone surrogate (`"\\ud800"`: legal in JSON and in a Python str,
    not text; no tokenizer can encode it). Refused, as the service refuses it, rather than replaced with U+FFFD
    behind the caller's back."""
    for i, text in enumerate(texts):
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as e:
            raise ValueError(
                f"texts[{i}] is not valid Unicode text: a lone surrogate {text[e.start]!r} at position {e.start}"
                " (from bytes decoded with errors='surrogateescape'? decode them with errors='replace')"
            ) from None


def clean_up_tokenization(text: str) -> str:
    for before, after in (
        (" .", "."),
        (" ?", "?"),
        (" !", "!"),
        (" ,", ","),
        (" ' ", "'"),
        (" n't", "n't"),
        (" 'm", "'m"),
        (" 's", "'s"),
        (" 've", "'ve"),
        (" 're", "'re"),
    ):
        text = text.replace(before, after)
    return text


def read_json_object(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise ModelDirError(f"{path}: file not found")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ModelDirError(f"{path}: not valid JSON ({e})") from e
    if not isinstance(data, dict):
        raise ModelDirError(f"{path}: expected a JSON object, got {type(data).__name__}")
    return data
