"""The run side's tokenizers, torch-free and id-for-id equal to transformers' own: sentencepiece + `vocab.json`
(`MarianTokenizer`, which families subclass for their quirks, as architectures/m2m100.py does) and a model's
`tokenizer.json` on the `tokenizers` library (`JsonTokenizer`). Which one a model directory uses is its manifest's
`tokenizer.kind`, which the families register (architectures/); `onnxmt.runtime.tokenizer.load_tokenizer` loads
it."""

from __future__ import annotations

from .base import Truncating
from .sentencepiece import MarianTokenizer, Vocab
from .tokenizer_json import JsonTokenizer

__all__ = ["JsonTokenizer", "MarianTokenizer", "Truncating", "Vocab"]
