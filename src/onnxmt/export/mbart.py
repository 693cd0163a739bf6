"""Traceable mBART-50 encoder and decoder: Marian's export modules (marian.py) with mBART's quirks, and the
tokenizer.json the run side reads.

- The encoder graph runs transformers' own encoder (learned positions, the embedding LayerNorm and the final layer
  norm included), then every decoder layer's cross-attention K/V, as for Marian.
- The decoder is pre-layer-norm as M2M100's (m2m100.py); its input is LayerNorm(scaled token embedding + learned
  position), the position being the token's index from the cache length plus 2 (`MBartLearnedPositionalEmbedding`:
  not pad-aware); the LM head is the shared embedding after the final layer norm, plus `final_logits_bias`.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from ..architectures.mbart import SOURCE_TOKENIZER_FILES
from .exporter import ExportError
from .m2m100 import M2M100DecoderExport
from .marian import MarianDecoderExport, load_eager
from .marian import encoder as encoder  # the encoder graph is Marian's (module docstring)

TOKENIZER_FILE = "tokenizer.json"


class MBartDecoderExport(MarianDecoderExport):
    _layer = M2M100DecoderExport._layer  # pre-layer-norm, as M2M100's

    def __init__(self, model: Any, buffered: bool = False) -> None:
        super().__init__(model, buffered)
        decoder = model.model.decoder
        self.layernorm_embedding = decoder.layernorm_embedding
        self.layer_norm = decoder.layer_norm
        self.position_offset = int(decoder.embed_positions.offset)

    def _embed(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        # The token embedding module scales by sqrt(d_model) itself; positions are learned, offset by 2.
        hidden = self.embed_tokens(input_ids) + self.embed_positions.weight[positions + self.position_offset]
        return self.layernorm_embedding(hidden)

    def _logits(self, last: torch.Tensor) -> torch.Tensor:
        # The final layer norm is per position: applied to the last one only, it is the same as over all.
        assert self.final_logits_bias is not None
        return F.linear(self.layer_norm(last), self.lm_head.weight) + self.final_logits_bias  # (rows, vocab)


def load(path: str) -> Any:
    from transformers import MBartForConditionalGeneration

    return load_eager(MBartForConditionalGeneration, path)


def decoder(model: Any, buffered: bool = False) -> nn.Module:
    return MBartDecoderExport(model, buffered=buffered).eval()


def write_tokenizer(source: Path, staging: Path) -> list[str]:
    """tokenizer.json as transformers' MBart50Tokenizer builds it from the source's files (its conversion of
    sentencepiece.bpe.model, or the source's own tokenizer.json), with the 52 language codes and `<mask>`."""
    from transformers import MBart50Tokenizer

    if not any((source / name).is_file() for name in SOURCE_TOKENIZER_FILES):
        needs = " or ".join(SOURCE_TOKENIZER_FILES)
        raise ExportError(f"{source}: no tokenizer; an mBART-50 model directory needs {needs}")
    try:
        tokenizer = MBart50Tokenizer.from_pretrained(str(source))
    except Exception as e:  # sentencepiece and tokenizers raise their own types for a corrupt file
        raise ExportError(f"{source}: the mBART-50 tokenizer does not load ({e})") from e
    with tempfile.TemporaryDirectory() as tmp:
        tokenizer.save_pretrained(tmp)
        (staging / TOKENIZER_FILE).write_bytes((Path(tmp) / TOKENIZER_FILE).read_bytes())
    return [TOKENIZER_FILE]
