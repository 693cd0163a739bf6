"""Traceable MarianMT encoder and decoder for `torch.onnx.export`.

The encoder graph also computes every decoder layer's cross-attention keys and values: they depend only on the
encoder output, so the decoder graph never recomputes them per step (and never needs the encoder states at all).

The decoder graph takes a (possibly empty) self-attention cache, so one graph serves the first step and every later
step: no second copy of the decoder weights (Optimum's decoder + decoder_with_past) and no If node (Optimum's merged
decoder, which `quantize_dynamic` leaves fp32). The decoder step is written out here rather than traced through
transformers' Cache classes: the cache objects change between transformers releases, the arithmetic does not.

The self-attention cache is grown by a Concat in the graph and returned whole (`present`), or, with `buffered`
(`onnxmt export --cache-buffer`), it is a buffer the runtime owns and writes: the graph reads the first
`past_length` positions of each layer's key/value buffer (the rest masked out) and returns only the new token's key
and value, which the runtime stores at position `past_length`. The buffered cache is held once, instead of a grown
`present` beside the `past` it came from at every step: less memory in large beam batches, for copies in Python
that cost a few percent of their speed (docs/performance.md).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

# Reshapes take their dynamic sizes from the tensor they reshape, or from one size read once per graph (rows,
# sentences), and everything else as constants: ONNX Runtime folds them to constant-shape `Reshape`s or shares one
# Shape/Gather per graph, instead of Shape/Gather/Unsqueeze/Concat bookkeeping in every layer at every step.


def _split_heads(x: torch.Tensor, heads: int, head_dim: int) -> torch.Tensor:
    return x.reshape(x.shape[0], -1, heads, head_dim).transpose(1, 2)  # (batch, heads, length, head_dim)


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scaling: float) -> torch.Tensor:
    """(batch, heads, q_len, head_dim) in, the same out: transformers' eager_attention_forward, in its order of
    operations (scale after the product, additive mask), without the merge of the heads."""
    scores = torch.matmul(q, k.transpose(2, 3)) * scaling + mask  # (batch, heads, q_len, k_len)
    return torch.matmul(F.softmax(scores, dim=-1), v)


def _attend_beams(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor,
    sentences: Any,
    scaling: float,
    heads: int,
    head_dim: int,
) -> torch.Tensor:
    """Cross-attention of every beam of a sentence on that sentence's one copy of the encoder K/V.

    q: (sentences * beams * q_len, d_model), the projected queries before the head split; k, v: (sentences, heads,
    src_len, head_dim); mask: (sentences, 1, 1, src_len). Row r belongs to sentence r // (beams * q_len), so in
    memory the queries already are (sentences, beams * q_len, heads, head_dim): the beams' queries are stacked along
    q_len by a reshape, and the K/V are never repeated per beam. Returns (sentences * beams * q_len, d_model).

    The mask is added before the scale: `(q.k + mask) * scaling`, where a valid position's mask is 0, so its score
    is transformers' `q.k * scaling` bit for bit (a masked one stays hugely negative: weight 0). With the scale right
    after the product, ONNX Runtime would fuse it in (`FusedMatMul(alpha)`), and a greedy row's product (one query)
    would miss MLAS's one-row kernel, which takes only alpha = 1. That kernel sums source positions in blocks of 4
    (as the self-attention's, `_attend_buffer`): the runtime gives every source width in whole blocks
    (`cache.aligned`), so that a row's scores do not depend on the widths of the batch it is in.
    """
    stacked = q.reshape(sentences, -1, heads, head_dim).transpose(1, 2)  # (n, heads, beams * q_len, head_dim)
    scores = (torch.matmul(stacked, k.transpose(2, 3)) + mask) * scaling  # (n, heads, beams * q_len, src_len)
    out = torch.matmul(F.softmax(scores, dim=-1), v).transpose(1, 2)  # (n, beams * q_len, heads, head_dim)
    return out.reshape(-1, heads * head_dim)


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
    """One decoder call: last-position logits out, and the grown cache or (`buffered`) the new token's K/V.

    Buffered: input_ids (rows, 1), encoder_attention_mask, past_length (rows,) int64 (each row's cache length, its
    new token's position), then per layer the key and value buffers (rows, heads, capacity >= past_length,
    head_dim) and the cross-attention K/V; out: logits and per layer the new token's key and value (rows, heads,
    1, head_dim). One new token per row: what the decoding loop feeds.
    Otherwise: input_ids (rows, new_len), encoder_attention_mask, the cache (rows, heads, past_len, head_dim) and
    the cross-attention K/V; out: logits and the cache grown by new_len positions.

    Written for a small step: the hidden states are one (rows * new_len, d_model) matrix, so every projection is
    one 2-D MatMul and bias, which ONNX Runtime fuses into a Gemm; each layer's self-attention query, key and value
    projections are one MatMul on the three weights side by side (each output column is the same dot product as
    in its own projection), split once into heads. At one new token per row this is ~120 fewer kernels a step.
    """

    def __init__(self, model: Any, buffered: bool = False) -> None:
        super().__init__()
        self.buffered = buffered
        decoder = model.model.decoder
        self.embed_tokens = decoder.embed_tokens
        self.embed_positions = decoder.embed_positions
        self.embed_scale = float(getattr(decoder, "embed_scale", 1.0))
        self.layers = decoder.layers
        self.lm_head = model.lm_head
        self.final_logits_bias = getattr(model, "final_logits_bias", None)  # Marian/BART only
        self.heads = model.config.decoder_attention_heads
        self.head_dim = model.config.d_model // self.heads
        self.d_model = model.config.d_model

    def forward(self, input_ids: torch.Tensor, encoder_attention_mask: torch.Tensor, *inputs: torch.Tensor):
        n = len(self.layers)
        rows, new_len = input_ids.shape
        sentences = encoder_attention_mask.shape[0]  # one cross-attention K/V per sentence, its beams are rows
        past_length: Any  # buffered: (rows,), each row's own cache length; else the traced size of the cache
        if self.buffered:
            past_length, past, cross = inputs[0], inputs[1 : 2 * n + 1], inputs[2 * n + 1 :]
            positions = past_length[:, None] + torch.arange(new_len, device=input_ids.device)  # (rows, new_len)
        else:
            past, cross = inputs[: 2 * n], inputs[2 * n :]
            past_length = past[0].shape[2]
            positions = (torch.arange(new_len, device=input_ids.device) + past_length)[None, :]  # (1, new_len)
        hidden = self._embed(input_ids, positions).reshape(-1, self.d_model)  # (rows * new_len, d_model)

        min_value = torch.finfo(hidden.dtype).min
        capacity = past[0].shape[2]  # buffered: every layer's buffers have this many positions, read once here
        if self.buffered:
            # Each row's buffer positions from its own past_length on hold nothing (yet, or for this row): rows of
            # different lengths share one call, as in-flight batching joins them.
            # The new token's own score comes first (`_attend_buffer`): key position -1, never blocked.
            key_pos = torch.arange(-1, capacity, device=input_ids.device)
            blocked = key_pos[None, :] >= past_length[:, None]  # (rows, 1 + capacity)
            self_mask = blocked.to(hidden.dtype)[:, None, None, :] * min_value
        else:
            # Query t sits at position past_length + t and may see keys 0..past_length + t.
            key_pos = torch.arange(past_length + new_len, device=input_ids.device)
            blocked = key_pos[None, :] > positions[0, :, None]  # (new_len, total_len)
            self_mask = blocked.to(hidden.dtype)[None, None] * min_value
        cross_mask = (1.0 - encoder_attention_mask[:, None, None, :].to(hidden.dtype)) * min_value

        outputs: list[torch.Tensor] = []
        masks = (self_mask, cross_mask)
        for i, layer in enumerate(self.layers):
            self_kv, cross_kv = past[2 * i : 2 * i + 2], cross[2 * i : 2 * i + 2]
            hidden, key, value = self._layer(i, layer, hidden, (rows, sentences, capacity), self_kv, cross_kv, masks)
            outputs += [key, value]
        # Only the last position's logits leave the graph: the loop never needs the others.
        last = hidden.reshape(rows, -1, self.d_model)[:, -1, :]
        return (self._logits(last), *outputs)

    def _embed(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        # Marian's positions start at 0; its token embedding is scaled here, outside the embedding module.
        return self.embed_tokens(input_ids) * self.embed_scale + self.embed_positions.weight[positions]

    def _logits(self, last: torch.Tensor) -> torch.Tensor:
        assert self.final_logits_bias is not None  # a Marian/BART model always has one
        return F.linear(last, self.lm_head.weight) + self.final_logits_bias  # (rows, vocab)

    def _layer(self, i, layer, hidden, sizes, self_kv, cross_kv, masks):
        # Post-layer-norm, as Marian/BART: each sublayer's residual sum is normalised.
        self_mask, cross_mask = masks
        attended, key, value = self._self_attention(i, layer, hidden, sizes, self_kv, self_mask)
        hidden = layer.self_attn_layer_norm(hidden + attended)
        hidden = layer.encoder_attn_layer_norm(
            hidden + self._cross_attention(layer, hidden, sizes, cross_kv, cross_mask)
        )
        return layer.final_layer_norm(hidden + self._ffn(layer, hidden)), key, value

    def _self_attention(self, i, layer, x, sizes, self_kv, mask):
        """Self-attention of `x` (rows * new_len, d_model) over the cache plus the new positions, out-projected;
        and the key and value to return (the grown cache, or the new token's when buffered)."""
        rows, _, capacity = sizes
        attn = layer.self_attn
        heads, head_dim = self.heads, self.head_dim
        # The query, key and value weights transposed side by side, (d_model, 3 * d_model): computed from the
        # weights in the trace, and folded into one tensor when the export binds them (binding.py), so the model is
        # never held twice.
        qkv_weight = torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight]).t()
        qkv_bias = torch.cat([attn.q_proj.bias, attn.k_proj.bias, attn.v_proj.bias])
        qkv = torch.matmul(x, qkv_weight) + qkv_bias  # (rows * new_len, 3 * d_model)
        qkv = qkv.reshape(rows, -1, 3 * heads, head_dim).transpose(1, 2)  # (rows, 3 * heads, new_len, hd)
        query, new_key, new_value = qkv.split(heads, dim=1)
        if self.buffered:
            attended = _attend_buffer(query, new_key, new_value, self_kv, capacity, mask, attn.scaling)
            key, value = new_key, new_value
        else:
            key = torch.cat([self_kv[0], new_key], dim=2)  # (rows, heads, total_len, hd)
            value = torch.cat([self_kv[1], new_value], dim=2)
            attended = _attend(query, key, value, mask, attn.scaling)
        attended = attended.transpose(1, 2).reshape(-1, self.d_model)
        return _linear(attended, attn.out_proj), key, value

    def _cross_attention(self, layer, x, sizes, cross_kv, mask):
        """Cross-attention of `x` on the keys/values the encoder graph computed once, out-projected."""
        cross = layer.encoder_attn
        query = _linear(x, cross.q_proj)  # (rows * new_len, d_model): split into heads inside _attend_beams
        sentences = sizes[1]
        attended = _attend_beams(
            query, cross_kv[0], cross_kv[1], mask, sentences, cross.scaling, self.heads, self.head_dim
        )
        return _linear(attended, cross.out_proj)

    def _ffn(self, layer, x):
        return _linear(layer.activation_fn(_linear(x, layer.fc1)), layer.fc2)


