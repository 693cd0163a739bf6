"""Traceable mBART-50 encoder and decoder: Marian's export modules (marian.py) with mBART's quirks, and the
tokenizer.json the run side reads.

- The encoder graph runs transformers' own encoder (learned positions, the embedding LayerNorm and the final layer
  norm included), then every decoder layer's cross-attention K/V, as for Marian.
- The decoder is pre-layer-norm as M2M100's (m2m100.py); its input is LayerNorm(scaled token embedding + learned
  position), the position being the token's index from the cache length plus 2 (`MBartLearnedPositionalEmbedding`:
  not pad-aware); the LM head is the shared embedding after the final layer norm, plus `final_logits_bias`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from ..architectures.mbart import SOURCE_TOKENIZER_FILES
from .exporter import write_tokenizer_json
from .m2m100 import M2M100DecoderExport
from .marian import MarianDecoderExport, load_eager
from .marian import encoder as encoder  # the encoder graph is Marian's (module docstring)


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

    return [write_tokenizer_json(MBart50Tokenizer, source, staging, "mBART-50", SOURCE_TOKENIZER_FILES)]
