"""Traceable MarianMT encoder and decoder for `torch.onnx.export`.

The encoder graph also computes every decoder layer's cross-attention keys and values: they depend only on the
encoder output, so the decoder graph never recomputes them per step (and never needs the encoder states at all).

The decoder graph takes a (possibly empty) self-attention cache, so one graph serves the first step and every later
step: no second copy of the decoder weights (Optimum's decoder + decoder_with_past) and no If node (Optimum's merged
decoder, which `quantize_dynamic` leaves fp32). The decoder step is written out here rather than traced through
transformers' Cache classes: the cache objects change between transformers releases, the arithmetic does not.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

# Reshapes take their dynamic sizes from the tensor they reshape and everything else as constants, so ONNX Runtime's
# ReshapeFusion folds them to `Reshape(x, [0, -1, ...])`: no Shape/Gather/Unsqueeze/Concat bookkeeping per step.


def _split_heads(x: torch.Tensor, heads: int, head_dim: int) -> torch.Tensor:
    return x.reshape(x.shape[0], -1, heads, head_dim).transpose(1, 2)  # (batch, heads, length, head_dim)


def _merge_heads(x: torch.Tensor, heads: int, head_dim: int) -> torch.Tensor:
    x = x.transpose(1, 2)  # (batch, length, heads, head_dim)
    return x.reshape(x.shape[0], -1, heads * head_dim)


def _attend(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scaling: float, heads: int, head_dim: int
) -> torch.Tensor:
    # Same order of operations as transformers' eager_attention_forward: scale after the product, additive mask.
    scores = torch.matmul(q, k.transpose(2, 3)) * scaling + mask  # (batch, heads, q_len, k_len)
    out = torch.matmul(F.softmax(scores, dim=-1), v)  # (batch, heads, q_len, head_dim)
    return _merge_heads(out, heads, head_dim)


def _attend_beams(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scaling: float, heads: int, head_dim: int
) -> torch.Tensor:
    """Cross-attention of every beam of a sentence on that sentence's one copy of the encoder K/V.

    q: (sentences * beams, q_len, d_model), the projected queries before the head split; k, v: (sentences, heads,
    src_len, head_dim); mask: (sentences, 1, 1, src_len). Row r belongs to sentence r // beams, so in memory the
    queries already are (sentences, beams * q_len, heads, head_dim): the beams' queries are stacked along q_len by a
    reshape, and the K/V are never repeated per beam. Returns (sentences * beams, q_len, d_model).
    """
    stacked = q.reshape(k.shape[0], -1, heads, head_dim).transpose(1, 2)  # (n, heads, beams * q_len, head_dim)
    scores = torch.matmul(stacked, k.transpose(2, 3)) * scaling + mask  # (n, heads, beams * q_len, src_len)
    out = torch.matmul(F.softmax(scores, dim=-1), v).transpose(1, 2)  # (n, beams * q_len, heads, head_dim)
    return out.reshape(q.shape[0], -1, heads * head_dim)


class MarianEncoderExport(nn.Module):
    """input_ids, attention_mask -> encoder_hidden_states, cross_key.i, cross_value.i for every decoder layer."""

    def __init__(self, model: Any) -> None:
        super().__init__()
        self.encoder = model.get_encoder()
        self.decoder_layers = model.model.decoder.layers
        self.heads = model.config.decoder_attention_heads
        self.head_dim = model.config.d_model // self.heads

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> tuple[torch.Tensor, ...]:
        states = self.encoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        outputs = [states]
        for layer in self.decoder_layers:
            attn = layer.encoder_attn
            outputs.append(_split_heads(attn.k_proj(states), self.heads, self.head_dim))  # (batch, heads, src, hd)
            outputs.append(_split_heads(attn.v_proj(states), self.heads, self.head_dim))
        return tuple(outputs)


class MarianDecoderExport(nn.Module):
    """One decoder call: new tokens + cache in, last-position logits + grown cache out."""

    def __init__(self, model: Any) -> None:
        super().__init__()
        decoder = model.model.decoder
        self.embed_tokens = decoder.embed_tokens
        self.embed_positions = decoder.embed_positions
        self.embed_scale = float(decoder.embed_scale)
        self.layers = decoder.layers
        self.lm_head = model.lm_head
        self.final_logits_bias = model.final_logits_bias
        self.heads = model.config.decoder_attention_heads
        self.head_dim = model.config.d_model // self.heads

    def forward(self, input_ids: torch.Tensor, encoder_attention_mask: torch.Tensor, *cache: torch.Tensor):
        n = len(self.layers)
        past, cross = cache[: 2 * n], cache[2 * n :]
        past_len = past[0].shape[2]
        new_len = input_ids.shape[1]
        positions = torch.arange(new_len, device=input_ids.device) + past_len
        hidden = self.embed_tokens(input_ids) * self.embed_scale + self.embed_positions.weight[positions]

        # Query t sits at position past_len + t and may see keys 0..past_len + t.
        key_pos = torch.arange(past_len + new_len, device=input_ids.device)
        blocked = key_pos[None, :] > positions[:, None]  # (new_len, total_len)
        min_value = torch.finfo(hidden.dtype).min
        self_mask = blocked.to(hidden.dtype)[None, None] * min_value
        cross_mask = (1.0 - encoder_attention_mask[:, None, None, :].to(hidden.dtype)) * min_value

        presents: list[torch.Tensor] = []
        for i, layer in enumerate(self.layers):
            hidden, key, value = self._layer(
                layer,
                hidden,
                past[2 * i],
                past[2 * i + 1],
                cross[2 * i],
                cross[2 * i + 1],
                self_mask,
                cross_mask,
            )
            presents += [key, value]
        # Only the last position's logits leave the graph: the loop never needs the others.
        logits = F.linear(hidden[:, -1, :], self.lm_head.weight) + self.final_logits_bias  # (batch, vocab)
        return (logits, *presents)

    def _layer(self, layer, hidden, past_key, past_value, cross_key, cross_value, self_mask, cross_mask):
        # Self-attention over the cache plus the new positions (post-layer-norm, as Marian/BART).
        attn = layer.self_attn
        heads, head_dim = self.heads, self.head_dim
        query = _split_heads(attn.q_proj(hidden), heads, head_dim)
        key = torch.cat([past_key, _split_heads(attn.k_proj(hidden), heads, head_dim)], dim=2)  # (batch, heads, T, hd)
        value = torch.cat([past_value, _split_heads(attn.v_proj(hidden), heads, head_dim)], dim=2)
        attended = _attend(query, key, value, self_mask, attn.scaling, heads, head_dim)
        hidden = layer.self_attn_layer_norm(hidden + attn.out_proj(attended))

        # Cross-attention on the keys/values the encoder graph computed once.
        cross = layer.encoder_attn
        query = cross.q_proj(hidden)  # (rows, new_len, d_model): split into heads inside _attend_beams
        attended = _attend_beams(query, cross_key, cross_value, cross_mask, cross.scaling, heads, head_dim)
        hidden = layer.encoder_attn_layer_norm(hidden + cross.out_proj(attended))

        ffn = layer.fc2(layer.activation_fn(layer.fc1(hidden)))
        return layer.final_layer_norm(hidden + ffn), key, value
