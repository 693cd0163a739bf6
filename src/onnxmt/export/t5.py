"""Traceable T5 encoder and decoder (t5, flan-T5, mT5, MADLAD-400), written out as marian.py's are, and the
tokenizer.json mT5's export writes.

What differs from BART-style models, each as transformers' modeling_t5.py computes it:

- attention: no biases, and no 1/sqrt(d) scaling of the scores; heads of `d_kv` (which need not divide d_model:
  MADLAD-3B has 16 heads of 128 on d_model 1024);
- a relative position bias: the first layer's `relative_attention_bias` (buckets x heads) indexed by the bucket of
  each (key - query) distance, added to every layer's self-attention scores, none in cross-attention. The buckets
  come from a table made here with transformers' own `_relative_position_bucket` (its float log truncated to an
  integer), indexed by the distance clamped to `relative_attention_max_distance`, past which every bucket is the
  same: the graph has no float log, so every position gets exactly transformers' bucket;
- RMSNorm (T5LayerNorm) before each sublayer and after each stack, without ReduceMean (`_rms_norm`), no embedding
  scale, no positions;
- FFN: relu (t5) or gated `act(wi_0 x) * wi_1 x` (gelu_new: v1.1, flan-T5, mT5, MADLAD);
- head: t5 ties it to the embedding and scales the decoder output by d_model^-0.5 first (`scale_decoder_outputs`);
  the others have their own head, unscaled (`_scales_decoder_outputs`).

Only the buffered decoder (the default export: one new token per row, each row its own cache length) is written.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from ..architectures.t5 import MT5_SOURCE_TOKENIZER_FILES
from .exporter import write_tokenizer_json
from .marian import _attend_beams, _split_heads, load_eager


def _project(x: torch.Tensor, linear: nn.Linear) -> torch.Tensor:
    """`linear(x)` as a MatMul (T5 has no biases): the int8 quantizer quantizes layer MatMuls per channel."""
    return torch.matmul(x, linear.weight.t())


def _rms_norm(norm: Any, x: torch.Tensor) -> torch.Tensor:
    """T5LayerNorm as transformers computes it, with the mean of squares as ReduceSum / d_model rather than
    ReduceMean: int4's quantizer (MatMulNBitsQuantizer) raises the graph's opset to 21 without rewriting its nodes,
    and ReduceMean's `axes` moved from an attribute to an input at opset 18 (the graph would not load), ReduceSum's
    at opset 13."""
    variance = x.pow(2).sum(-1, keepdim=True) / norm.weight.shape[0]
    return norm.weight * (x * torch.rsqrt(variance + norm.variance_epsilon))


def bucket_table(attention: Any, bidirectional: bool) -> torch.Tensor:
    """Each clamped distance's bucket, by transformers' own function. Bidirectional (the encoder): index
    `key - query + max_distance` for key - query in [-max_distance, max_distance]; unidirectional (the decoder):
    index `query - key` in [0, max_distance]. Beyond max_distance every bucket is the last one of its side."""
    limit = int(attention.relative_attention_max_distance)
    relative = torch.arange(-limit, limit + 1) if bidirectional else -torch.arange(0, limit + 1)
    return attention._relative_position_bucket(
        relative,
        bidirectional=bidirectional,
        num_buckets=attention.relative_attention_num_buckets,
        max_distance=limit,
    ).to(torch.int64)


class _T5Parts(nn.Module):
    """What the encoder and decoder modules share: the sizes, the decoder's blocks, and their own stack (`stack`:
    its embedding, blocks, final norm, the first layer's relative bias and its bucket table)."""

    buckets: torch.Tensor

    def __init__(self, model: Any, stack: Any, bidirectional: bool) -> None:
        super().__init__()
        config = model.config
        self.heads = int(config.num_heads)
        self.head_dim = int(config.d_kv)
        self.decoder_blocks = model.decoder.block
        self.embed_tokens = stack.embed_tokens
        self.blocks = stack.block
        self.final_layer_norm = stack.final_layer_norm
        attention = stack.block[0].layer[0].SelfAttention
        self.relative_attention_bias = attention.relative_attention_bias
        self.limit = int(attention.relative_attention_max_distance)
        self.register_buffer("buckets", bucket_table(attention, bidirectional=bidirectional), persistent=False)

    def _ffn(self, layer: Any, x: torch.Tensor) -> torch.Tensor:
        dense = layer.DenseReluDense
        if hasattr(dense, "wi_0"):  # gated: act(wi_0 x) * wi_1 x
            hidden = dense.act(_project(x, dense.wi_0)) * _project(x, dense.wi_1)
        else:
            hidden = dense.act(_project(x, dense.wi))
        return _project(hidden, dense.wo)