def load(path: str) -> Any:
    from transformers import MarianMTModel

    return load_eager(MarianMTModel, path)


def load_eager(model_class: Any, path: str) -> Any:
    """`model_class.from_pretrained(path)` in eval mode, with eager attention (the exported graph must compute what
    transformers' reference path computes), in float32 whatever the checkpoint's dtype: transformers 5 loads a
    checkpoint in its config's `torch_dtype` by default, and opus-mt-tc-big ships float16 weights (upcast here)."""
    return model_class.from_pretrained(path, attn_implementation="eager", dtype=torch.float32).eval()


def encoder(model: Any) -> nn.Module:
    return MarianEncoderExport(model).eval()


def decoder(model: Any, buffered: bool = False) -> nn.Module:
    return MarianDecoderExport(model, buffered=buffered).eval()


def _attend_buffer(
    q: torch.Tensor,
    new_key: torch.Tensor,
    new_value: torch.Tensor,
    buffers: tuple[torch.Tensor, ...],
    capacity: Any,
    mask: torch.Tensor,
    scaling: float,
) -> torch.Tensor:
    """Attention of one new token per row on the cache buffers (masked past their valid positions) and on itself,
    without joining the two: q, new_key, new_value (rows, heads, 1, hd); buffers (rows, heads, capacity, hd); mask
    (rows, 1, 1, 1 + capacity), its first position 0 (the new token's own). The scores are transformers' (product,
    then scale, plus the mask); the masked positions get a weight of exactly 0. Returns (rows, heads, 1, hd).

    The new token's score comes first, then the buffer's: the valid scores lead and the masked ones trail, so the
    softmax adds each valid weight in the same place whatever the capacity (ONNX Runtime's sum is vectorised; a
    score at the end would move with the capacity, into or out of the vectors' tail).

    The scale multiplies the joined scores, not the buffer product: ONNX Runtime would fold a scale on the product
    into it (`FusedMatMul(alpha)`), and MLAS's kernel for a product with one query row takes only alpha = 1
    (opus-mt int8: a step 6-7% faster at 1 to 64 rows; docs/performance.md). That kernel sums each key position in
    blocks of 4, so a position's score depends on whether its block is whole: the runtime keeps buffer capacities
    multiples of 4 (`cache.aligned`), so that a row's scores do not depend on the batch it is in."""
    own_score = (q * new_key).sum(-1, keepdim=True)  # (rows, heads, 1, 1)
    past_scores = torch.matmul(q, buffers[0].transpose(2, 3))  # (rows, heads, 1, capacity)
    weights = F.softmax(torch.cat([own_score, past_scores], dim=-1) * scaling + mask, dim=-1)
    return weights[..., :1] * new_value + torch.matmul(weights[..., 1:], buffers[1])


def _linear(x: torch.Tensor, linear: nn.Linear) -> torch.Tensor:
    """`linear(x)` as MatMul + Add, not the Gemm(transB=1) the exporter writes for 2-D inputs: the int8 quantizer
    gives layer MatMuls per-channel dynamic quantization and treats Gemm(transB=1) as a vocabulary head."""
    return torch.matmul(x, linear.weight.t()) + linear.bias
