"""transformers' side of the parity tests: its M2M100 / NLLB-200 tokenizer and model for a directory, and the
language pairs the tiny M2M100 and NLLB models are checked on (tests/conftest.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

M2M100_PAIRS = ("en", ("zh", "fr"))
NLLB_PAIRS = ("eng_Latn", ("zho_Hans", "fra_Latn"))


def hf_m2m100(model_dir: Path) -> tuple[Any, Any]:
    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    model = transformers.M2M100ForConditionalGeneration.from_pretrained(model_dir).eval()
    return tokenizer, model


def hf_language_id(tokenizer: Any, code: str) -> int:
    """The id of a language code's token: M2M100's `__zh__` for "zh", NLLB's own token for "zho_Hans"."""
    return (
        int(tokenizer.get_lang_id(code)) if hasattr(tokenizer, "get_lang_id") else tokenizer.convert_tokens_to_ids(code)
    )