class T5EncoderExport(_T5Parts):
    """input_ids, attention_mask -> encoder_hidden_states, cross_key.i, cross_value.i for every decoder layer."""

    def __init__(self, model: Any) -> None:
        super().__init__(model, model.encoder, bidirectional=True)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> tuple[torch.Tensor, ...]:
        hidden = self.embed_tokens(input_ids)  # (batch, src, d_model): no scale, no positions
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        relative = (positions[None, :] - positions[:, None]).clamp(-self.limit, self.limit) + self.limit
        bias = self.relative_attention_bias(self.buckets[relative]).permute(2, 0, 1)[None]  # (1, heads, src, src)
        mask = (1.0 - attention_mask[:, None, None, :].to(hidden.dtype)) * torch.finfo(hidden.dtype).min
        for block in self.blocks:
            sublayer = block.layer[0]
            attention = sublayer.SelfAttention
            x = _rms_norm(sublayer.layer_norm, hidden)
            projections = (attention.q, attention.k, attention.v)
            q, k, v = (_split_heads(_project(x, p), self.heads, self.head_dim) for p in projections)
            scores = torch.matmul(q, k.transpose(2, 3)) + bias + mask  # transformers' order: scores, bias, mask
            attended = torch.matmul(F.softmax(scores, dim=-1), v).transpose(1, 2)
            attended = attended.reshape(input_ids.shape[0], -1, self.heads * self.head_dim)
            hidden = hidden + _project(attended, attention.o)
            ffn = block.layer[-1]
            hidden = hidden + self._ffn(ffn, _rms_norm(ffn.layer_norm, hidden))
        states = _rms_norm(self.final_layer_norm, hidden)
        outputs = [states]
        for block in self.decoder_blocks:
            cross = block.layer[1].EncDecAttention
            outputs.append(_split_heads(_project(states, cross.k), self.heads, self.head_dim))
            outputs.append(_split_heads(_project(states, cross.v), self.heads, self.head_dim))
        return tuple(outputs)


