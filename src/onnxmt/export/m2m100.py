"""Traceable M2M100 / NLLB-200 encoder and decoder: Marian's export modules (marian.py) with M2M100's quirks.

- The encoder graph runs transformers' own encoder (pad-aware positions, final layer norm included), then every
  decoder layer's cross-attention K/V, as for Marian.
- The decoder is pre-layer-norm (each sublayer reads a normalised copy; the residual stream is not normalised)
  with one final `layer_norm` after the last layer; its token embedding module scales by sqrt(d_model) itself;
  positions are fairseq's: non-pad tokens count from padding_idx + 1 (so the first decoder token sits at 2), pad
  tokens sit at padding_idx; the LM head is the shared embedding, with no `final_logits_bias`.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from .marian import MarianDecoderExport, load_eager
from .marian import encoder as encoder  # the encoder graph is Marian's (module docstring)


class M2M100DecoderExport(MarianDecoderExport):
    def __init__(self, model: Any, buffered: bool = False) -> None:
        super().__init__(model, buffered)
        decoder = model.model.decoder
        self.layer_norm = decoder.layer_norm
        self.padding_idx = int(decoder.embed_positions.padding_idx)

    def _embed(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        # transformers' create_position_ids_from_input_ids with the cache length: (cumsum(mask) + past) * mask + pad.
        past_length = positions[:, :1]  # (rows or 1, 1): each row's first new position is its cache length
        mask = (input_ids != self.padding_idx).to(torch.int64)  # (rows, new_len)
        ids = (torch.cumsum(mask, dim=1) + past_length) * mask + self.padding_idx
        return self.embed_tokens(input_ids) + self.embed_positions.weights[ids]

    def _layer(self, i, layer, hidden, sizes, self_kv, cross_kv, masks):
        self_mask, cross_mask = masks
        attended, key, value = self._self_attention(
            i, layer, layer.self_attn_layer_norm(hidden), sizes, self_kv, self_mask
        )
        hidden = hidden + attended
        normed = layer.encoder_attn_layer_norm(hidden)
        hidden = hidden + self._cross_attention(layer, normed, sizes, cross_kv, cross_mask)
        return hidden + self._ffn(layer, layer.final_layer_norm(hidden)), key, value

    def _logits(self, last: torch.Tensor) -> torch.Tensor:
        # The final layer norm is per position: applied to the last one only, it is the same as over all.
        return F.linear(self.layer_norm(last), self.lm_head.weight)  # (rows, vocab)


def load(path: str) -> Any:
    from transformers import M2M100ForConditionalGeneration

    return load_eager(M2M100ForConditionalGeneration, path)


def decoder(model: Any, buffered: bool = False) -> nn.Module:
    return M2M100DecoderExport(model, buffered=buffered).eval()