class T5DecoderExport(_T5Parts):
    """One decoder step, buffered: input_ids (rows, 1), encoder_attention_mask (sentences, src), past_length (rows,),
    per layer the key and value buffers (rows, heads, capacity, d_kv), then per layer the cross-attention K/V
    (sentences, heads, src, d_kv); out: logits (rows, vocab) and per layer the new token's key and value."""

    buffered = True

    def __init__(self, model: Any) -> None:
        super().__init__(model, model.decoder, bidirectional=False)
        self.lm_head = model.lm_head
        self.d_model = int(model.config.d_model)
        self.output_scale = self.d_model**-0.5 if _scales_decoder_outputs(model) else None

    def forward(self, input_ids: torch.Tensor, encoder_attention_mask: torch.Tensor, *inputs: torch.Tensor):
        n = len(self.blocks)
        past_length, past, cross = inputs[0], inputs[1 : 2 * n + 1], inputs[2 * n + 1 :]
        rows = input_ids.shape[0]
        sentences = encoder_attention_mask.shape[0]
        hidden = self.embed_tokens(input_ids).reshape(rows, self.d_model)  # one new token per row
        min_value = torch.finfo(hidden.dtype).min
        capacity = past[0].shape[2]
        key_pos = torch.arange(capacity, device=input_ids.device)
        # Each row's query sits at its past_length: distance query - key, clamped where the buckets saturate (and at
        # 0 for the buffer's unfilled positions, which the mask removes).
        distance = (past_length[:, None] - key_pos[None, :]).clamp(0, self.limit)  # (rows, capacity)
        past_bias = self.relative_attention_bias(self.buckets[distance]).permute(0, 2, 1)[:, :, None, :]
        own_bias = self.relative_attention_bias.weight[self.buckets[0]][None, :, None, None]  # distance 0
        blocked = key_pos[None, :] >= past_length[:, None]
        self_mask = blocked.to(hidden.dtype)[:, None, None, :] * min_value  # (rows, 1, 1, capacity)
        # The new token's own score first, then the buffer's (as marian._attend_buffer, and for the same reason).
        self_bias = torch.cat([own_bias.expand(rows, -1, -1, -1), past_bias + self_mask], dim=-1)
        cross_mask = (1.0 - encoder_attention_mask[:, None, None, :].to(hidden.dtype)) * min_value
        outputs: list[torch.Tensor] = []
        for i, block in enumerate(self.blocks):
            sublayer = block.layer[0]
            attention = sublayer.SelfAttention
            x = _rms_norm(sublayer.layer_norm, hidden)
            projections = (attention.q, attention.k, attention.v)
            q, k, v = (_project(x, p).reshape(rows, self.heads, 1, self.head_dim) for p in projections)
            keys, values = past[2 * i], past[2 * i + 1]
            own_score = (q * k).sum(-1, keepdim=True)  # (rows, heads, 1, 1)
            past_scores = torch.matmul(q, keys.transpose(2, 3))  # (rows, heads, 1, capacity)
            weights = F.softmax(torch.cat([own_score, past_scores], dim=-1) + self_bias, dim=-1)
            attended = weights[..., :1] * v + torch.matmul(weights[..., 1:], values)
            hidden = hidden + _project(attended.reshape(rows, self.heads * self.head_dim), attention.o)
            outputs += [k, v]

            sublayer = block.layer[1]
            cross_attention = sublayer.EncDecAttention
            query = _project(_rms_norm(sublayer.layer_norm, hidden), cross_attention.q)
            attended = _attend_beams(
                query, cross[2 * i], cross[2 * i + 1], cross_mask, sentences, 1.0, self.heads, self.head_dim
            )
            hidden = hidden + _project(attended, cross_attention.o)
            ffn = block.layer[2]
            hidden = hidden + self._ffn(ffn, _rms_norm(ffn.layer_norm, hidden))
        hidden = _rms_norm(self.final_layer_norm, hidden)
        if self.output_scale is not None:
            hidden = hidden * self.output_scale
        return (F.linear(hidden, self.lm_head.weight), *outputs)


def _scales_decoder_outputs(model: Any) -> bool:
    """Whether transformers multiplies the decoder output by d_model^-0.5 before the head. T5 of transformers 5 says
    so in `scale_decoder_outputs` (its config ties the head always, and keeps what the file said here); transformers
    4 scaled a tied T5 or mT5. mT5 of transformers 5 never scales, though its config sets tie_word_embeddings always."""
    import transformers

    config = model.config
    if hasattr(config, "scale_decoder_outputs"):
        return bool(config.scale_decoder_outputs)
    if config.model_type == "mt5" and int(transformers.__version__.split(".")[0]) >= 5:
        return False
    return bool(config.tie_word_embeddings)


def load(path: str) -> Any:
    from transformers import AutoModelForSeq2SeqLM

    return load_eager(AutoModelForSeq2SeqLM, path)


def encoder(model: Any) -> nn.Module:
    return T5EncoderExport(model).eval()


def decoder(model: Any, buffered: bool = False) -> nn.Module:
    if not buffered:
        raise ValueError("T5 models are exported with the cache buffer only (no --cache-concat)")
    return T5DecoderExport(model).eval()


def write_tokenizer(source: Path, staging: Path) -> list[str]:
    """mT5's tokenizer.json as transformers' T5Tokenizer builds it from the source's files (its conversion of
    spiece.model, or the source's own tokenizer.json), with the source's tokenizer config (mT5's: no extra ids)."""
    from transformers import T5Tokenizer

    return [write_tokenizer_json(T5Tokenizer, source, staging, "mT5", MT5_SOURCE_TOKENIZER_FILES)]
